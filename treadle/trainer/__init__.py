"""Reference GRPO trainer: CPU torch on the locally generated tiny Llama, closing the loop in local mode.

``grpo`` (advantages and loss), ``toy`` (the verifiable task and its reward function), ``policy``
(the model: load, sample, score tokens), ``local`` (the in-process run with no services), ``loop``
(the trainer over ``treadle.client``), ``cli`` (``treadle train``), ``job`` (``python -m
treadle.trainer.job``: the trainer of a RolloutJob's ``spec.trainer``, in the cluster).
"""

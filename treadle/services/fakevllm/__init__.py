"""A SIMULATED vLLM engine: vLLM 0.32's HTTP surface with a deterministic fake model behind it.

It serves the fast test tiers and the local demo when real vLLM is not installed; everything it
outputs is labelled simulated (model name ``simulated-llm``, ``system_fingerprint`` ``vllm-0.32.0-
simulated``). The slow tier runs real vLLM on CPU instead. Run: ``python -m treadle.services.fakevllm``.
"""

"""Datasets of prompts: rows read from files, ConfigMaps, URLs or the Hugging Face cache.

Below the services in the layering (it imports only ``treadle.api`` and ``treadle.errors``):
``rows`` is the row as environments receive it (no third-party imports, so the env service stays
light); ``reader`` loads a task's ``spec.tasks[i].dataset`` into rows with pyarrow / ``datasets``.
"""

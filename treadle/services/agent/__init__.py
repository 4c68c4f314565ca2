"""Inference agent: the sidecar beside each vLLM server (real or simulated).

It gives the scheduler per-trajectory ADD/ABORT over vLLM's OpenAI API, records prompt/output token
ids, logprobs and the policy version of every output token, passes pause/resume through, and reports
load for placement. Run: ``python -m treadle.services.agent --engine-url http://127.0.0.1:8000``.
"""

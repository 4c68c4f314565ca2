"""Shared HTTP plumbing for Treadle's FastAPI services (env, reward, agent, fake vLLM) and their clients.

``errors`` maps the error vocabulary to ``ErrorResponse`` at the server edge, ``app`` builds an app
with request ids, ``/healthz`` and ``/metrics`` on a per-app registry, ``client`` maps HTTP failures
back to ``treadle.errors`` on the caller's side, and ``serve`` runs an app under uvicorn.
"""

"""Environment service: sessions of math-tool, python-code and frozenlake environments over HTTP.

Run by the operator on CPU pods (``python -m treadle.services.env``); the scheduler drives it through
``EnvClient``.
"""

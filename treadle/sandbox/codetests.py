"""Turn a model response and test code into one program for the sandbox; used by the python-code env
and the reward gateway's ``code-tests`` so both judge code the same way."""

from __future__ import annotations

import re

FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
PASSED = "ALL TESTS PASSED"


def extract_code(text: str) -> str:
    """The last fenced block, or the whole text when there is none."""
    blocks = FENCE.findall(text)
    return str(blocks[-1]) if blocks else text


def program(code: str, tests: str) -> str:
    return f"{code}\n\n# --- tests ---\n{tests}\nprint({PASSED!r})\n"


def passed(ok: bool, stdout: str) -> bool:
    return ok and PASSED in stdout

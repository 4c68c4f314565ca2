"""``python-code``: write a function that passes hidden tests; each attempt runs in the sandbox.

The model answers with a fenced Python block; the env judges it against the task's tests in
``treadle.sandbox`` (``codetests.judge``: the verdict comes from a harness process the code cannot
reach) and returns the outcome as the next observation, until the tests pass or the turns
run out. The reward gateway re-runs the tests on the final response (``code-tests``) with
``info["reference"]`` as the test code.

Opening a session costs some 2 us (the task is picked by the seed); what costs is each attempt's two
sandbox processes, the code's and the tests' harness (fork, confinement, interpreter boot: tens of ms
on the dev machine). The pod's warm pool (``spec.environment.warmPool``) keeps that many started
processes ready in the sandbox, so an attempt, the first one included, skips the start for each one
ready. Each attempt is pinned to
the cores the pod's action manager grants it (``treadle.sandbox.cores``: at most
``spec.externalResources.cpuCoresPerAction``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from treadle import errors
from treadle.sandbox import codetests, confine, runner
from treadle.services.env import base

TASKS: list[tuple[str, str]] = [
    ("Write `add(a, b)` returning the sum of two integers.",
     "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add(10**12, 1) == 10**12 + 1\n"),
    ("Write `is_prime(n)` returning True when the integer n is prime.",
     "assert is_prime(2) and is_prime(13) and is_prime(7919)\nassert not is_prime(1) and not is_prime(91)\n"),
    ("Write `reverse_words(s)` reversing the order of the words in s (split on whitespace, join by a space).",
     "assert reverse_words('a b c') == 'c b a'\nassert reverse_words('  hi  there ') == 'there hi'\n"),
    ("Write `fizzbuzz(n)` returning the list of FizzBuzz strings for 1..n.",
     "assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']\nassert fizzbuzz(15)[-1] == 'FizzBuzz'\n"),
    ("Write `fib(n)` returning the n-th Fibonacci number with fib(0) == 0 and fib(1) == 1.",
     "assert [fib(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]\n"
     "assert fib(90) == 2880067194370816120\n"),
]  # fmt: skip


SPEC_NAME = "python-code"


class PythonCode:
    def __init__(self, seed: int, *, max_turns: int, sandbox: runner.Sandbox) -> None:
        self.task, self.tests = TASKS[seed % len(TASKS)]
        self.max_turns, self.sandbox, self.turns = max_turns, sandbox, 0

    async def reset(self) -> tuple[str, dict[str, Any]]:
        text = f"{self.task}\nAnswer with the code in a ```python fenced block. You get test output back."
        return text, {"reference": self.tests, "reward_fn": "code-tests", "max_turns": self.max_turns}

    async def step(self, action: str) -> base.Outcome:
        self.turns += 1
        judged = await codetests.judge(self.sandbox, action, self.tests, kind=SPEC_NAME)
        info: dict[str, Any] = {"status": judged.status, "passed": judged.passed, "turns": self.turns}
        if judged.passed:
            return base.Outcome("All tests passed.", done=True, info=info)
        tail = judged.feedback[-1500:]
        return base.Outcome(
            f"Tests failed ({judged.status}):\n{tail}", done=self.turns >= self.max_turns, info=info
        )

    async def close(self) -> None:
        return None


def _factory(seed: int, options: Mapping[str, Any], ctx: base.Context) -> PythonCode:
    base.check_keys(options, {"max_turns"})
    if isinstance(ctx.sandbox, confine.Unavailable):
        raise errors.Unavailable(f"python-code needs the sandbox, which cannot run here: {ctx.sandbox}")
    if not isinstance(ctx.sandbox, runner.Sandbox):
        raise errors.Unavailable("python-code needs the sandbox, which this env server was started without")
    return PythonCode(
        seed, max_turns=base.int_option(options, "max_turns", 3, lo=1, hi=64), sandbox=ctx.sandbox
    )


SPEC = base.Spec(SPEC_NAME, "write code that passes tests, run in a sandboxed subprocess", _factory)

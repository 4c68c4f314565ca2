"""``math-tool``: an arithmetic task solved with a calculator tool, then a final answer.

The model calls ``<calculator>EXPR</calculator>`` (evaluated safely: numbers, + - * / // % ** and
parentheses) and ends with ``<answer>VALUE</answer>``. The reward gateway scores the answer with the
``math`` function against ``info["reference"]``; the env itself gives no reward.

The problem is drawn from the seed, or, for a group the feeder made from a dataset row
(``options["row"]``, ``treadle.data.rows``), it is the row's prompt with the row's answer as the
reference (the dataset needs an ``answerColumn``).

Opening a session costs some 20 us (the problem is drawn from the seed) and has no seed-independent part, so
the pod's warm pool (``spec.environment.warmPool``) pre-starts nothing for it.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

from treadle import errors
from treadle.data import rows
from treadle.services.env import base

TOOL = re.compile(r"<calculator>(.*?)</calculator>", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
MAX_EXPR_CHARS = 200
MAX_MAGNITUDE = 1e30

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip


class CalcError(ValueError):
    """An expression the calculator refuses; the message goes back to the model."""


def calculate(expr: str) -> int | float:
    """Evaluate an arithmetic expression without ``eval``; bounded in size and magnitude."""
    if len(expr) > MAX_EXPR_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"not an arithmetic expression: {exc.msg}") from exc
    return _eval(tree.body)


def _eval(node: ast.expr) -> int | float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise CalcError("exponent or base too large")
        try:
            result = _BINOPS[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise CalcError("division by zero") from exc
        if isinstance(result, complex) or abs(result) > MAX_MAGNITUDE:
            raise CalcError("result out of range")
        return result  # type: ignore[no-any-return]
    raise CalcError(f"unsupported syntax: {type(node).__name__}")


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def make_problem(seed: int) -> tuple[str, str]:
    """(expression, reference answer) for ``seed``; integer answers only."""
    rng = random.Random(seed)
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 999)
    expr = rng.choice([f"({a} * {b}) + {c}", f"({a} + {b}) * {c % 50 + 2}", f"{a} * {b} - {c}"])
    return expr, format_number(calculate(expr))


class MathTool:
    def __init__(self, seed: int, max_turns: int, *, row: rows.Row | None = None) -> None:
        self.expr: str | None = None
        """The seed's expression; None for a dataset row."""
        if row is None:
            self.expr, self.reference = make_problem(seed)
            self.question = f"Compute {self.expr}."
        elif row.answer is None:
            raise errors.SpecError(
                "math-tool needs the row's reference answer: set the dataset's answerColumn",
                field=f"options.{rows.OPTION}.answer",
            )
        else:
            self.question, self.reference = row.prompt, row.answer
        self.max_turns = max_turns
        self.turns = 0

    async def reset(self) -> tuple[str, dict[str, Any]]:
        prompt = (
            f"{self.question} You may use a calculator: write <calculator>EXPRESSION</calculator> "
            "and you will get <result>VALUE</result> back. Give the final answer as <answer>NUMBER</answer>."
        )
        return prompt, {"reference": self.reference, "reward_fn": "math", "max_turns": self.max_turns}

    async def step(self, action: str) -> base.Outcome:
        self.turns += 1
        if answer := ANSWER.search(action):
            return base.Outcome("", done=True, info={"answer": answer.group(1).strip(), "turns": self.turns})
        if self.turns >= self.max_turns:
            return base.Outcome("Out of turns.", done=True, info={"truncated": True, "turns": self.turns})
        if tool := TOOL.search(action):
            try:
                return base.Outcome(f"<result>{format_number(calculate(tool.group(1)))}</result>", done=False)
            except CalcError as exc:
                return base.Outcome(f"<error>{exc}</error>", done=False, info={"tool_error": str(exc)})
        return base.Outcome(
            "No tool call or answer found: use <calculator>...</calculator> or <answer>...</answer>.",
            done=False,
        )

    async def close(self) -> None:
        return None


def _factory(seed: int, options: Mapping[str, Any], ctx: base.Context) -> MathTool:
    base.check_keys(options, {"max_turns", rows.OPTION})
    max_turns = base.int_option(options, "max_turns", 8, lo=1, hi=256)
    return MathTool(seed, max_turns, row=rows.from_option(options))


SPEC = base.Spec("math-tool", "arithmetic with a calculator tool; scored by the `math` reward", _factory)

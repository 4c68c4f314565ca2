"""math-tool calculator and episodes, frozenlake maps and moves, option validation (pure, no sockets)."""

from __future__ import annotations

import random

import pytest

from treadle import errors
from treadle.services.env import base, frozenlake, mathtool


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("-7 // 2", -4),  # floor division, as Python
        ("7 / 2", 3.5),
        ("2 ** 10", 1024),
        ("10 % 3", 1),
        ("+5", 5),
    ],
    ids=["precedence", "parens", "floordiv", "truediv", "pow", "mod", "unary-plus"],
)
def test_calculator_evaluates(expr: str, value: float) -> None:
    assert mathtool.calculate(expr) == value


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("__import__('os')", "unsupported syntax"),
        ("1 / 0", "division by zero"),
        ("9 ** 99", "too large"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 201, "longer than"),
        ("True + 1", "unsupported syntax"),  # booleans are not numbers here
    ],
    ids=["call", "div-zero", "huge-pow", "syntax", "too-long", "bool"],
)
def test_calculator_refuses(expr: str, message: str) -> None:
    with pytest.raises(mathtool.CalcError, match=message):
        mathtool.calculate(expr)


def test_math_problem_is_deterministic_per_seed() -> None:
    assert mathtool.make_problem(7) == mathtool.make_problem(7)
    assert len({mathtool.make_problem(s) for s in range(20)}) > 15
    expr, ref = mathtool.make_problem(7)
    assert mathtool.format_number(mathtool.calculate(expr)) == ref


async def test_math_tool_episode_tool_then_answer() -> None:
    env = mathtool.MathTool(3, max_turns=4)
    text, info = await env.reset()
    assert env.expr in text and info["reward_fn"] == "math" and info["reference"] == env.reference
    tool = await env.step("let me <calculator>6*7</calculator>")
    assert (tool.observation, tool.done) == ("<result>42</result>", False)
    bad = await env.step("<calculator>1/0</calculator>")
    assert bad.observation == "<error>division by zero</error>" and not bad.done
    final = await env.step(f"<answer> {env.reference} </answer>")
    assert final.done and final.reward is None and final.info["answer"] == env.reference


async def test_math_tool_runs_out_of_turns() -> None:
    env = mathtool.MathTool(1, max_turns=2)
    assert not (await env.step("hmm")).done
    last = await env.step("still thinking")
    assert last.done and last.info["truncated"] is True


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_turns": 0}, "options.max_turns"),
        ({"max_turns": "3"}, "options.max_turns"),
        ({"colour": 1}, "options.colour"),
    ],
    ids=["too-small", "wrong-type", "unknown-key"],
)
def test_bad_options_name_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(errors.SpecError) as exc:
        mathtool.SPEC.factory(1, options, base.Context())
    assert exc.value.field == field


def test_frozenlake_maps_have_a_path_and_depend_only_on_seed() -> None:
    for seed in range(50):
        grid = frozenlake.make_map(random.Random(seed), 6)
        assert grid == frozenlake.make_map(random.Random(seed), 6)
        assert grid[0][0] == "S" and grid[-1][-1] == "G"
        assert frozenlake._reachable([list(row) for row in grid])


async def test_frozenlake_reaches_goal_on_open_ice() -> None:
    env = frozenlake.FrozenLake(0, size=2, max_turns=5, slippery=False)
    env.grid = ["SF", "FG"]
    _, info = await env.reset()
    assert info["reward_fn"] == "env"
    first = await env.step("I go <action>right</action>")
    assert (first.done, first.reward, first.info["move"]) == (False, None, "right")
    goal = await env.step("down")
    assert (goal.done, goal.reward) == (True, 1.0)


async def test_frozenlake_hole_invalid_move_and_walls() -> None:
    env = frozenlake.FrozenLake(0, size=2, max_turns=3, slippery=False)
    env.grid = ["SH", "FG"]
    wall = await env.step("up")  # bumping the edge keeps the position
    assert env.pos == (0, 0) and not wall.done
    invalid = await env.step("jump")
    assert invalid.info["invalid"] is True and not invalid.done
    hole = await env.step("right")
    assert (hole.done, hole.reward) == (True, 0.0)

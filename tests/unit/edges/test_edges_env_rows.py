"""Environments take a dataset row (``options["row"]``): math-tool poses the row's question with its
answer as the reference, and a user environment ``py:<module>:<Class>`` is loaded under an allowed
module prefix, as reward functions are."""

from __future__ import annotations

from typing import Any

import prometheus_client
import pytest

from treadle import errors
from treadle.data import rows
from treadle.services.env import base, mathtool, protocol, service

ROW = rows.Row("math-007", "Compute (3 * 4) + 5.", "17", {"level": "easy"})
EXAMPLE = "py:treadle.services.env.examples:SingleTurn"


async def test_math_tool_poses_the_row_and_takes_its_answer_as_reference() -> None:
    env = mathtool.SPEC.factory(99, {"max_turns": 3, "row": ROW.option()}, base.Context())
    text, info = await env.reset()
    assert text.startswith("Compute (3 * 4) + 5. You may use a calculator")
    assert info == {"reference": "17", "reward_fn": "math", "max_turns": 3}
    final = await env.step("<answer>17</answer>")
    assert final.done and final.info["answer"] == "17"


async def test_math_tool_without_a_row_still_draws_from_the_seed() -> None:
    text, info = await mathtool.SPEC.factory(99, {}, base.Context()).reset()
    expr, reference = mathtool.make_problem(99)
    assert text.startswith(f"Compute {expr}. ") and info["reference"] == reference


@pytest.mark.parametrize(
    ("row", "field"),
    [({"id": "x", "prompt": "Compute 1 + 1."}, "options.row.answer"), ({"id": "x"}, "options.row.prompt"),
     ("not an object", "options.row")],
    ids=["no answer", "no prompt", "not an object"],
)  # fmt: skip
def test_math_tool_refuses_a_row_it_cannot_score(row: Any, field: str) -> None:
    with pytest.raises(errors.SpecError) as info:
        mathtool.SPEC.factory(1, {"row": row}, base.Context())
    assert info.value.field == field


def _service(prefixes: tuple[str, ...] = ("treadle.services.env.examples",)) -> service.EnvService:
    return service.EnvService(
        registry=prometheus_client.CollectorRegistry(), context=base.Context(), user_prefixes=prefixes
    )


def _open(name: str, options: dict[str, Any] | None = None, sid: str = "s1") -> protocol.OpenRequest:
    return protocol.OpenRequest(env=name, session_id=sid, seed=0, options=options)


async def test_a_user_environment_is_loaded_once_and_runs_a_row() -> None:
    svc = _service()
    first = await svc.open(_open(EXAMPLE, {"row": ROW.option(), "max_turns": 4}))
    assert (first.observation, first.info) == (ROW.prompt, {"reference": "17"})
    done = await svc.step("s1", "17", index=0)
    assert done.done and done.info == {"answer": "17"}
    assert svc.specs[EXAMPLE].description.startswith("One prompt from a dataset row")
    await svc.open(_open(EXAMPLE, {"row": ROW.option()}, sid="s2"))
    assert svc.opened == 2


@pytest.mark.parametrize(
    ("name", "prefixes", "words"),
    [
        (EXAMPLE, (), "not under an allowed module prefix"),
        (EXAMPLE, ("treadle.services.env.exam",), "not under an allowed module prefix"),  # not a module
        ("py:treadle.services.env.examples:Missing", ("treadle.services.env",), "cannot import"),
        ("py:treadle.services.env.examples:__doc__", ("treadle.services.env",), "not a class or function"),
        ("chess", ("treadle",), "unknown environment 'chess'"),
    ],
    ids=["no prefixes", "prefix of a name", "no such class", "not callable", "unknown built-in"],
)
async def test_unusable_environments_name_the_env_field(
    name: str, prefixes: tuple[str, ...], words: str
) -> None:
    svc = _service(prefixes)
    with pytest.raises(errors.SpecError, match=words) as info:
        await svc.open(_open(name))
    assert info.value.field == "env" and not svc.sessions


async def test_the_example_environment_needs_a_row() -> None:
    with pytest.raises(errors.SpecError) as info:
        await _service().open(_open(EXAMPLE, {"max_turns": 2}))
    assert info.value.field == "options.row"

"""``treadle validate`` on 200 manifests mutated from the repository's examples (hypothesis): a value
replaced anywhere in the document by one of another type or sign, a key dropped, or the text cut or
spliced. Whatever the mutation, the command answers ok or names the file with each problem, and never
lets an exception escape (a traceback is a bug the user cannot act on)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treadle import cli

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "manifests").rglob("*.yaml"))
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=12),
    st.just("-1Gi"), st.just("1e400"), st.just([]), st.just({}), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)  # fmt: skip


def _paths(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value of ``node`` (mapping keys and list indices)."""
    found = [at]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*at, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _paths(value, (*at, i))
    return found


def _replace(doc: Any, path: tuple[Any, ...], value: Any, *, drop: bool) -> Any:
    if not path:
        return value
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if drop and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@st.composite
def mutated(draw: st.DrawFn) -> str:
    source = draw(st.sampled_from(EXAMPLES)).read_text()
    how = draw(st.sampled_from(["value", "drop", "cut", "splice"]))
    if how in ("cut", "splice"):
        at = draw(st.integers(0, len(source)))
        extra = draw(st.text(alphabet=":-[]{}!&*#|>'\"\n \t0a", max_size=6)) if how == "splice" else ""
        return source[:at] + extra + (source[at + 1 :] if how == "splice" else "")
    docs = [d for d in yaml.safe_load_all(source) if d is not None]
    doc = draw(st.sampled_from(docs)) if docs else {}
    path = draw(st.sampled_from(_paths(doc)))
    return yaml.safe_dump(_replace(doc, path, draw(ODD_VALUES), drop=how == "drop"), allow_unicode=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mutated())
def test_a_mutated_manifest_never_raises_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    code = cli.main(["validate", str(path)])  # an escaping exception fails the test with its traceback
    out, err = capsys.readouterr()
    assert code in (0, 1), code
    if code:
        assert err and all(line.startswith(f"{path}") for line in err.splitlines()), err
    else:
        assert out.startswith(f"{path}") and " ok" in out, out

"""``treadle validate``: every problem of a manifest at once, each naming its field; a file that is not
a RolloutJob at all (empty, a list, bad YAML, a tag) is one problem naming the file, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from treadle import cli, errors
from treadle.api import v1alpha1

ROOT = Path(__file__).resolve().parents[3]
HEAD = "apiVersion: treadle.dev/v1alpha1\nkind: RolloutJob\n"
VALID_SPEC = """spec:
  agents: [{name: a, model: m}]
  pools: [{name: p, agent: a, accelerator: H20}]
  tasks: [{name: t, agents: [a], environment: math-tool, reward: math-equal}]
"""
THREE_ERRORS = (
    HEAD
    + """metadata: {name: three-errors}
spec:
  agents: [{name: a, model: m}]
  pools: [{name: p, agent: a, accelerator: H20, tensorParallelSize: 3,
           engine: {resources: {requests: {cpu: two}}}}]
  tasks: [{name: t, agents: [a], environment: math-tool, reward: math-equal}]
  environment: {resources: {requests: {memory: -1Gi, cpu: 8}}}
"""
)
THREE_FIELDS = (
    "spec.pools[0].tensorParallelSize",
    "spec.pools[0].engine.resources.requests.cpu",
    "spec.environment.resources.requests.memory",
)


def _validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes
) -> tuple[int, Path, str, str]:
    path = tmp_path / "job.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    code = cli.main(["validate", str(path)])
    out, err = capsys.readouterr()
    return code, path, out, err


def test_every_problem_is_printed_each_naming_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, path, out, err = _validate(tmp_path, capsys, THREE_ERRORS)
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert [line.split(": ")[1] for line in lines] == list(THREE_FIELDS), err
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert "Input should be 1, 2, 4 or 8" in lines[0] and "got 'two'" in lines[1] and "got '-1Gi'" in lines[2]


def test_the_first_problem_stays_the_errors_field(tmp_path: Path) -> None:
    """Code that handles one ``SpecError`` reads ``.field``: the first problem's, as before."""
    import yaml

    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_job(yaml.safe_load(THREE_ERRORS))
    assert info.value.field == THREE_FIELDS[0]
    assert str(info.value) == str(info.value.problems[0])
    assert tuple(p.field for p in info.value.problems) == THREE_FIELDS


def test_broken_rules_and_a_bad_name_are_all_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        HEAD
        + "metadata: {name: Bad_Name}\n"
        + VALID_SPEC.replace("agent: a,", "agent: nobody,")
        + "  environment: {resources: {requests: {cpu: 2}, limits: {cpu: 1}}}\n"
        + "  reward: {minReplicas: 3, maxReplicas: 1, scaleToZero: false}\n"
    )
    code, _, _, err = _validate(tmp_path, capsys, text)
    fields = [line.split(": ")[1] for line in err.splitlines()]
    assert code == 1
    assert fields[0] == "metadata.name"
    assert {"spec.pools.agent", "spec.agents", "spec.environment.resources"} <= set(fields), err
    assert any(f.startswith("spec.reward") for f in fields), err


def test_a_valid_manifest_is_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, path, out, err = _validate(tmp_path, capsys, HEAD + "metadata: {name: fine}\n" + VALID_SPEC)
    assert (code, out, err) == (0, f"{path}: fine ok\n", "")


def test_every_example_validates(capsys: pytest.CaptureFixture[str]) -> None:
    examples = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
    assert cli.main(["validate", *map(str, examples)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "holds no document"),
        ("---\n---\n", "holds no document"),
        ("- a\n- b\n", "<document>: a RolloutJob is a mapping"),
        ("just words\n", "<document>: a RolloutJob is a mapping"),
        (HEAD + "metadata: -1\n" + VALID_SPEC, "metadata: must be a mapping"),
        (HEAD + "metadata: {name: x}\nspec: [1]\n", "spec: Input should be a valid dictionary"),
        (
            HEAD + "metadata: {name: x}\n" + VALID_SPEC + "status: -1\n",
            "status: Input should be a valid dictionary",
        ),
        ("apiVersion: [unclosed\n", "not valid YAML: line 2, column 1"),
        ("a: b\n  c: d\n", "not valid YAML"),
        (
            "!!python/object/apply:os.system ['true']\n",
            "not valid YAML: line 1, column 1: could not determine",
        ),
        (
            HEAD + "metadata: !custom {name: x}\n" + VALID_SPEC,
            "could not determine a constructor for the tag '!custom'",
        ),
        (b"\xff\xfe\x00binary", "cannot read"),
    ],
    ids=[
        "empty",
        "only-separators",
        "top-level-list",
        "scalar",
        "metadata-minus-one",
        "spec-list",
        "status-minus-one",
        "invalid-yaml",
        "bad-indent",
        "python-tag",
        "custom-tag",
        "not-utf8",
    ],
)
def test_a_file_that_is_no_rolloutjob_is_one_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes, says: str
) -> None:
    code, path, out, err = _validate(tmp_path, capsys, text)
    assert code == 1 and out == ""
    assert err.startswith(f"{path}: ") and says in err, err
    assert "Traceback" not in err


def test_a_missing_file_and_a_directory_name_themselves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert cli.main(["validate", str(missing), str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{missing}: cannot read") and err[1].startswith(f"{tmp_path}: cannot read"), err


def test_several_documents_are_told_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (
        HEAD + "metadata: {name: one}\n" + VALID_SPEC + "---\n" + HEAD + "metadata: {name: two}\nspec: {}\n"
    )
    code, path, out, err = _validate(tmp_path, capsys, text)
    assert code == 1
    assert out == f"{path} (document 1): one ok\n"
    assert err.startswith(f"{path} (document 2): spec.agents: Field required")

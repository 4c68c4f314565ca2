"""The dataset reader: jsonl / json / parquet files, a ConfigMap as a mounted file, a Hugging Face
dataset from a local cache; each failure is a ``SpecError`` naming the dataset's field."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from treadle import errors
from treadle.api import dataset as dataset_api
from treadle.api import v1alpha1
from treadle.data import reader, rows

ROOT = Path(__file__).resolve().parents[3]
FIELD = "spec.tasks[0].dataset"
RECORDS = [
    {"id": "q-1", "question": "Compute 2 + 3.", "answer": 5, "level": "easy"},
    {"id": "q-2", "question": "Compute 7 * 6.", "answer": 42, "level": "hard"},
    {"id": "q-3", "question": "Compute 9 - 4.", "answer": 5, "level": "easy"},
]


def _spec(**raw: Any) -> dataset_api.Dataset:
    return dataset_api.Dataset.model_validate(raw)


def _write(path: Path, fmt: str, records: list[dict[str, Any]] = RECORDS) -> Path:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif fmt == "json":
        path.write_text(json.dumps(records))
    else:
        pq.write_table(pa.Table.from_pylist(records), path)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_each_format_gives_the_same_rows(tmp_path: Path, fmt: str) -> None:
    path = _write(tmp_path / f"math.{fmt}", fmt)
    spec = _spec(source={"path": str(path)}, promptColumn="question", answerColumn="answer", idColumn="id")
    got = reader.load(spec, field=FIELD)
    assert got == [
        rows.Row("q-1", "Compute 2 + 3.", "5", {"level": "easy"}),
        rows.Row("q-2", "Compute 7 * 6.", "42", {"level": "hard"}),
        rows.Row("q-3", "Compute 9 - 4.", "5", {"level": "easy"}),
    ]


def test_format_is_given_when_the_extension_says_nothing(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.data", "parquet")
    spec = _spec(source={"path": str(path)}, format="parquet", promptColumn="question")
    assert [r.row_id for r in reader.load(spec, field=FIELD)] == ["0", "1", "2"]  # the row index
    with pytest.raises(errors.SpecError) as info:
        reader.load(_spec(source={"path": str(path)}, promptColumn="question"), field=FIELD)
    assert info.value.field == f"{FIELD}.format"


def test_chat_template_fills_columns_and_keeps_literal_braces(tmp_path: Path) -> None:
    path = _write(tmp_path / "math.jsonl", "jsonl")
    template = "[{level}] {question} {{json}}"
    spec = _spec(source={"path": str(path)}, chatTemplate=template, answerColumn="answer")
    first = reader.load(spec, field=FIELD)[0]
    assert first.prompt == "[easy] Compute 2 + 3. {json}"
    assert first.answer == "5"
    # Columns the template reads stay in ``extra``: only prompt/answer/id columns are taken out.
    assert first.extra == {"id": "q-1", "question": "Compute 2 + 3.", "level": "easy"}


def test_config_map_is_read_from_its_mount(tmp_path: Path) -> None:
    key = dataset_api.ConfigMapKey(name="math-data", key="math.jsonl")
    mounted = Path(dataset_api.config_map_path(key, mount=PurePosixPath(tmp_path)))
    mounted.parent.mkdir(parents=True)
    _write(mounted, "jsonl")
    spec = _spec(source={"configMap": {"name": "math-data", "key": "math.jsonl"}}, promptColumn="question")
    got = reader.load(spec, field=FIELD, mount=PurePosixPath(tmp_path))
    assert [r.prompt for r in got] == [r["question"] for r in RECORDS]


def test_the_repository_example_dataset_reads_as_math_tool_expects() -> None:
    spec = _spec(
        source={"path": str(ROOT / "manifests/dev/data/math.jsonl")},
        promptColumn="question", answerColumn="answer", idColumn="id",
    )  # fmt: skip
    got = reader.load(spec, field=FIELD)
    assert len(got) == 64 and len({r.row_id for r in got}) == 64
    assert all(r.answer is not None and r.answer.lstrip("-").isdigit() for r in got)


# (source, options, the field the error must name, words of its message)
FAILURES = {
    "missing prompt column": ({}, {"promptColumn": "prompt_text"}, f"{FIELD}.promptColumn", "no column"),
    "missing default prompt column": ({}, {}, f"{FIELD}.promptColumn", "'prompt'"),
    "missing answer column": ({}, {"promptColumn": "question", "answerColumn": "solution"},
                              f"{FIELD}.answerColumn", "no column 'solution'"),
    "missing id column": ({}, {"promptColumn": "question", "idColumn": "uid"}, f"{FIELD}.idColumn", "uid"),
    "template reads a missing column": ({}, {"chatTemplate": "{question} {hint}"},
                                        f"{FIELD}.chatTemplate", "no column 'hint'"),
    "template with an index": ({}, {"chatTemplate": "{question[0]}"}, f"{FIELD}.chatTemplate", "must name"),
    "repeated id": ({}, {"promptColumn": "question", "idColumn": "answer"}, f"{FIELD}.idColumn", "repeats"),
    "prompt not a string": ({}, {"promptColumn": "answer"}, f"{FIELD}.promptColumn", "must be a string"),
}  # fmt: skip


@pytest.mark.parametrize(("source", "options", "field", "words"), FAILURES.values(), ids=list(FAILURES))
def test_bad_columns_name_the_field(
    tmp_path: Path, source: dict[str, Any], options: dict[str, Any], field: str, words: str
) -> None:
    path = _write(tmp_path / "math.jsonl", "jsonl")
    with pytest.raises(errors.SpecError) as info:
        reader.load(_spec(source={"path": str(path), **source}, **options), field=FIELD)
    assert info.value.field == field
    assert words in str(info.value)


def test_an_id_that_cannot_be_part_of_a_group_id_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "ids.jsonl", "jsonl", [{"id": "a/b c", "prompt": "p"}])
    with pytest.raises(errors.SpecError) as info:
        reader.load(_spec(source={"path": str(path)}, idColumn="id"), field=FIELD)
    assert info.value.field == f"{FIELD}.idColumn" and "row 0" in str(info.value)


# file name -> (its content, None for a folder or "" to leave it absent; words of the error)
BAD_FILES = {
    "missing": ("nope.jsonl", "", "cannot read"),
    "a folder": ("dir.jsonl", None, "cannot read"),  # unreadable as a file even for root
    "broken jsonl": ("broken.jsonl", '{"prompt": "a"}\n{"prompt": \n', "is not valid jsonl"),
    "blank jsonl": ("blank.jsonl", "\n\n", "no rows"),
    "json object, not an array": ("obj.json", '{"prompt": "a"}', "array of objects"),
    "empty json array": ("empty.json", "[]", "no rows"),
    "parquet that is not": ("rows.parquet", "PAR1 nonsense", "is not valid parquet"),
}


@pytest.mark.parametrize(("name", "content", "words"), BAD_FILES.values(), ids=list(BAD_FILES))
def test_unreadable_and_malformed_files_name_the_source(
    tmp_path: Path, name: str, content: str | None, words: str
) -> None:
    path = tmp_path / name
    if content is None:
        path.mkdir()
    elif content:
        path.write_text(content)
    with pytest.raises(errors.SpecError, match=words) as info:
        reader.load(_spec(source={"path": str(path)}), field=FIELD)
    assert info.value.field == f"{FIELD}.source.path"


def test_config_map_not_mounted_names_the_config_map(tmp_path: Path) -> None:
    spec = _spec(source={"configMap": {"name": "absent", "key": "rows.jsonl"}})
    with pytest.raises(errors.SpecError, match="cannot read") as info:
        reader.load(spec, field=FIELD, mount=PurePosixPath(tmp_path))
    assert info.value.field == f"{FIELD}.source.configMap"


def _hub_cache(root: Path, repo: str, files: dict[str, str]) -> Path:
    """A Hugging Face hub cache holding one dataset snapshot, laid out as ``huggingface_hub`` does."""
    folder = root / f"datasets--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    for name, text in files.items():
        path = folder / "snapshots" / commit / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_hugging_face_dataset_comes_from_the_local_cache(tmp_path: Path) -> None:
    cache = _hub_cache(tmp_path, "treadle/tiny-math", {
        "data/train.jsonl": "".join(json.dumps(r) + "\n" for r in RECORDS),
        "data/test.jsonl": json.dumps({"id": "t-1", "question": "Compute 1 + 1.", "answer": 2, "level": "x"}),
    })  # fmt: skip
    spec = _spec(source={"huggingFace": {"name": "treadle/tiny-math", "split": "test"}},
                 promptColumn="question", answerColumn="answer", idColumn="id")  # fmt: skip
    got = reader.load(spec, field=FIELD, hf_cache=cache)
    assert got == [rows.Row("t-1", "Compute 1 + 1.", "2", {"level": "x"})]
    absent = _spec(source={"huggingFace": {"name": "treadle/not-cached"}})
    with pytest.raises(errors.SpecError, match="not in the local Hugging Face cache") as info:
        reader.load(absent, field=FIELD, hf_cache=cache)
    assert info.value.field == f"{FIELD}.source.huggingFace.name"
    bad_split = _spec(source={"huggingFace": {"name": "treadle/tiny-math", "split": "validation"}})
    with pytest.raises(errors.SpecError, match="split 'validation'") as info:
        reader.load(bad_split, field=FIELD, hf_cache=cache)
    assert info.value.field == f"{FIELD}.source.huggingFace"


def test_row_option_round_trips_and_bad_options_name_the_key() -> None:
    row = rows.Row("q-1", "Compute 2 + 3.", "5", {"level": "easy"})
    assert rows.from_option({"row": row.option(), "max_turns": 4}) == row
    assert rows.from_option({"max_turns": 4}) is None
    assert rows.from_option({"row": rows.Row("x", "p", None).option()}) == rows.Row("x", "p", None)
    with pytest.raises(errors.SpecError) as info:
        rows.from_option({"row": {"id": "x", "prompt": 3}})
    assert info.value.field == "options.row.prompt"


# (dataset, field of the error): the spec's own validation, through parse_spec
SPEC_ERRORS = {
    "two sources": ({"source": {"path": "/d/a.jsonl", "url": "https://x/a.jsonl"}}, "dataset.source"),
    "no source": ({"source": {}}, "dataset.source"),
    "prompt column and template": ({"source": {"path": "/d/a.jsonl"}, "promptColumn": "q",
                                    "chatTemplate": "{q}"}, "dataset"),
    "relative path": ({"source": {"path": "data/a.jsonl"}}, "dataset.source.path"),
    "ftp url": ({"source": {"url": "ftp://x/a.jsonl"}}, "dataset.source.url"),
    "unknown format": ({"source": {"path": "/d/a.csv"}, "format": "csv"}, "dataset.format"),
    "zero epochs": ({"source": {"path": "/d/a.jsonl"}, "epochs": 0}, "dataset.epochs"),
}  # fmt: skip


@pytest.mark.parametrize(("dataset", "field"), SPEC_ERRORS.values(), ids=list(SPEC_ERRORS))
def test_spec_validation_names_the_dataset_field(dataset: dict[str, Any], field: str) -> None:
    raw = {
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
        "tasks": [
            {"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "math", "dataset": dataset}
        ],
    }
    with pytest.raises(errors.SpecError) as info:
        v1alpha1.parse_spec(raw)
    assert info.value.field == f"spec.tasks[0].{field}"

"""Load a task's ``spec.tasks[i].dataset`` into rows (id, prompt, answer, other columns).

Called by the feeder at start (``treadle.services.feeder``) and by ``treadle`` tests. Files are
parsed by pyarrow (jsonl with ``pyarrow.json``, parquet with ``pyarrow.parquet``; a JSON array with
the standard library's parser, which pyarrow lacks, then ``pyarrow.Table.from_pylist``), and a Hugging
Face dataset by ``datasets`` from the files ``huggingface_hub`` finds in the local cache
(``local_files_only``: nothing is downloaded). Every failure is a ``SpecError`` whose field is under
the dataset's own (``spec.tasks[i].dataset.source.url``, ``...promptColumn``): a missing column, an
unreadable file or an unreachable URL is the job's configuration to fix, said once at start.
"""

from __future__ import annotations

import json
import string
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from treadle import errors
from treadle.api import dataset as dataset_api
from treadle.data import rows

MAX_DOWNLOAD_BYTES = 1 << 30
"""A URL source larger than this is refused (it is held in memory)."""


def load(
    spec: dataset_api.Dataset,
    *,
    field: str,
    mount: PurePosixPath = dataset_api.CONFIG_MAP_MOUNT,
    timeout_s: float = 60.0,
    max_bytes: int = MAX_DOWNLOAD_BYTES,
    hf_cache: Path | None = None,
) -> list[rows.Row]:
    """Every row of the dataset, in file order; ``field`` is the dataset's own (``spec.tasks[0].dataset``).

    ``mount`` is where ConfigMap sources are mounted and ``hf_cache`` the Hugging Face hub cache
    (None: ``HF_HUB_CACHE``, under ``HF_HOME``); tests pass temporary folders.
    """
    table = _read_table(
        spec, field=field, mount=mount, timeout_s=timeout_s, max_bytes=max_bytes, hf_cache=hf_cache
    )
    if table.num_rows == 0:
        raise errors.SpecError("the dataset has no rows", field=f"{field}.source.{spec.source.kind}")
    return to_rows(table.to_pylist(), spec, field=field)


def _read_table(
    spec: dataset_api.Dataset,
    *,
    field: str,
    mount: PurePosixPath,
    timeout_s: float,
    max_bytes: int,
    hf_cache: Path | None,
) -> pa.Table:
    source = spec.source
    at = f"{field}.source.{source.kind}"
    if source.hugging_face is not None:
        return _hugging_face(source.hugging_face, field=at, cache=hf_cache)
    if source.url is not None:
        name = httpx.URL(source.url).path
        fmt = file_format(spec, name, field=field)
        data = _download(source.url, field=at, timeout_s=timeout_s, max_bytes=max_bytes)
        return _parse(data, fmt, field=at, label=source.url)
    local = Path(source.path) if source.path is not None else None
    if source.config_map is not None:
        local = Path(dataset_api.config_map_path(source.config_map, mount=mount))
    assert local is not None  # Source validates that exactly one is set
    fmt = file_format(spec, local.name, field=field)
    try:
        data = local.read_bytes()
    except OSError as exc:
        raise errors.SpecError(f"cannot read {local}: {exc.strerror}", field=at, value=str(local)) from exc
    return _parse(data, fmt, field=at, label=str(local))


def file_format(spec: dataset_api.Dataset, name: str, *, field: str) -> dataset_api.Format:
    """``format``, or the one the file name's extension gives."""
    if spec.format is not None:
        return spec.format
    suffix = PurePosixPath(name).suffix.lower()
    if suffix not in dataset_api.EXTENSIONS:
        raise errors.SpecError(
            f"cannot infer the format of {name!r} from its extension "
            f"(known: {sorted(dataset_api.EXTENSIONS)}); set format",
            field=f"{field}.format",
        )
    return dataset_api.EXTENSIONS[suffix]


def _parse(data: bytes, fmt: dataset_api.Format, *, field: str, label: str) -> pa.Table:
    """``label`` names the file or URL in errors."""
    try:
        if fmt == "parquet":
            return pq.read_table(pa.BufferReader(data))
        if fmt == "jsonl":
            return pa_json.read_json(pa.BufferReader(data))
        records = json.loads(data)
    except (pa.ArrowException, ValueError) as exc:
        raise errors.SpecError(f"{label} is not valid {fmt}: {exc}", field=field) from exc
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise errors.SpecError(f"{label}: format json needs an array of objects", field=field)
    try:
        return pa.Table.from_pylist(records)
    except pa.ArrowException as exc:
        raise errors.SpecError(f"{label}: rows do not form a table: {exc}", field=field) from exc


def _download(url: str, *, field: str, timeout_s: float, max_bytes: int) -> bytes:
    try:
        with httpx.stream("GET", url, timeout=timeout_s, follow_redirects=True) as response:
            if response.status_code != 200:
                raise errors.SpecError(
                    f"GET {url} answered HTTP {response.status_code}", field=field, value=url
                )
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise errors.SpecError(f"{url} is larger than {max_bytes} bytes", field=field, value=url)
            return bytes(body)
    except httpx.HTTPError as exc:
        raise errors.SpecError(
            f"cannot download {url}: {type(exc).__name__}: {exc}", field=field, value=url
        ) from exc


def _hugging_face(source: dataset_api.HuggingFace, *, field: str, cache: Path | None) -> pa.Table:
    # Imported here: ``datasets`` takes about a second to import, and only this source needs it.
    import datasets
    import huggingface_hub
    from huggingface_hub import errors as hub_errors

    try:
        local = huggingface_hub.snapshot_download(
            source.name, repo_type="dataset", cache_dir=cache, local_files_only=True
        )
    except hub_errors.LocalEntryNotFoundError as exc:
        raise errors.SpecError(
            f"dataset {source.name!r} is not in the local Hugging Face cache "
            f"({cache or huggingface_hub.constants.HF_HUB_CACHE}); nothing is downloaded",
            field=f"{field}.name", value=source.name,
        ) from exc  # fmt: skip
    # The prepared Arrow files go to a scratch folder (the pod's cache may be read-only) and the
    # table is kept in memory, so the folder can go.
    with tempfile.TemporaryDirectory(prefix="treadle-hf-") as scratch:
        try:
            loaded = datasets.load_dataset(
                local, source.config, split=source.split, cache_dir=scratch, keep_in_memory=True
            )
        except (ValueError, FileNotFoundError, datasets.exceptions.DatasetGenerationError) as exc:
            raise errors.SpecError(
                f"cannot load {source.name!r} (config {source.config!r}, split {source.split!r}) from "
                f"{local}: {exc}",
                field=field,
            ) from exc
        table: pa.Table = loaded.with_format("arrow")[:]
    return table


def to_rows(records: Sequence[Mapping[str, Any]], spec: dataset_api.Dataset, *, field: str) -> list[rows.Row]:
    """Rows from the table's records: prompt, answer and id taken from their columns."""
    columns = list(records[0]) if records else []
    template_fields: list[str] = []
    if spec.chat_template is not None:
        template_fields = _template_fields(spec.chat_template, field=f"{field}.chatTemplate")
        _need(template_fields, columns, field=f"{field}.chatTemplate")
    else:
        _need([spec.prompt_column_or_default], columns, field=f"{field}.promptColumn")
    for name, column in (("answerColumn", spec.answer_column), ("idColumn", spec.id_column)):
        if column is not None:
            _need([column], columns, field=f"{field}.{name}")
    used = {spec.answer_column, spec.id_column, None if spec.chat_template else spec.prompt_column_or_default}
    out: list[rows.Row] = []
    seen: set[str] = set()
    for index, record in enumerate(records):
        row_id = str(index) if spec.id_column is None else _row_id(record[spec.id_column], index, field)
        if row_id in seen:
            raise errors.SpecError(f"row {index}: id {row_id!r} repeats", field=f"{field}.idColumn")
        seen.add(row_id)
        if spec.chat_template is not None:
            prompt = spec.chat_template.format_map({k: _text(record[k]) for k in template_fields})
        else:
            prompt = record[spec.prompt_column_or_default]
            if not isinstance(prompt, str):
                raise errors.SpecError(
                    f"row {index}: the prompt must be a string, got {prompt!r}", field=f"{field}.promptColumn"
                )
        answer = None if spec.answer_column is None else record[spec.answer_column]
        extra = {k: _json(v) for k, v in record.items() if k not in used}
        out.append(rows.Row(row_id=row_id, prompt=prompt, answer=None if answer is None else _text(answer),
                            extra=extra))  # fmt: skip
    return out


def _template_fields(template: str, *, field: str) -> list[str]:
    """The column names ``{name}`` a template reads (no attribute, index or positional fields)."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise errors.SpecError(f"not a valid template: {exc}", field=field) from exc
    if bad := [n for n in names if not n or any(c in n for c in ".[")]:
        raise errors.SpecError(f"template fields must name columns, got {bad}", field=field)
    return sorted(set(names))


def _need(wanted: Sequence[str], columns: Sequence[str], *, field: str) -> None:
    if missing := [c for c in wanted if c not in columns]:
        raise errors.SpecError(
            f"no column {missing[0]!r} in the dataset; columns: {list(columns)}", field=field
        )


def _row_id(value: Any, index: int, field: str) -> str:
    text = _text(value)
    if not rows.ROW_ID.match(text):
        raise errors.SpecError(
            f"row {index}: id {text[:100]!r} must match {rows.ROW_ID.pattern}", field=f"{field}.idColumn"
        )
    return text


def _text(value: Any) -> str:
    """A cell as text: strings as they are, anything else as JSON (``12``, ``2.5``, ``[1, 2]``)."""
    return value if isinstance(value, str) else json.dumps(_json(value))


def _json(value: Any) -> Any:
    """A cell as a JSON value (dates, decimals and bytes become strings)."""
    return json.loads(json.dumps(value, default=str))

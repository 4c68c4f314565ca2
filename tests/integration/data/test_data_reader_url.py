"""A URL dataset source, served for real by ``http.server`` on 127.0.0.1: read, refused, unreachable."""

from __future__ import annotations

import functools
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from treadle import errors
from treadle.api import dataset as dataset_api
from treadle.data import reader

FIELD = "spec.tasks[0].dataset"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """Base URL of a static file server over ``tmp_path``."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _url_spec(url: str) -> dataset_api.Dataset:
    return dataset_api.Dataset.model_validate(
        {"source": {"url": url}, "promptColumn": "question", "answerColumn": "answer"}
    )


def test_rows_are_downloaded_and_the_format_comes_from_the_url_path(served: str, tmp_path: Path) -> None:
    (tmp_path / "math.jsonl").write_text(
        "".join(json.dumps({"question": f"Compute {i} + 1.", "answer": i + 1}) + "\n" for i in range(5))
    )
    got = reader.load(_url_spec(f"{served}/math.jsonl?token=x"), field=FIELD, timeout_s=5)
    assert [(r.row_id, r.prompt, r.answer) for r in got] == [
        (str(i), f"Compute {i} + 1.", str(i + 1)) for i in range(5)
    ]


def test_a_missing_file_names_the_url_and_the_status(served: str) -> None:
    with pytest.raises(errors.SpecError, match="HTTP 404") as info:
        reader.load(_url_spec(f"{served}/absent.jsonl"), field=FIELD, timeout_s=5)
    assert info.value.field == f"{FIELD}.source.url"


def test_an_unreachable_url_names_the_field() -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(errors.SpecError, match=r"cannot download .*ConnectError") as info:
        reader.load(_url_spec(f"http://127.0.0.1:{port}/math.jsonl"), field=FIELD, timeout_s=5)
    assert info.value.field == f"{FIELD}.source.url"


def test_a_file_over_the_size_limit_is_refused(served: str, tmp_path: Path) -> None:
    (tmp_path / "big.jsonl").write_text(json.dumps({"question": "x" * 5000, "answer": 1}) + "\n")
    with pytest.raises(errors.SpecError, match="larger than 1000 bytes") as info:
        reader.load(_url_spec(f"{served}/big.jsonl"), field=FIELD, timeout_s=5, max_bytes=1000)
    assert info.value.field == f"{FIELD}.source.url"

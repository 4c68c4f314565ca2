"""``treadle weights show`` on a local store and the store process's size parsing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from treadle import cli, errors
from treadle.weights import objects, publish, store


@pytest.mark.parametrize(
    "text,want", [("4GiB", 4 << 30), ("512MiB", 512 << 20), ("1048576", 1 << 20), ("2 kib", 2048), ("7B", 7)]
)
def test_parse_size(text: str, want: int) -> None:
    assert store.parse_size(text) == want


@pytest.mark.parametrize("text", ["", "1.5GiB", "-1", "4GB", "lots"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(errors.SpecError):
        store.parse_size(text)


def test_show_prints_the_latest_manifest_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pub = publish.Publisher(objects.FileStore(tmp_path), "job/x", bucket_bytes=1024, clock=lambda: 5.0)
    pub.publish({"w": np.zeros(300, np.float32), "b": np.zeros(10, np.float32)}, 3)
    assert cli.main(["weights", "show", "--dir", str(tmp_path), "--prefix", "job/x"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == {"prefix": "job/x", "version": 3, "published_at": 5.0, "buckets": 2, "tensors": 2,
                       "bytes": 1240}  # fmt: skip
    assert cli.main(["weights", "show", "--dir", str(tmp_path), "--prefix", "job/x", "--version", "2"]) == 1
    assert "not committed" in capsys.readouterr().out
    assert cli.main(["weights", "show", "--dir", str(tmp_path), "--prefix", "job/none"]) == 1

"""The example RolloutJobs with fixed metadata, for operator unit tests (imported by name: unique)."""

from __future__ import annotations

from pathlib import Path

import yaml

from treadle.api import v1alpha1

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


def load_example(path: Path, **metadata: object) -> v1alpha1.RolloutJob:
    doc = yaml.safe_load(path.read_text())
    doc["metadata"] |= {"namespace": "team-a", "uid": "0000-uid-" + path.stem, "generation": 1, **metadata}
    return v1alpha1.parse_job(doc)

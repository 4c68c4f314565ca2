"""``make test`` and ``make test-fast``: the test tiers in two timed pytest runs, with where time went.

The first run is parallel (pytest-xdist, scheduled by the root ``conftest.py``: a worker runs a test
module whole, so its module fixtures start once): unit, integration and the e2e modules on private
clusters. The second runs one test at a time, alone: the tests on real vLLM (a start takes both
cores; beside the parallel run, timing-sensitive integration tests failed and the vLLM tests took
twice as long) and the e2e tests on the dev cluster (``DEV_CLUSTER``: the README's cluster name,
the node's host paths, ``make demo``; beside other load they took three times as long). ``make
test-fast`` runs unit and integration in parallel. Every run goes on when one before failed, so a red
suite still reports everything; the exit status is the first failure's. After the runs: each run's
wall time, each tier's summed test time and the 20 slowest tests, from the runs' JUnit reports
(setup and teardown included).

    python hack/run_tests.py [--fast] [--workers N] [-- extra pytest arguments]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEV_CLUSTER = ("e2e/demo", "e2e/docs", "e2e/learn")
RUNS = {
    "parallel": ["-m", "unit or integration or e2e", "tests", "e2e", *(f"--ignore={p}" for p in DEV_CLUSTER)],
    "one-at-a-time": ["-m", "slow or e2e", "tests/slow", *DEV_CLUSTER],
}
FAST = {"unit+integration": ["-m", "unit or integration", "tests"]}
SLOWEST = 20


def tier_of(classname: str) -> str:
    """A JUnit test case's tier, from its module path (``tests/unit/...`` -> unit, ``e2e/...`` -> e2e)."""
    parts = classname.split(".")
    return parts[1] if parts[0] == "tests" and len(parts) > 1 else parts[0]


def report(reports: list[Path], took: dict[str, float]) -> str:
    """The table of runs and tiers, and the slowest tests, from the JUnit files of the runs."""
    per_tier: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter[str] = collections.Counter()
    cases: list[tuple[float, str]] = []
    for path in reports:
        if not path.exists():
            continue
        for case in ET.parse(path).iter("testcase"):
            seconds = float(case.get("time", "0"))
            classname = case.get("classname", "")
            tier = tier_of(classname)
            per_tier[tier] += seconds
            counts[tier] += 1
            cases.append((seconds, f"{classname.replace('.', '/')}.py::{case.get('name', '')}"))
    lines = ["", "== where the time went ==", f"{'run':<18} {'wall':>9}"]
    lines += [f"{run:<18} {_minutes(seconds):>9}" for run, seconds in took.items()]
    lines += ["", f"{'tier':<18} {'tests':>6} {'test time':>10}  (summed over workers)"]
    lines += [f"{tier:<18} {counts[tier]:>6} {_minutes(per_tier[tier]):>10}" for tier in sorted(per_tier)]
    lines += ["", f"the {SLOWEST} slowest tests (setup and teardown included):"]
    lines += [f"{seconds:8.1f}s  {name}" for seconds, name in sorted(cases, reverse=True)[:SLOWEST]]
    return "\n".join(lines)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="unit and integration only (make test-fast)")
    parser.add_argument(
        "--workers",
        default=os.environ.get("TREADLE_TEST_WORKERS", "3"),
        help="pytest-xdist workers (default 3: most tests wait on processes)",
    )
    parser.add_argument(
        "--reports", type=Path, help="where the JUnit files go (default: $TREADLE_CACHE/test-reports)"
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to every pytest run")
    args = parser.parse_args()
    cache = Path(os.environ.get("TREADLE_CACHE", Path.home() / ".cache" / "treadle"))
    out: Path = args.reports or cache / "test-reports"
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    took: dict[str, float] = {}
    reports = []
    runs = FAST if args.fast else RUNS
    for run, selection in runs.items():
        junit = out / f"{run}.xml"
        junit.unlink(missing_ok=True)
        parallel = ["-n", args.workers] if run != "one-at-a-time" else []
        command = [
            sys.executable,
            "-m",
            "pytest",
            *selection,
            *parallel,
            f"--junitxml={junit}",
            *args.pytest_args,
        ]
        print(f"== {run}: {' '.join(command[1:])}", flush=True)
        began = time.monotonic()
        code = subprocess.run(command, cwd=ROOT, check=False).returncode
        took[run] = time.monotonic() - began
        reports.append(junit)
        status = status or code
    print(report(reports, took), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())

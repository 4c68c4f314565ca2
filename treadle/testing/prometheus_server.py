"""A real Prometheus (Debian ``prometheus``) scraping given targets on 127.0.0.1 every second."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from treadle.testing import procs


@dataclass(frozen=True)
class PrometheusServer:
    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; raises on a PromQL error so a bad dashboard expression fails loudly."""
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = resp.json()
        if body.get("status") != "success":
            raise ValueError(f"query {expr!r}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Range query (a matrix: ``values`` per series); raises on a PromQL error as ``query``."""
        params = {"query": expr, "start": str(start), "end": str(end), "step": str(step)}
        body = httpx.get(f"{self.url}/api/v1/query_range", params=params, timeout=30).json()
        if body.get("status") != "success":
            raise ValueError(f"query {expr!r}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_scraped(self, jobs: Sequence[str], timeout: float = 30.0) -> None:
        """Block until every job has at least one healthy target."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            up = {r["metric"]["job"] for r in self.query("up == 1")}
            if set(jobs) <= up:
                return
            time.sleep(0.5)
        raise TimeoutError(f"prometheus: targets of {sorted(set(jobs) - up)} not up after {timeout}s")


@contextlib.contextmanager
def prometheus_server(
    targets: Mapping[str, Sequence[str]],
    timeout: float = 30.0,
    *,
    scrape_configs: Sequence[Mapping[str, Any]] = (),
) -> Iterator[PrometheusServer]:
    """``targets`` maps a job name to ``host:port`` addresses serving ``/metrics``; ``scrape_configs``
    are added as given (e.g. the chart's ``kubernetes_sd`` jobs)."""
    binary = procs.which("prometheus", "apt-get install prometheus, or run hack/setup.sh")
    port = procs.free_port()
    with tempfile.TemporaryDirectory(prefix="treadle-prometheus-") as tmp:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                *(
                    {"job_name": job, "static_configs": [{"targets": list(addrs)}]}
                    for job, addrs in targets.items()
                ),
                *scrape_configs,
            ],
        }
        config_path = Path(tmp) / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        argv = [
            binary, f"--config.file={config_path}", f"--storage.tsdb.path={tmp}/data",
            f"--web.listen-address=127.0.0.1:{port}",
        ]  # fmt: skip
        with procs.running("prometheus", argv, lambda: procs.port_open(port), timeout=timeout) as proc:
            yield PrometheusServer(port, proc.pid)

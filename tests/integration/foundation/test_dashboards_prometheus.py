"""Every rollout-dashboard query returns data from a real Prometheus scraping a real local stack.

The stack is local mode's own (every service a process on 127.0.0.1, simulated engines); the
job is the math-tool example, cut to a few groups. The multi-agent dashboard's queries run against
the two-agent rebalancing job, whose skewed start makes placement move workers.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import yaml

from treadle.api import v1alpha1
from treadle.dashboards import catalog, model, pictures, tangram
from treadle.localmode import plan as plan_mod
from treadle.localmode import run as run_mod
from treadle.localmode import stack as stack_mod
from treadle.testing import prometheus_server

ROOT = Path(__file__).resolve().parents[3]


def _scrape_targets(services: run_mod.Services) -> dict[str, list[str]]:
    """Job name -> host:port of each /metrics endpoint the stack serves."""
    http = {
        "reward": [services.reward],
        "env": services.envs,
        "agent": list(services.agents.values()),
        "engine": list(services.engines.values()),
    }
    targets = {job: [u.removeprefix("http://").rstrip("/") for u in urls] for job, urls in http.items()}
    for name, url in services.metrics.items():
        targets[name] = [url.removeprefix("http://").removesuffix("/metrics")]
    return targets


async def _queries_without_data(
    tmp_path: Path, manifest: str, options: plan_mod.Options, dashboard: model.Dashboard
) -> list[str]:
    """Run the job to the end with Prometheus scraping it; the dashboard's queries that return nothing."""
    job = v1alpha1.parse_job(yaml.safe_load((ROOT / manifest).read_text()))
    plan = plan_mod.make_plan(job, options)
    with stack_mod.Stack(tmp_path) as stack:
        services = await run_mod.start_services(stack, plan, options)
        targets = _scrape_targets(services)
        with prometheus_server.prometheus_server(targets) as prom:
            await asyncio.to_thread(prom.wait_scraped, list(targets))
            began = time.time()
            summary = await run_mod.drive(services, plan, interval_s=60, timeout_s=240, echo=lambda _: None)
            assert summary["completed"] > 0 and summary["adds_up"]
            await asyncio.sleep(3)  # a few more scrapes after the last trajectory
            empty = []
            for panel in dashboard.panels:
                for target in panel.targets:
                    if not await asyncio.to_thread(prom.query, target.expr):
                        empty.append(f"{panel.title}: {target.expr}")
            if folder := pictures.folder():
                source = f"{Path(manifest).name} in local mode, simulated engines"
                end = time.time()
                pictures.draw(dashboard, prom, variables={}, start=began, end=end, out=folder, source=source)
    return empty


async def test_every_rollout_panel_returns_data(tmp_path: Path) -> None:
    options = plan_mod.Options(trajectories=40, max_workers_per_pool=1, env_servers=1, max_tokens=32)
    empty = await _queries_without_data(
        tmp_path, "manifests/examples/math-tool-h20.yaml", options, catalog.ROLLOUT
    )
    assert empty == [], "dashboard queries with no data:\n" + "\n".join(empty)


async def test_every_multi_agent_panel_returns_data(tmp_path: Path) -> None:
    # Engines that queue (2 sequences at once, 2 ms a step) behind one planner worker: workers move.
    options = plan_mod.Options(
        trajectories=48, max_workers_per_pool=3, env_servers=1, max_tokens=24, max_num_seqs=2,
        engine_step_ms=2, rebalance_interval_s=0.2,
    )  # fmt: skip
    manifest = "manifests/local/two-agent-rebalance.yaml"
    empty = await _queries_without_data(tmp_path, manifest, options, catalog.MULTI_AGENT)
    assert empty == [], "dashboard queries with no data:\n" + "\n".join(empty)


async def test_every_external_resources_panel_returns_data(tmp_path: Path) -> None:
    # Code runs (CPU actions) in every env step; two reward models share 2 GPUs (GPU actions, restores).
    options = plan_mod.Options(trajectories=32, max_workers_per_pool=1, env_servers=1, max_tokens=24)
    empty = await _queries_without_data(tmp_path, "manifests/local/tangram.yaml", options, tangram.TANGRAM)
    assert empty == [], "dashboard queries with no data:\n" + "\n".join(empty)

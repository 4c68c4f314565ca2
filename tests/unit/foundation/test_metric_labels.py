"""Label cardinality stays bounded: every metric of ``treadle.metrics`` is defined somewhere in
``treadle/``, and each label it is defined with is one whose values a job's configuration bounds.

The walk reads the source (every call that takes a ``treadle.metrics`` name followed by its help
text is a definition) rather than running the services, so a metric no test starts is walked too.
A new label goes into ``BOUNDED`` with what bounds it; an id per trajectory, group, session or
request never does (each is a new series, and Prometheus keeps every series it ever saw).
"""

from __future__ import annotations

import ast
from pathlib import Path

from treadle import metrics

TREADLE = Path(metrics.__file__).resolve().parent
DEFINED = {k: v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str) and k != "PREFIX"}

BOUNDED = {
    # Spec-bounded: the job's own lists.
    "task": "spec.tasks",
    "env": "the environments spec.tasks name",
    "reward_fn": "the reward functions spec.tasks name",
    "pool": "spec.pools",
    "agent": "spec.agents",
    "donor": "spec.agents",
    "receiver": "spec.agents",
    "worker": "inference pods: spec.pools[].replicas",
    "tool": "spec.externalResources.apiQuotas (at most 32)",
    "resource": "cpu, gpu plus the api quotas (at most 34)",
    "model": "spec.externalResources.rewardModels (at most 16)",
    "steps_done": "spec.tasks[].maxTurns",
    # Fixed vocabularies in the code.
    "stage": "scheduler stages",
    "status": "trajectory or HTTP status",
    "kind": "failure kinds",
    "outcome": "outcomes",
    "reason": "reasons",
    "call": "environment calls",
    "phase": "phases",
    "pull": "how a version reached a worker",
    "stat": "min, max, target",
    "to": "reference, behaviour",
    "route": "route templates, not paths",
    "finish_reason": "vLLM finish reasons",
    "finished_reason": "vLLM finish reasons",
    "result": "reconcile results",
    "action": "applied, deleted",
    "state": "ready, desired",
    "condition": "condition types",
    "accelerator": "accelerator classes",
    # The operator's per-job series: one set per RolloutJob, removed with it.
    "namespace": "RolloutJobs",
    "name": "RolloutJobs",
    "uid": "RolloutJobs",
}
DYNAMIC = {"VLLM_": "vLLM's own label set (model_name, engine), one engine per pod"}


def _metric_arg(node: ast.Call, aliases: set[str]) -> tuple[int, str] | None:
    for i, arg in enumerate(node.args):
        if (
            isinstance(arg, ast.Attribute)
            and isinstance(arg.value, ast.Name)
            and arg.value.id in aliases
            and arg.attr in DEFINED
        ):
            return i, arg.attr
    return None


def _aliases(tree: ast.Module) -> set[str]:
    """Names ``treadle.metrics`` is imported as in a module."""
    return {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "treadle"
        for a in node.names
        if a.name == "metrics"
    }


def walk(tree: ast.Module) -> list[tuple[int, str, set[str]]]:
    """(line, metric constant, labels) of each definition in a module; ``*`` marks labels not literal."""
    aliases = _aliases(tree)
    out = []
    for node in ast.walk(tree):
        found = _metric_arg(node, aliases) if aliases and isinstance(node, ast.Call) else None
        if found is None:
            continue
        i, name = found
        rest = node.args[i + 1 :]
        if not (rest and isinstance(rest[0], ast.Constant) and isinstance(rest[0].value, str)):
            continue  # a use (a lookup by name), not a definition with its help text
        labels: set[str] = set()
        # Positional: label names, or a list of them (anything else there is a value, not a label).
        for arg in rest[1:]:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                labels.add(arg.value)
            elif isinstance(arg, (ast.List, ast.Tuple)):
                labels |= _names(arg.elts)
        for kw in node.keywords:
            if kw.arg in ("labels", "labelnames"):
                labels |= _names(kw.value.elts) if isinstance(kw.value, (ast.List, ast.Tuple)) else {"*"}
        out.append((node.lineno, name, labels))
    return out


def _names(elts: list[ast.expr]) -> set[str]:
    return {e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else "*" for e in elts}


def definitions() -> dict[str, list[tuple[str, set[str]]]]:
    """Metric constant -> (where, labels) of each definition in ``treadle/`` (dashboards only read)."""
    out: dict[str, list[tuple[str, set[str]]]] = {}
    for path in sorted(TREADLE.rglob("*.py")):
        if "dashboards" in path.parts:
            continue
        for line, name, labels in walk(ast.parse(path.read_text())):
            out.setdefault(name, []).append((f"{path.relative_to(TREADLE.parent)}:{line}", labels))
    return out


def unbounded(name: str, labels: set[str]) -> set[str]:
    """The labels of a definition no configuration bounds (``*``: not literal, outside ``DYNAMIC``)."""
    dynamic = any(name.startswith(prefix) for prefix in DYNAMIC)
    return {label for label in labels if label not in BOUNDED and not (label == "*" and dynamic)}


def test_every_metric_is_defined_with_bounded_labels_only() -> None:
    found = definitions()
    assert set(found) == set(DEFINED), f"never defined: {sorted(set(DEFINED) - set(found))}"
    for name, defs in found.items():
        for where, labels in defs:
            assert not unbounded(name, labels), (
                f"{where}: {name} labelled by {sorted(unbounded(name, labels))}"
            )


def test_the_walk_finds_labels_and_fails_an_id() -> None:
    source = """
from treadle import metrics as m
import prometheus_client as prom
a = prom.Counter(m.SCHED_TURNS_TOTAL, "Turns", ["task", "trajectory_id"], registry=r)
b = prom.Gauge(m.ENV_SESSIONS_ACTIVE, "Open", labelnames=labels)
c = lookup.get(m.BUFFER_STORED, 0)
"""
    (a, b) = walk(ast.parse(source))
    assert a == (4, "SCHED_TURNS_TOTAL", {"task", "trajectory_id"})
    assert unbounded(a[1], a[2]) == {"trajectory_id"}
    assert b == (5, "ENV_SESSIONS_ACTIVE", {"*"}) and unbounded(b[1], b[2]) == {"*"}

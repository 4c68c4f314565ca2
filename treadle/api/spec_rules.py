"""The RolloutJob spec's cross-field rules, each declared once for both checkers.

Every ``Rule`` is a CEL expression that ``treadle.api.crd`` attaches to the CRD for the API server
*and* a Python predicate that ``v1alpha1.parse_spec`` runs, with one message for both; transition
rules (``oldSelf``, immutable fields) only the API server can check. Predicates read the typed
spec (``v1alpha1.RolloutJobSpec``) at the rule's ``path``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from treadle import errors
from treadle.api import base, dataset


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: CEL for the API server, a predicate for Python, one message for both."""

    path: tuple[str, ...]
    """Schema object the rule hangs on (camelCase keys from the spec root; ``[]`` = list items)."""
    cel: str
    message: str
    field: str
    """Dotted field the message is about (the CRD's ``fieldPath`` is derived from it)."""
    check: Callable[[Any], bool] | None = None
    """Python check on the model at ``path``; None for transition (``oldSelf``) rules."""


SPEC_RULES: tuple[Rule, ...] = (
    Rule(
        (),
        "self.pools.all(p, self.agents.exists(a, a.name == p.agent))",
        "every spec.pools[].agent must name an agent in spec.agents",
        "spec.pools.agent",
        lambda s: all(any(a.name == p.agent for a in s.agents) for p in s.pools),
    ),
    Rule(
        (),
        "self.agents.all(a, self.pools.exists(p, p.agent == a.name))",
        "every agent in spec.agents needs at least one pool in spec.pools",
        "spec.agents",
        lambda s: all(any(p.agent == a.name for p in s.pools) for a in s.agents),
    ),
    Rule(
        (),
        "self.tasks.all(t, t.agents.all(n, self.agents.exists(a, a.name == n)))",
        "every spec.tasks[].agents entry must name an agent in spec.agents",
        "spec.tasks.agents",
        lambda s: all(any(a.name == n for a in s.agents) for t in s.tasks for n in t.agents),
    ),
    Rule(
        (),
        "self.tasks.all(t, !has(t.pools) || t.pools.all(n, self.pools.exists(p, p.name == n)))",
        "every spec.tasks[].pools entry must name a pool in spec.pools",
        "spec.tasks.pools",
        lambda s: all(any(p.name == n for p in s.pools) for t in s.tasks for n in t.pools),
    ),
    Rule(
        (),
        "self.tasks.all(t, !has(t.pools) || t.pools.all(n,"
        " self.pools.exists(p, p.name == n && t.agents.exists(a, a == p.agent))))",
        "spec.tasks[].pools may only name pools serving one of the task's agents",
        "spec.tasks.pools",
        lambda s: all(
            any(p.name == n and p.agent in t.agents for p in s.pools) for t in s.tasks for n in t.pools
        ),
    ),
    # tasks[].sampling (treadle.api.sampling): which fields go with which mode.
    Rule(
        (),
        "self.tasks.all(t, !has(t.sampling) || !has(t.sampling.mode) || t.sampling.mode == 'redundant'"
        " || t.redundancy == 0.0)",
        "spec.tasks[].redundancy must be 0 unless sampling.mode is redundant (darts sizes its own pools)",
        "spec.tasks.redundancy",
        lambda s: all(t.sampling.mode in (None, "redundant") or t.redundancy == 0 for t in s.tasks),
    ),
    Rule(
        (),
        "self.tasks.all(t, !has(t.sampling) || !has(t.sampling.mode) || t.sampling.mode != 'redundant'"
        " || t.redundancy > 0.0)",
        "spec.tasks[].redundancy must be above 0 when sampling.mode is redundant",
        "spec.tasks.redundancy",
        lambda s: all(t.sampling.mode != "redundant" or t.redundancy > 0 for t in s.tasks),
    ),
    Rule(
        (),
        "self.tasks.all(t, !has(t.sampling) || (has(t.sampling.mode) && t.sampling.mode == 'darts')"
        " || !(has(t.sampling.mUp) || has(t.sampling.longEnd) || has(t.sampling.lambda)"
        " || has(t.sampling.emaDecay) || has(t.sampling.keepUnselected) || has(t.sampling.length)))",
        "spec.tasks[].sampling.mUp, longEnd, lambda, emaDecay, keepUnselected and length apply only to mode"
        " darts",
        "spec.tasks.sampling.mode",
        lambda s: all(
            t.sampling.mode == "darts"
            or (
                t.sampling.m_up,
                t.sampling.long_end,
                t.sampling.lam,
                t.sampling.ema_decay,
                t.sampling.keep_unselected,
                t.sampling.length,
            )
            == (None,) * 6
            for t in s.tasks
        ),
    ),
    Rule(
        (),
        "self.tasks.all(t, !has(t.sampling) || !has(t.sampling.mUp) || t.sampling.mUp >= t.groupSize)",
        "spec.tasks[].sampling.mUp must be at least groupSize",
        "spec.tasks.sampling.mUp",
        lambda s: all(t.sampling.m_up is None or t.sampling.m_up >= t.group_size for t in s.tasks),
    ),
    Rule(
        (),
        "self.tasks.all(t, !has(t.sampling) || !has(t.sampling.longEnd) || t.sampling.longEnd < t.groupSize)",
        "spec.tasks[].sampling.longEnd must be below groupSize (at least one shortest candidate per group)",
        "spec.tasks.sampling.longEnd",
        lambda s: all(t.sampling.long_end is None or t.sampling.long_end < t.group_size for t in s.tasks),
    ),
    Rule(
        ("reward",),
        "!self.scaleToZero || self.minReplicas == 0",
        "spec.reward.minReplicas must be 0 when scaleToZero is true",
        "spec.reward.minReplicas",
        lambda r: not r.scale_to_zero or r.min_replicas == 0,
    ),
    Rule(
        ("reward",),
        "self.minReplicas <= self.maxReplicas",
        "spec.reward.minReplicas must not exceed maxReplicas",
        "spec.reward.minReplicas",
        lambda r: r.min_replicas <= r.max_replicas,
    ),
    Rule(
        ("reward",),
        "self.type != 'external' || has(self.url)",
        "spec.reward.url is required when type is external",
        "spec.reward.url",
        lambda r: r.type != "external" or r.url is not None,
    ),
    Rule(
        ("reward",),
        "self.type != 'llm-judge' || has(self.judgeModel)",
        "spec.reward.judgeModel is required when type is llm-judge",
        "spec.reward.judgeModel",
        lambda r: r.type != "llm-judge" or r.judge_model is not None,
    ),
    # externalResources.rewardModels (ARL-Tangram's reward-model GPUs)
    Rule(
        ("externalResources",),
        "!has(self.rewardModels) || size(self.rewardModels) == 0 || self.rewardModelGpus > 0",
        "spec.externalResources.rewardModels need rewardModelGpus > 0 to run on",
        "spec.externalResources.rewardModelGpus",
        lambda e: not e.reward_models or e.reward_model_gpus > 0,
    ),
    Rule(
        ("externalResources",),
        "!has(self.rewardModels) || self.rewardModels.all(m, !has(m.parallelism) || m.parallelism.all("
        "k, (k == 1 || k == 2 || k == 4 || k == 8) && k <= self.rewardModelGpus))",
        "spec.externalResources.rewardModels[].parallelism entries are 1, 2, 4 or 8, and at most "
        "rewardModelGpus",
        "spec.externalResources.rewardModels.parallelism",
        lambda e: all(
            k in (1, 2, 4, 8) and k <= e.reward_model_gpus for m in e.reward_models for k in m.parallelism
        ),
    ),
    Rule(
        ("externalResources",),
        "!has(self.rewardModels) || self.rewardModels.all(m, (has(m.engine) ? m.engine : 'simulated') =="
        " (has(self.rewardModels[0].engine) ? self.rewardModels[0].engine : 'simulated'))",
        "spec.externalResources.rewardModels[].engine must be the same for every model (the gateway runs "
        "one kind of engine)",
        "spec.externalResources.rewardModels.engine",
        lambda e: len({m.engine for m in e.reward_models}) <= 1,
    ),
    Rule(
        (),
        "self.tasks.all(t, !t.reward.startsWith('judge:') || (has(self.externalResources)"
        " && has(self.externalResources.rewardModels)"
        " && self.externalResources.rewardModels.exists(m, 'judge:' + m.name == t.reward)))",
        "every spec.tasks[].reward judge:<name> must name a model in spec.externalResources.rewardModels",
        "spec.tasks.reward",
        lambda s: all(
            not t.reward.startswith("judge:")
            or any("judge:" + m.name == t.reward for m in s.external_resources.reward_models)
            for t in s.tasks
        ),
    ),
    Rule(
        ("environment",),
        "self.warmPool == 0 || self.replicas > 0",
        "spec.environment.warmPool needs at least one environment replica",
        "spec.environment.warmPool",
        lambda e: e.warm_pool == 0 or e.replicas > 0,
    ),
    Rule(
        ("weights",),
        "self.store != 'local' || self.replicas == 1",
        "spec.weights.replicas must be 1 when store is local",
        "spec.weights.replicas",
        lambda w: w.store != "local" or w.replicas == 1,
    ),
    Rule(
        ("feeder",),
        "self.volumes.all(v, has(v.persistentVolumeClaim) != has(v.hostPath))",
        "each of spec.feeder.volumes needs exactly one of persistentVolumeClaim, hostPath",
        "spec.feeder.volumes",
        lambda f: all((v.persistent_volume_claim is None) != (v.host_path is None) for v in f.volumes),
    ),
    Rule(
        ("feeder",),
        "self.volumes.all(v, !v.mountPath.startsWith('/etc/treadle'))",
        "spec.feeder.volumes[].mountPath must not lie under /etc/treadle (the job's config and its"
        " ConfigMap datasets are mounted there)",
        "spec.feeder.volumes",
        lambda f: not any(v.mount_path.startswith("/etc/treadle") for v in f.volumes),
    ),
    Rule(
        (),
        "self.tasks.all(t, !has(t.dataset) || !has(t.dataset.source.path)"
        " || (!t.dataset.source.path.contains('/../') && self.feeder.volumes.exists(v,"
        " t.dataset.source.path.startsWith(v.mountPath + '/'))))",
        "every spec.tasks[].dataset.source.path must lie under the mountPath of one of spec.feeder.volumes",
        "spec.tasks.dataset.source.path",
        lambda s: all(
            any(dataset.under(t.dataset.source.path, v.mount_path) for v in s.feeder.volumes)
            for t in s.tasks
            if t.dataset is not None and t.dataset.source.path is not None
        ),
    ),
    Rule(
        ("feeder",),
        "!has(self.huggingFaceCache) || self.volumes.exists(v, self.huggingFaceCache == v.mountPath"
        " || self.huggingFaceCache.startsWith(v.mountPath + '/'))",
        "spec.feeder.huggingFaceCache must be the mountPath of one of spec.feeder.volumes or lie under it",
        "spec.feeder.huggingFaceCache",
        lambda f: (
            f.hugging_face_cache is None
            or any(
                f.hugging_face_cache == v.mount_path or dataset.under(f.hugging_face_cache, v.mount_path)
                for v in f.volumes
            )
        ),
    ),
    Rule(
        (),
        "!has(self.trainer) || (has(self.trainer.agent)"
        " ? self.agents.exists(a, a.name == self.trainer.agent) : size(self.agents) == 1)",
        "spec.trainer.agent must name an agent in spec.agents; it may be unset only with one agent",
        "spec.trainer.agent",
        lambda s: (
            s.trainer is None
            or (any(a.name == s.trainer.agent for a in s.agents) if s.trainer.agent else len(s.agents) == 1)
        ),
    ),
    Rule(
        ("trainer",),
        "self.env.all(e, !e.name.startsWith('TREADLE_'))",
        "spec.trainer.env may not set TREADLE_* variables: Treadle sets them for the SDK",
        "spec.trainer.env",
        lambda t: t is None or not any(e.name.startswith("TREADLE_") for e in t.env),
    ),
    Rule(
        ("trainer",),
        "self.env.all(e, self.env.filter(f, f.name == e.name).size() == 1)",
        "spec.trainer.env names each variable once",
        "spec.trainer.env",
        lambda t: t is None or len({e.name for e in t.env}) == len(t.env),
    ),
    Rule(
        (),
        "self.pools.all(p, !has(p.engine) || " + base.limits_cover_requests_cel("p.engine.resources") + ")",
        "spec.pools[].engine.resources: a limit may not be below its request",
        "spec.pools.engine.resources",
        lambda s: all(
            p.engine.resources is None or base.limits_cover_requests(p.engine.resources) for p in s.pools
        ),
    ),
    Rule(
        (),
        base.limits_cover_requests_cel("self.environment.resources"),
        "spec.environment.resources: a limit may not be below its request",
        "spec.environment.resources",
        lambda s: base.limits_cover_requests(s.environment.resources),
    ),
    Rule(
        (),
        base.limits_cover_requests_cel("self.feeder.resources"),
        "spec.feeder.resources: a limit may not be below its request",
        "spec.feeder.resources",
        lambda s: base.limits_cover_requests(s.feeder.resources),
    ),
    Rule(
        (),
        "!has(self.trainer) || " + base.limits_cover_requests_cel("self.trainer.resources"),
        "spec.trainer.resources: a limit may not be below its request",
        "spec.trainer.resources",
        lambda s: s.trainer is None or base.limits_cover_requests(s.trainer.resources),
    ),
    # Transition rules (immutable fields): only the API server can check these.
    Rule(
        ("agents", "[]"),
        "self.model == oldSelf.model",
        "spec.agents[].model is immutable",
        "spec.agents.model",
    ),
    Rule(
        # The schema's minimum is not enough: the API server compares an integer value with a
        # fractional minimum after truncating the minimum (it accepted intervalSeconds: 0).
        ("rollout", "rebalance"),
        "self.intervalSeconds >= 0.05",
        "spec.rollout.rebalance.intervalSeconds must be at least 0.05",
        "spec.rollout.rebalance.intervalSeconds",
        lambda r: r.interval_seconds >= 0.05,
    ),
    Rule(
        ("pools", "[]"), "self.agent == oldSelf.agent", "spec.pools[].agent is immutable", "spec.pools.agent"
    ),
    Rule(
        ("pools", "[]"),
        "self.accelerator == oldSelf.accelerator",
        "spec.pools[].accelerator is immutable",
        "spec.pools.accelerator",
    ),
    Rule(
        ("weights",), "self.store == oldSelf.store", "spec.weights.store is immutable", "spec.weights.store"
    ),
    Rule(
        (),
        "has(self.managedBy) == has(oldSelf.managedBy)"
        " && (!has(self.managedBy) || self.managedBy == oldSelf.managedBy)",
        "spec.managedBy is immutable",
        "spec.managedBy",
    ),
)

# Lists keyed by ``name``: the API server rejects duplicate names and correlates items across
# updates, which the immutable-field rules on list items need.
MAP_LISTS: Mapping[tuple[str, ...], str] = {
    ("agents",): "name", ("pools",): "name", ("tasks",): "name", ("feeder", "volumes"): "name",
    ("externalResources", "rewardModels"): "name",
}  # fmt: skip
SET_LISTS: tuple[tuple[str, ...], ...] = (("tasks", "[]", "agents"), ("tasks", "[]", "pools"))


_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def problems(spec: Any) -> list[errors.SpecError]:
    """Every duplicate name (``MAP_LISTS``) and broken rule (``SPEC_RULES``) of a parsed spec
    (``v1alpha1.RolloutJobSpec``), each naming its field."""
    found = [
        errors.SpecError(f"duplicate name(s) {dup}", field="spec." + ".".join(key), value=dup)
        for key in MAP_LISTS
        if (dup := _duplicates([item.name for item in _at(spec, key)]))
    ]
    for rule in SPEC_RULES:
        try:
            broken = rule.check is not None and not rule.check(_at(spec, rule.path))
        except Exception:
            if found:  # a rule may rely on one already broken: the first problems are reported
                continue
            raise
        if broken:
            found.append(errors.SpecError(rule.message, field=rule.field))
    return found


def _at(spec: Any, path: tuple[str, ...]) -> Any:
    node: Any = spec
    for key in path:
        node = getattr(node, _SNAKE.sub("_", key).lower())
    return node


def _duplicates(names: list[str]) -> list[str]:
    return sorted({n for n in names if names.count(n) > 1})

"""kopf handlers of the Treadle operator: read, render, diff, apply, report. Nothing else.

Registered on import; run by ``treadle operator run`` (``treadle.operator.cli``). Handlers are
synchronous and run on kopf's thread pool (``settings.execution.max_workers``), which bounds the
concurrent API calls. Shared state lives in kopf's ``memo`` (``runtime.Runtime``), not in globals.

No finalizers: children carry ownerReferences, so the Kubernetes garbage collector deletes them
with their job even while the operator is down; no handler here is a timer, a daemon or a
non-optional delete handler (each of those would make kopf add a finalizer that blocks deletion
while the operator is away).

Status is recomputed from kopf indexes (in-memory views of child Deployments, Pods, the trainers'
Pods and jobs, kept current by their watch streams) plus a GPU-capacity list cached for 30 s,
whenever a child changes, so refreshing status costs no API reads, only a status patch when
something changed.
"""

from __future__ import annotations

import copy
import datetime
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf
import kubernetes
import redis

from treadle import auth, errors, kubeapi
from treadle.api import v1alpha1
from treadle.operator import diff, reasons, redisacl, render, runtime, status
from treadle.operator.render import common as render_common
from treadle.operator.render import trainer as render_trainer

JOBS = (v1alpha1.GROUP, v1alpha1.VERSION, v1alpha1.PLURAL)
KOPF_PREFIX = "kopf.treadle.dev"
"""Annotation prefix of kopf's own bookkeeping on a job (progress, last-handled configuration)."""
JobKey = runtime.JobKey


def _ours(spec: Mapping[str, Any], **_: Any) -> bool:
    """Jobs handed to another controller (Kueue MultiKueue, ...) through ``managedBy`` are not ours."""
    return spec.get("managedBy") in (None, v1alpha1.MANAGER)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: copy.deepcopy(body[k]) for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in body
    }


def _ref(job: Mapping[str, Any]) -> kopf.Body:
    """The minimal object reference kopf needs to post an Event about a job."""
    meta = job["metadata"]
    return kopf.Body(
        {
            "apiVersion": v1alpha1.API_VERSION,
            "kind": v1alpha1.KIND,
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
        }
    )


# --- lifecycle -----------------------------------------------------------------------------------


@kopf.on.startup()
def configure(*, settings: kopf.OperatorSettings, memo: runtime.Runtime, **_: Any) -> None:
    # Watches end server-side after 60 s and client-side after 90 s: a stream that silently
    # stalls (kopf #585, #787) leaves the operator blind for at most that long, then re-lists.
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    settings.watching.connect_timeout = 10
    # Non-watch calls (patches, Events) give up after 30 s and are retried by the handler's backoff.
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    # Sync handlers run on this pool: it bounds concurrent API calls from reconciles and refreshes.
    settings.execution.max_workers = 8
    # Per-object workers are cheap coroutines that hand work to the thread pool above (the real
    # bound on concurrent work). kopf's default (no limit) is kept on purpose: with a limit, a
    # burst of pod events keeps every slot busy and RolloutJob events starve behind them.
    settings.queueing.worker_limit = None
    settings.posting.level = logging.INFO
    # Progress and the last-handled spec live in annotations, not in status (which the CRD's
    # structural schema would prune), under a prefix of their own: kopf leaves every annotation
    # under its storage prefix out of the diff it reacts to, so with plain ``treadle.dev`` a change
    # of ``treadle.dev/reward-demand`` (the scheduler's) would never reach the update handler.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration"
    )
    # After its own patch (the last-handled configuration) kopf waits this long for the watch to
    # deliver that version before it handles an older body; kopf's 5 s default ran the create
    # handler a second time for ~47 of 50 jobs in bench/operator_scale.py (the stream lagged
    # behind the patches by more than 5 s while the jobs' pods started), each a no-op reconcile.
    settings.persistence.consistency_timeout = 30
    # One replica (Deployment strategy Recreate): no peering CRDs, no peering RBAC, and none of
    # the freezes of a lingering old peer (kopf #1276). Two replicas would double-apply, not help.
    settings.peering.standalone = True
    if memo.cfg.redis_password:
        memo.keeper = redisacl.UserKeeper(memo.cfg, memo.known_jobs)
        memo.keeper.start()
    if memo.metrics_port is not None:
        import prometheus_client

        memo._http = prometheus_client.start_http_server(
            memo.metrics_port, addr=memo.metrics_addr, registry=memo.metrics.registry
        )


@kopf.on.login()
def login(*, memo: runtime.Runtime, **_: Any) -> kopf.ConnectionInfo:
    """kopf's watches use exactly the credentials of our own client (a kubeconfig or the pod's
    ServiceAccount), re-read on every login so a rotated token is picked up."""
    c = kubeapi.load_configuration(memo.kubeconfig)
    keys = c.api_key or {}
    # The client files a kubeconfig/ServiceAccount token under "BearerToken" (older: "authorization"),
    # with the scheme in front: "Bearer " from a kubeconfig, "bearer " from the in-cluster loader.
    auth = keys.get("BearerToken") or keys.get("authorization") or ""
    scheme, _space, value = auth.partition(" ")
    token = (value if scheme.lower() == "bearer" else auth).strip() or None
    return kopf.ConnectionInfo(
        server=c.host,
        ca_path=c.ssl_ca_cert,
        insecure=not c.verify_ssl,
        token=token,
        scheme="Bearer" if token else None,
        certificate_path=c.cert_file,
        private_key_path=c.key_file,
    )


@kopf.on.cleanup()
def shutdown(*, memo: runtime.Runtime, **_: Any) -> None:
    if memo.keeper is not None:
        memo.keeper.stop()
    if memo._http is not None:
        server, thread = memo._http
        server.shutdown()
        thread.join(timeout=5)
    memo.kube.close()


@kopf.on.probe(id="jobs")
def probe_jobs(**kwargs: Any) -> int:
    """Liveness: the job index answers (kopf fails the probe if the event loop is stuck)."""
    return len(kwargs["job_bodies"])


# --- indexes: in-memory views the status computation reads ---------------------------------------


@kopf.index(*JOBS, when=_ours)
def job_bodies(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[JobKey, dict[str, Any]]:
    return {(namespace or "", name): _plain(body)}


@kopf.index("apps", "v1", "deployments", labels={render_common.JOB_LABEL: kopf.PRESENT})
def child_deployments(
    *, namespace: str | None, name: str, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[JobKey, tuple[str, status.DeploymentState]]:
    return {(namespace or "", labels[render_common.JOB_LABEL]): (name, status.deployment_state(_plain(body)))}


@kopf.index("", "v1", "pods", labels={render_common.JOB_LABEL: kopf.PRESENT})
def child_pod_problems(
    *, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[JobKey, status.PodProblem]:
    """The pod's problem under its job, or an empty mapping once it has none.

    Never ``None``: kopf keeps an object's previous index entries when its index function returns
    ``None`` (``OperatorIndexers.replace`` stores only non-None results), so a pod that was
    Unschedulable for a moment would stay a problem after it runs; an empty mapping drops them.
    """
    problem = status.pod_problem(_plain(body))
    return {} if problem is None else {(namespace or "", labels[render_common.JOB_LABEL]): problem}


@kopf.index(
    "",
    "v1",
    "pods",
    labels={render_common.JOB_LABEL: kopf.PRESENT, render_common.COMPONENT_LABEL: render_trainer.COMPONENT},
)
def trainer_pods(
    *, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[JobKey, status.TrainerPod]:
    """Each pod of a job's trainer (its Job, readiness, restarts): the group's ``status.trainer``."""
    return {(namespace or "", labels[render_common.JOB_LABEL]): status.trainer_pod(_plain(body))}


# --- reconcile: render, diff, apply ----------------------------------------------------------------


def _report_invalid(memo: runtime.Runtime, body: Mapping[str, Any], exc: errors.SpecError) -> None:
    _report_degraded(memo, body, reasons.INVALID_SPEC, str(exc))


def _report_degraded(memo: runtime.Runtime, body: Mapping[str, Any], reason: str, message: str) -> None:
    """Degraded and not Ready for ``reason``, on a job whose children cannot be applied."""
    meta = body["metadata"]
    generation = int(meta.get("generation", 0))
    prev = v1alpha1.RolloutJobStatus.model_validate(body.get("status") or {})
    conds, _ = status.set_condition(
        prev.conditions, type="Degraded", status="True", reason=reason,
        message=message, generation=generation, now=_now(),
    )  # fmt: skip
    conds, _ = status.set_condition(
        conds, type="Ready", status="False", reason=reason,
        message=message, generation=generation, now=_now(),
    )  # fmt: skip
    new = prev.model_copy(
        update={"conditions": conds, "phase": "Degraded", "observed_generation": generation}
    )
    memo.kube.patch_status(meta["namespace"], meta["name"], _status_patch(new), uid=meta.get("uid"))
    kopf.event(_ref(body), type="Warning", reason=reason, message=message)


def _status_patch(st: v1alpha1.RolloutJobStatus) -> dict[str, Any]:
    # policyVersion, step and meanReward (on each commit) and rollout belong to the job's scheduler;
    # the operator never overwrites them.
    return st.model_dump(
        mode="json", by_alias=True, exclude={"policy_version", "step", "mean_reward", "rollout"}
    )


@kopf.on.resume(*JOBS, when=_ours, backoff=5, timeout=600)
@kopf.on.create(*JOBS, when=_ours, backoff=5, timeout=600)
@kopf.on.update(*JOBS, when=_ours, backoff=5, timeout=600)
def reconcile(
    *,
    body: kopf.Body,
    memo: runtime.Runtime,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    **kwargs: Any,
) -> None:
    raw = _plain(body)
    started = time.perf_counter()
    with memo.metrics.reconciling():
        try:
            job = v1alpha1.parse_job(raw)
        except errors.SpecError as exc:
            memo.metrics.reconcile_total.labels("invalid").inc()
            _report_invalid(memo, raw, exc)
            raise kopf.PermanentError(str(exc)) from exc
        key = (job.namespace, job.name)
        memo.reconciling.add(key)
        try:
            if memo.kube.job_uid(job.namespace, job.name) != job.metadata.get("uid"):
                # kopf still hands us bodies queued before the job was deleted (or re-created
                # under its name), as creations; applying them would re-create the children the
                # garbage collector has just removed, once per queued event.
                logger.info("the job was deleted or re-created meanwhile: nothing to apply")
                return
            applied = _apply(memo, job)
        except kubernetes.client.ApiException as exc:
            memo.metrics.reconcile_total.labels("error").inc()
            if exc.status in (409, 429) or (exc.status or 500) >= 500:
                detail = str(exc.body or "")[:300]
                raise kopf.TemporaryError(
                    f"API {exc.status} {exc.reason}: {detail}; retrying", delay=5
                ) from exc
            if exc.status in (401, 403):
                # RBAC can be fixed without touching the job: keep retrying, slowly.
                raise kopf.TemporaryError(f"API {exc.status}: {exc.body}", delay=30) from exc
            raise kopf.PermanentError(f"API {exc.status} {exc.reason}: {exc.body}") from exc
        finally:
            memo.reconciling.discard(key)
        memo.metrics.reconcile_total.labels("success").inc()
    # One parseable line per reconcile (bench/operator_scale.py reads the durations from it).
    logger.info("reconciled in %.3fs: %d applied (%s)", time.perf_counter() - started, len(applied),
                ", ".join(applied) or "nothing changed")  # fmt: skip
    refresh(memo, key, job_snapshot=raw, **kwargs)


def _apply(memo: runtime.Runtime, job: v1alpha1.RolloutJob) -> list[str]:
    uid = str(job.metadata.get("uid", ""))
    rendered = render.render_children(job, memo.cfg)
    if memo.cfg.redis_password:
        # The job's Redis user before its pods, which log in as it (idempotent, so on every reconcile).
        secret = next(obj for obj in rendered if obj["kind"] == "Secret")
        try:
            redisacl.ensure_user(memo.cfg, job, secret["stringData"][auth.REDIS_PASSWORD_KEY])
        except redis.RedisError as exc:
            why = f"cannot set up the job's Redis user at {memo.cfg.redis_url}: {exc}"
            _report_degraded(memo, job.model_dump(by_alias=True), reasons.REDIS_UNAVAILABLE, why)
            raise kopf.TemporaryError(f"{why}; retrying", delay=10) from exc
    observed = memo.kube.list_children(job.namespace, job.name, uid)
    plan = diff.plan(rendered, observed)
    done = []
    for obj in plan.apply:
        memo.kube.apply(obj)
        action = "update" if render_common.key(obj) in observed else "create"
        memo.metrics.children_applied.labels(obj["kind"], action).inc()
        done.append(f"{obj['kind']}/{obj['metadata']['name']}")
    for kind, name in plan.delete:
        memo.kube.delete(kind, job.namespace, name)
        memo.metrics.children_applied.labels(kind, "delete").inc()
    ref = _ref(job.model_dump(by_alias=True))
    if done:
        kopf.event(ref, type="Normal", reason=reasons.APPLIED, message="applied " + ", ".join(done))
    if plan.delete:
        gone = ", ".join(f"{k}/{n}" for k, n in plan.delete)
        kopf.event(ref, type="Normal", reason=reasons.PRUNED, message="deleted " + gone)
    return done


@kopf.on.delete(*JOBS, optional=True)
def forget(
    *, namespace: str | None, name: str, meta: Mapping[str, Any], memo: runtime.Runtime, **_: Any
) -> None:
    """Drop the job's metric series, its Redis user and its Redis keys; ``optional=True`` keeps kopf
    from adding a finalizer (so what an operator that was down left is removed by nothing: the user
    can reach only the keys of a job that no longer exists). Users and keys carry the job's uid
    (``render.common.job_prefix``): a job already re-created under the name, whose reconcile may run
    before this, keeps its own and never takes up these."""
    uid = str(meta.get("uid", ""))
    memo.metrics.forget_job(namespace or "", name)
    memo.forget((namespace or "", name), uid)
    if memo.cfg.redis_password:
        log = logging.getLogger(__name__)
        try:
            redisacl.delete_user(memo.cfg, namespace or "", name, uid)
            deleted = redisacl.delete_keys(memo.cfg, namespace or "", name, uid)
            log.info("deleted %d Redis keys of %s/%s (uid %s)", deleted, namespace, name, uid)
        except redis.RedisError as exc:
            log.warning("Redis user or keys of %s/%s not deleted: %s", namespace, name, exc)


# --- status ---------------------------------------------------------------------------------------


@kopf.on.event("apps", "v1", "deployments", labels={render_common.JOB_LABEL: kopf.PRESENT})
@kopf.on.event("", "v1", "pods", labels={render_common.JOB_LABEL: kopf.PRESENT})
def child_changed(
    *, namespace: str | None, labels: Mapping[str, str], memo: runtime.Runtime, **kwargs: Any
) -> None:
    refresh(memo, (namespace or "", labels[render_common.JOB_LABEL]), **kwargs)


def _values(index: kopf.Index[JobKey, Any], key: JobKey) -> list[Any]:
    return list(index.get(key, ()))


def refresh(
    memo: runtime.Runtime, key: JobKey, *, job_snapshot: dict[str, Any] | None = None, **indexes: Any
) -> None:
    """Recompute one job's status; coalesces concurrent calls for the same job."""
    if not memo.begin_refresh(key):
        return
    again = True
    while again:
        try:
            _refresh_once(memo, key, job_snapshot=job_snapshot, **indexes)
        except BaseException:
            memo.refresh_again(key, failed=True)
            raise
        job_snapshot = None  # a rerun reads the (by then newer) index
        again = memo.refresh_again(key)


def _refresh_once(
    memo: runtime.Runtime,
    key: JobKey,
    *,
    job_bodies: kopf.Index[JobKey, dict[str, Any]],
    child_deployments: kopf.Index[JobKey, tuple[str, status.DeploymentState]],
    child_pod_problems: kopf.Index[JobKey, status.PodProblem],
    trainer_pods: kopf.Index[JobKey, status.TrainerPod],
    job_snapshot: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """Patch the job's status and post Events, only when something changed."""
    found = _values(job_bodies, key)
    raw: dict[str, Any] | None = job_snapshot or (found[0] if found else None)
    if raw is None:
        return
    try:
        job = v1alpha1.parse_job(raw)
    except errors.SpecError:
        return  # reported by reconcile
    generation = int(job.metadata.get("generation", 0))
    uid = str(job.metadata.get("uid", ""))
    cached = memo.last_status.get(key)
    if cached is not None and cached[:2] != (uid, generation):
        cached = None
    prev = cached[2] if cached is not None else job.status
    # Conditions from what we last wrote (the index may lag); policyVersion/step from the job.
    prev = prev.model_copy(update={"policy_version": job.status.policy_version, "step": job.status.step})
    observed = status.Observed(
        deployments=dict(_values(child_deployments, key)),
        problems=list(_values(child_pod_problems, key)),
        gpu_capacity=memo.gpu_capacity(),
        trainer_pods=list(_values(trainer_pods, key)),
        trainer_job=render_trainer.job_name(job, memo.cfg),
    )
    # Someone scaled a child by hand: restore the rendering (not while a reconcile is applying).
    if (drift := status.drifted(job, observed)) and key not in memo.reconciling:
        for obj in render.render_children(job, memo.cfg):
            if obj["kind"] == "Deployment" and obj["metadata"]["name"] in drift:
                memo.kube.apply(obj)
                memo.metrics.children_applied.labels("Deployment", "restore").inc()
    new, transitions = status.compute(job.model_copy(update={"status": prev}), observed, now=_now())
    if new != prev or cached is None:
        try:
            memo.kube.patch_status(job.namespace, job.name, _status_patch(new), uid=uid)
        except kubernetes.client.ApiException as exc:
            if exc.status in (404, 409):
                return  # deleted meanwhile, or re-created under the same name (uid precondition)
            raise
        memo.metrics.status_updates.inc()
    memo.last_status[key] = (uid, generation, new)
    ref = _ref(raw)
    for t in transitions:
        kopf.event(ref, type=t.event_type, reason=t.reason, message=t.event_message)
    memo.metrics.observe_job(job.namespace, job.name, str(job.metadata.get("uid", "")), new)
    pending = 0
    for k in job_bodies:
        for body in _values(job_bodies, k):
            observed_generation = int((body.get("status") or {}).get("observedGeneration", 0))
            pending += int(body["metadata"].get("generation", 0)) > observed_generation
    memo.metrics.jobs_pending.set(pending)

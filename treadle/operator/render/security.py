"""The job's credentials and who may reach its pods: its Secret and its NetworkPolicy (``docs/SECURITY.md``).

``render_secret``: ``J-auth`` holds the job's bearer token (every gRPC and HTTP service of the job
requires it, ``treadle.auth``) and its Redis password (its own Redis user, restricted to its keys,
``treadle.operator.redisacl``), both derived from the operator's key and the job's uid, so rendering
stays pure and a job re-created under the same name gets new ones. ``common.mount_auth`` mounts it.

``render_network_policy``: ``J-network`` lets into the job's pods only the job's own pods (any port)
and the pods of ``cfg.metrics_namespaces`` (Prometheus) on the HTTP ports that serve ``/metrics``.
NetworkPolicies add up: a trainer outside the job gets in through one more policy of the user's
(``docs/SECURITY.md`` shows one).
"""

from __future__ import annotations

from typing import Any

from treadle import auth
from treadle.api import v1alpha1
from treadle.operator import config
from treadle.operator.render import common

METRICS_PORTS = ("metrics", "vllm")
"""The ports Prometheus scrapes: every Treadle container's ``metrics`` port (``/metrics`` only) and
vLLM's API port, whose other routes have no token (see ``docs/SECURITY.md``)."""


def render_secret(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> dict[str, Any]:
    identity = {"namespace": job.namespace, "name": job.name, "uid": str(job.metadata.get("uid", ""))}
    return common.stamp(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": common.meta(job, cfg, "auth"),
            "type": "Opaque",
            "stringData": {
                key: auth.job_secret(cfg.auth_key, purpose=key, **identity)
                for key in (auth.TOKEN_KEY, auth.REDIS_PASSWORD_KEY)
            },
        }
    )


def render_network_policy(job: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> dict[str, Any]:
    def own_pods() -> dict[str, Any]:
        return {"matchLabels": {common.JOB_LABEL: job.name}}

    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": own_pods()}]}]
    if cfg.metrics_namespaces:
        ingress.append(
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/metadata.name",
                                    "operator": "In",
                                    "values": list(cfg.metrics_namespaces),
                                }
                            ]
                        }
                    }
                ],
                "ports": [{"protocol": "TCP", "port": config.PORTS[c]} for c in METRICS_PORTS],
            }
        )
    return common.stamp(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": common.meta(job, cfg, "network"),
            "spec": {"podSelector": own_pods(), "policyTypes": ["Ingress"], "ingress": ingress},
        }
    )

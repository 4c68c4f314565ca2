"""The Kubernetes API client that the operator and the services share: credentials and raw calls.

``Client`` is all a service needs (the scheduler's job reporter patches its job's annotations and
status); ``treadle.operator.kube.Kube`` extends it with the operator's calls. Requests go
through the official client's connection handling, with plain JSON dicts in and out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Self

import kubernetes

from treadle.api import v1alpha1

JOBS_PATH = f"/apis/{v1alpha1.GROUP}/{v1alpha1.VERSION}/namespaces/{{ns}}/{v1alpha1.PLURAL}"
TIMEOUT = (5.0, 30.0)  # connect, read (seconds): a hung call must not hold a worker thread forever


def load_configuration(
    kubeconfig: str | None = None, *, environ: Mapping[str, str] | None = None
) -> kubernetes.client.Configuration:
    """Fresh credentials: in-cluster in a pod (unless a kubeconfig is given), else the kubeconfig.

    Read anew on every call, so a re-login picks up a rotated ServiceAccount token. ``environ``
    (default ``os.environ``) decides which: ``KUBERNETES_SERVICE_HOST`` / ``KUBECONFIG``. Raises
    ``kubernetes.config.ConfigException`` (or ``OSError``) when there are no credentials.
    """
    env = os.environ if environ is None else environ
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None and env.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.incluster_config.InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=kubernetes.config.incluster_config.SERVICE_TOKEN_FILENAME,
            cert_filename=kubernetes.config.incluster_config.SERVICE_CERT_FILENAME,
            try_refresh_token=True,
            environ=env,
        ).load_and_set(configuration)
    else:
        # Pass the path explicitly: the client reads $KUBECONFIG only once, at import time.
        path = kubeconfig or env.get("KUBECONFIG") or None
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=configuration
        )
    return configuration


class Client:
    """A thread-safe client over one connection pool."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.api = api

    @classmethod
    def from_environment(
        cls, kubeconfig: str | None = None, *, pool_size: int = 16, environ: Mapping[str, str] | None = None
    ) -> Self:
        """In-cluster credentials when running in a pod, else ``kubeconfig`` / ``$KUBECONFIG``."""
        configuration = load_configuration(kubeconfig, environ=environ)
        # One connection per worker thread, so calls never queue on the pool.
        configuration.connection_pool_maxsize = pool_size
        return cls(kubernetes.client.ApiClient(configuration))

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """One request; the JSON reply as plain dicts; ``ApiException`` on any non-2xx status."""
        _, url, headers, data, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,  # serialized as JSON, which is also valid for apply-patch+yaml
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, header_params=headers, body=data, _request_timeout=TIMEOUT)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise kubernetes.client.ApiException(http_resp=response)
        return json.loads(response.data) if response.data else None

    def annotate_job(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch annotations onto the job (the only write the scheduler's and feeder's Roles
        allow); a None value removes the annotation."""
        path = JOBS_PATH.format(ns=namespace) + f"/{name}"
        body = {"metadata": {"annotations": dict(annotations)}}
        self._call("PATCH", path, body=body, content_type="application/merge-patch+json")

    def patch_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, uid: str | None = None
    ) -> None:
        """Merge-patch the job's status subresource (the operator's conditions and pools; the
        scheduler's ``policyVersion``/``step``/``meanReward``); with ``uid``, a job re-created under
        the name gets 409."""
        path = JOBS_PATH.format(ns=namespace) + f"/{name}/status"
        body: dict[str, Any] = {"status": dict(status)}
        if uid:
            body["metadata"] = {"uid": uid}  # the API server treats it as a precondition
        self._call("PATCH", path, body=body, content_type="application/merge-patch+json")

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

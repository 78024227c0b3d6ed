"""The Kubernetes calls of `m3fleet bench`, against the current kube context (the thin shell).

Plain REST through `m3fleet.kubeapi.call` (the operator's own): objects go in
and come out as the API's JSON, so the pure modules read them as written. Every path it touches:

| verb | path |
|---|---|
| get | minimaxm3deployments (the resource to benchmark) |
| create, get, delete | jobs (batch/v1) |
| list | pods (the Job's pod), get pods/log |
| create | configmaps (the kept result) |
"""

from __future__ import annotations

import os
from typing import Any

import kubernetes

from m3fleet.api.models import GROUP, PLURAL, VERSION
from m3fleet.errors import ClusterUnreachable
from m3fleet.kubeapi import ApiError, NoAnswer, call

FIELD_MANAGER = "m3fleet-bench"


class BenchFailure(Exception):
    """The benchmark could not be run or finished badly (exit 5); the message says what happened."""


class ApiFailure(BenchFailure):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Cluster:
    """The API server of the current kube context (`KUBECONFIG`, else in-cluster when run in a pod)."""

    def __init__(self) -> None:
        config = kubernetes.config
        files = os.environ.get("KUBECONFIG") or None  # read now: the client reads it once, at import
        try:
            config.load_kube_config(config_file=files)  # type: ignore[no-untyped-call]
            _, active = config.list_kube_config_contexts(config_file=files)  # type: ignore[no-untyped-call]
            self.context = str(active.get("name", ""))
            self.namespace = str((active.get("context") or {}).get("namespace") or "default")
        except config.ConfigException as exc:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                raise ClusterUnreachable(
                    f"no kube context to talk to: {exc}; set KUBECONFIG, or run inside the cluster"
                ) from None
            self.context = "in-cluster"
            with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as f:
                self.namespace = f.read().strip() or "default"
        self._client = kubernetes.client.ApiClient()

    def _call(
        self,
        method: str,
        path: str,
        doing: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        text: bool = False,
    ) -> Any:
        try:
            return call(self._client, method, path, body, query, "application/json" if body else "", text)
        except NoAnswer as exc:
            raise ClusterUnreachable(
                f"{doing}: the API server of kube context {self.context!r} does not answer ({exc.message}); "
                "check the context (kubectl cluster-info)"
            ) from None
        except ApiError as exc:
            raise ApiFailure(exc.status, f"{doing}: {exc.status} {exc.message or exc.reason}") from None

    def resource(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The MiniMaxM3Deployment, or None when it (or its CRD) does not exist."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
        try:
            found: dict[str, Any] = self._call("GET", path, f"reading minimaxm3deployment {namespace}/{name}")
        except ApiFailure as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def create_job(self, job: dict[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        path = f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs"
        doing = f"creating Job {meta['namespace']}/{meta['name']}"
        created: dict[str, Any] = self._call("POST", path, doing, job, [("fieldManager", FIELD_MANAGER)])
        return created

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call(
            "GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}", f"reading Job {namespace}/{name}"
        )
        return found

    def job_pod(self, namespace: str, job_name: str) -> dict[str, Any] | None:
        """The Job's newest pod (backoffLimit 0: there is one), or None before it exists."""
        data = self._call(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            f"listing the pods of Job {namespace}/{job_name}",
            query=[("labelSelector", f"job-name={job_name}")],
        )
        pods: list[dict[str, Any]] = data.get("items") or []
        return max(pods, key=lambda p: str(p["metadata"].get("creationTimestamp", ""))) if pods else None

    def log(self, namespace: str, pod: str, tail_lines: int | None = None) -> str:
        """The bench container's log; for progress (`tail_lines`) an unreadable log is just empty."""
        query = [("container", "bench")] + ([("tailLines", str(tail_lines))] if tail_lines else [])
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log"
        try:
            text: str = self._call("GET", path, f"reading the log of pod {namespace}/{pod}", query=query, text=True)
        except ApiFailure:
            if tail_lines is not None:
                return ""
            raise
        return text

    def create_config_map(self, config_map: dict[str, Any]) -> None:
        meta = config_map["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/configmaps"
        doing = f"creating ConfigMap {meta['namespace']}/{meta['name']}"
        self._call("POST", path, doing, config_map, [("fieldManager", FIELD_MANAGER)])

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete the Job and its pod; a Job already gone is fine."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            self._call("DELETE", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}", f"deleting Job {name}", body)
        except ApiFailure as exc:
            if exc.status != 404:
                raise

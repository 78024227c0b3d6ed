"""The only module that talks to the Kubernetes API (besides kopf itself).

A thin async wrapper over the official client's generic `call_api`: server-side apply, list by label
selector, delete with a uid precondition, status patch, and "is this API group served". Calls run in
a worker thread so the operator's event loop never blocks. Every path it touches is listed in `RBAC`,
which the chart's ClusterRole is generated from and tests hold it to.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import kubernetes

FIELD_MANAGER = "m3fleet-operator"


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def collection(self, namespace: str) -> str:
        base = f"/apis/{self.api_version}" if "/" in self.api_version else f"/api/{self.api_version}"
        return f"{base}/namespaces/{namespace}/{self.plural}"


DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
LEADER_WORKER_SET = Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets")
COMPUTE_DOMAIN = Kind("resource.nvidia.com/v1beta1", "ComputeDomain", "computedomains")
SERVICE = Kind("v1", "Service", "services")
CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")
SECRET = Kind("v1", "Secret", "secrets")
M3D = Kind("m3fleet.dev/v1alpha1", "MiniMaxM3Deployment", "minimaxm3deployments")
POD = Kind("v1", "Pod", "pods")  # read only: the autoscaler measures serving pods' time to ready

# Children found by listing with the owned-label selector. Secrets are never listed (that would read every
# Secret in scope): the one generated Secret is addressed by its deterministic name.
CHILD_KINDS = (CONFIG_MAP, COMPUTE_DOMAIN, DEPLOYMENT, LEADER_WORKER_SET, SERVICE)
BY_KIND = {(k.api_version, k.kind): k for k in (*CHILD_KINDS, SECRET, M3D)}

# Every (group, resource, verbs) the operator uses: this module's calls plus kopf's own watches, event
# posting and peering. charts/ renders its ClusterRole/Role from this list; tests check both directions.
RBAC: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("m3fleet.dev", "minimaxm3deployments", ("get", "list", "watch", "patch")),
    ("m3fleet.dev", "minimaxm3deployments/status", ("get", "patch")),
    ("apps", "deployments", ("get", "list", "watch", "create", "patch", "delete")),
    ("leaderworkerset.x-k8s.io", "leaderworkersets", ("get", "list", "watch", "create", "patch", "delete")),
    ("resource.nvidia.com", "computedomains", ("get", "list", "create", "patch", "delete")),
    ("", "services", ("get", "list", "create", "patch", "delete")),
    ("", "configmaps", ("get", "list", "create", "patch", "delete")),
    # Only the generated TensorRT-LLM SSH key Secret, by its name: created once, deleted when no longer needed.
    # No list or watch: the operator never enumerates (and so never reads) other Secrets.
    ("", "secrets", ("get", "create", "delete")),
    ("", "events", ("create",)),
    ("", "pods", ("list",)),
    # kopf's scanning: notices CRDs (e.g. LeaderWorkerSet) installed after the operator started.
    ("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),
    ("", "namespaces", ("list", "watch")),
    ("kopf.dev", "kopfpeerings", ("get", "list", "watch", "patch")),
    ("kopf.dev", "clusterkopfpeerings", ("get", "list", "watch", "patch")),
)


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


def _error(exc: kubernetes.client.ApiException) -> ApiError:
    message = exc.reason or ""
    try:
        body = json.loads(exc.body or "{}")
        message = body.get("message", message)
    except (ValueError, TypeError):
        pass
    headers = exc.headers or {}
    retry = headers.get("Retry-After") if hasattr(headers, "get") else None
    return ApiError(int(exc.status or 0), str(exc.reason or ""), str(message), float(retry) if retry else None)


class KubeApi:
    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self._client = client

    def _call_sync(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None, content: str = ""
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content:
            headers["Content-Type"] = content
        client = self._client
        try:
            method, url, headers, payload, post = client.param_serialize(
                method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            response = client.call_api(method, url, header_params=headers, body=payload, post_params=post)
            response.read()  # type: ignore[no-untyped-call]
        except kubernetes.client.ApiException as exc:
            raise _error(exc) from None
        if response.status >= 400:
            raise _error(kubernetes.client.ApiException(http_resp=response))
        return json.loads(response.data) if response.data else {}

    async def _call(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._call_sync, *args, **kwargs)

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of our full intent, forcing ownership of the fields we set."""
        kind = BY_KIND[(obj["apiVersion"], obj["kind"])]
        path = f"{kind.collection(obj['metadata']['namespace'])}/{obj['metadata']['name']}"
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        result: dict[str, Any] = await self._call("PATCH", path, obj, query, "application/apply-patch+yaml")
        return result

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = BY_KIND[(obj["apiVersion"], obj["kind"])]
        result: dict[str, Any] = await self._call(
            "POST",
            kind.collection(obj["metadata"]["namespace"]),
            obj,
            [("fieldManager", FIELD_MANAGER)],
            "application/json",
        )
        return result

    async def list(self, kind: Kind, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        data = await self._call("GET", kind.collection(namespace), query=[("labelSelector", label_selector)])
        items: list[dict[str, Any]] = data.get("items") or []
        for item in items:  # list items carry no apiVersion/kind
            item.setdefault("apiVersion", kind.api_version)
            item.setdefault("kind", kind.kind)
        return items

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call("GET", f"{kind.collection(namespace)}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def delete(self, kind: Kind, namespace: str, name: str, uid: str) -> None:
        """Delete exactly the object we saw (uid precondition); gone already is fine."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid},
            "propagationPolicy": "Background",
        }
        try:
            await self._call("DELETE", f"{kind.collection(namespace)}/{name}", body, None, "application/json")
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        path = f"{M3D.collection(namespace)}/{name}/status"
        await self._call("PATCH", path, {"status": status}, None, "application/merge-patch+json")

    async def served(self, kind: Kind) -> bool:
        """Is this custom API installed (its CRD present and served)?"""
        try:
            data = await self._call("GET", f"/apis/{kind.api_version}")
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == kind.plural for r in data.get("resources") or [])

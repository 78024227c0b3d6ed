"""The only module that talks to the Kubernetes API (besides kopf itself).

A thin async wrapper over the official client's generic `call_api`: server-side apply (for real or as
a dry run), list by label selector, delete with a uid precondition, status patch, "is this API group
served", and following one object through a watch. Calls run in worker threads so the operator's event
loop never blocks, and every call has a timeout. Every path it touches is listed in
`m3fleet.permissions.RBAC`, which the chart's ClusterRole is generated from and tests hold it to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3

FIELD_MANAGER = "m3fleet-operator"
CONNECT_TIMEOUT = 10.0  # seconds to establish a connection
REQUEST_TIMEOUT = 60.0  # seconds a response may stall
WATCH_SECONDS = 300  # the server ends each watch after this long; the client then resumes it
RETRY_SECONDS = (1.0, 60.0)  # a broken watch is retried after 1 s, doubling up to 60 s

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def collection(self, namespace: str | None) -> str:
        """The collection's path: in `namespace`, or across all namespaces (None) for a namespaced kind."""
        base = f"/apis/{self.api_version}" if "/" in self.api_version else f"/api/{self.api_version}"
        in_one = self.namespaced and namespace is not None
        return f"{base}/namespaces/{namespace}/{self.plural}" if in_one else f"{base}/{self.plural}"


DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
LEADER_WORKER_SET = Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets")
COMPUTE_DOMAIN = Kind("resource.nvidia.com/v1beta1", "ComputeDomain", "computedomains")
SERVICE = Kind("v1", "Service", "services")
CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")
NETWORK_POLICY = Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")
POD_DISRUPTION_BUDGET = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
SECRET = Kind("v1", "Secret", "secrets")
# A disaggregated fleet (spec.disaggregation): the identity Dynamo's Kubernetes discovery runs as, or the
# DynamoGraphDeployment the Dynamo operator runs.
SERVICE_ACCOUNT = Kind("v1", "ServiceAccount", "serviceaccounts")
ROLE = Kind("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLE_BINDING = Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
DYNAMO_GRAPH_DEPLOYMENT = Kind("nvidia.com/v1beta1", "DynamoGraphDeployment", "dynamographdeployments")
M3D = Kind("m3fleet.dev/v1alpha1", "MiniMaxM3Deployment", "minimaxm3deployments")
# Read only: why pods wait for a node (status), and serving pods' time to ready (the autoscaler).
POD = Kind("v1", "Pod", "pods")
# Read only: the kubelet's `Pulled` events, for the image phase of a new replica's time to ready.
EVENT = Kind("v1", "Event", "events")
# The model cache (MiniMaxM3ModelCache): its staging/cleanup Jobs and pre-pull DaemonSet, and the nodes it labels.
CACHE = Kind("m3fleet.dev/v1alpha1", "MiniMaxM3ModelCache", "minimaxm3modelcaches")
JOB = Kind("batch/v1", "Job", "jobs")
DAEMON_SET = Kind("apps/v1", "DaemonSet", "daemonsets")
NODE = Kind("v1", "Node", "nodes", namespaced=False)
PEERING = Kind("kopf.dev/v1", "KopfPeering", "kopfpeerings")
CLUSTER_PEERING = Kind("kopf.dev/v1", "ClusterKopfPeering", "clusterkopfpeerings", namespaced=False)
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases")  # the active peer's write lease (peering.py)

# Children found by listing with the owned-label selector (a child missing from that listing is looked up by
# name before it is applied: an object of that name we do not control is never applied over), and watched
# (kopf, filtered by the managed-by label) so that a change to any of them reconciles its owner. Secrets are
# never listed or watched (that would read every Secret in scope): they are addressed by name.
CHILD_KINDS = (
    CONFIG_MAP,
    COMPUTE_DOMAIN,
    DEPLOYMENT,
    DYNAMO_GRAPH_DEPLOYMENT,
    LEADER_WORKER_SET,
    NETWORK_POLICY,
    POD_DISRUPTION_BUDGET,
    ROLE,
    ROLE_BINDING,
    SERVICE,
    SERVICE_ACCOUNT,
)
BY_KIND = {(k.api_version, k.kind): k for k in (*CHILD_KINDS, SECRET, M3D, CACHE, JOB, DAEMON_SET, LEASE, EVENT)}


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
    except (ValueError, TypeError, AttributeError):
        pass
    headers = exc.headers or {}
    retry = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        retry_after = float(retry) if retry else None
    except ValueError:
        retry_after = None
    return ApiError(int(exc.status or 0), str(exc.reason or ""), str(message), retry_after)


# No HTTP answer: refused, reset, timed out (urllib3's errors), or a malformed URL or answer (ValueError).
NETWORK_ERRORS = (OSError, ValueError, urllib3.exceptions.HTTPError)


class NoAnswer(ApiError):
    """A request that got no HTTP answer at all (refused, reset, timed out): the CLI says the cluster is unreachable."""


def _transport_error(exc: Exception) -> ApiError:
    """A request that got no HTTP answer (refused, reset, timed out): retried like a 503."""
    return NoAnswer(503, "Unavailable", f"{type(exc).__name__}: {exc}")


def call(
    client: kubernetes.client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    query: list[tuple[str, str]] | None = None,
    content: str = "",
    text: bool = False,
) -> Any:
    """One REST call, blocking, outside the operator (m3fleet bench): the decoded JSON (or, with `text`, the
    body as text). The same request, timeouts and errors as the operator's calls. Raises ApiError."""
    return KubeApi(client)._call_sync(method, path, body, query, content, text=text)


class KubeApi:
    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self._client = client

    def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content: str = "",
        read_timeout: float = REQUEST_TIMEOUT,
        *,
        accept: str = "application/json",
    ) -> Any:
        """One request; returns the client's response object, unread (the caller reads or streams it)."""
        headers = {"Accept": accept}
        if content:
            headers["Content-Type"] = content
        client = self._client
        try:
            method, url, headers, payload, post = client.param_serialize(
                method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            response = client.call_api(
                method,
                url,
                header_params=headers,
                body=payload,
                post_params=post,
                _request_timeout=(CONNECT_TIMEOUT, read_timeout),
            )
        except kubernetes.client.ApiException as exc:
            raise _error(exc) from None
        except NETWORK_ERRORS as exc:
            raise _transport_error(exc) from None
        if response.status >= 400:
            response.read()  # type: ignore[no-untyped-call]
            raise _error(kubernetes.client.ApiException(http_resp=response))
        return response

    def _call_sync(self, *args: Any, text: bool = False, accept: str = "", **kwargs: Any) -> Any:
        response = self._send(*args, accept=accept or ("*/*" if text else "application/json"), **kwargs)
        try:
            response.read()
        except NETWORK_ERRORS as exc:
            raise _transport_error(exc) from None
        data: bytes = response.data or b""
        if text:
            return data.decode("utf-8", errors="replace")
        return json.loads(data) if data else {}

    async def _call(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._call_sync, *args, **kwargs)

    async def apply(self, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply of our full intent, forcing ownership of the fields we set. As a dry run, the
        answer is what the object would be (defaults, admission and other managers' fields included)."""
        kind = BY_KIND[(obj["apiVersion"], obj["kind"])]
        path = f"{kind.collection(obj['metadata']['namespace'])}/{obj['metadata']['name']}"
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
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

    async def list(
        self, kind: Kind, namespace: str | None, label_selector: str = "", field_selector: str = ""
    ) -> list[dict[str, Any]]:
        query = [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v]
        data = await self._call("GET", kind.collection(namespace), query=query)
        items: list[dict[str, Any]] = data.get("items") or []
        for item in items:  # list items carry no apiVersion/kind
            item.setdefault("apiVersion", kind.api_version)
            item.setdefault("kind", kind.kind)
        return items

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT of the whole object; its metadata.resourceVersion makes it conditional (409 if it changed)."""
        kind = BY_KIND[(obj["apiVersion"], obj["kind"])]
        path = f"{kind.collection(obj['metadata']['namespace'])}/{obj['metadata']['name']}"
        query = [("fieldManager", FIELD_MANAGER)]
        result: dict[str, Any] = await self._call("PUT", path, obj, query, "application/json")
        return result

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call("GET", f"{kind.collection(namespace)}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def exists(self, kind: Kind, namespace: str, name: str) -> bool:
        """Whether an object exists, asked for its metadata only (PartialObjectMetadata): the answer never
        carries its content (used for Secrets the operator must not read)."""
        accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
        try:
            await self._call("GET", f"{kind.collection(namespace)}/{name}", accept=accept)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def merge_patch(
        self, kind: Kind, namespace: str | None, name: str, patch: dict[str, Any], subresource: str = ""
    ) -> dict[str, Any] | None:
        """A JSON merge patch (node labels, a finalizer, a status); the object as stored, None when it is gone."""
        path = f"{kind.collection(namespace)}/{name}" + (f"/{subresource}" if subresource else "")
        try:
            result: dict[str, Any] = await self._call("PATCH", path, patch, None, "application/merge-patch+json")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def delete(self, kind: Kind, namespace: str, name: str, uid: str, *, propagation: str = "Background") -> None:
        """Delete exactly the object we saw (uid precondition); gone already is fine. `propagation` Foreground keeps
        the object (with a deletionTimestamp) until its dependents are gone."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid},
            "propagationPolicy": propagation,
        }
        try:
            await self._call("DELETE", f"{kind.collection(namespace)}/{name}", body, None, "application/json")
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """Merge `status` into the resource's status; the resource as stored, or None when it is gone."""
        path = f"{M3D.collection(namespace)}/{name}/status"
        try:
            result: dict[str, Any] = await self._call(
                "PATCH", path, {"status": status}, None, "application/merge-patch+json"
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def served(self, kind: Kind) -> bool:
        """Is this custom API installed (its CRD present and served)?"""
        try:
            data = await self._call("GET", f"/apis/{kind.api_version}")
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == kind.plural for r in data.get("resources") or [])

    async def follow(self, kind: Kind, namespace: str | None, name: str) -> AsyncIterator[dict[str, Any] | None]:
        """One object as it changes, forever: its state now (None while it does not exist), then every
        change. Lists, then watches from the list's resourceVersion; re-lists when the watch expires
        (410) and retries failures with a backoff. Its own stream, independent of kopf's watches."""
        collection = kind.collection(namespace)
        selector = ("fieldSelector", f"metadata.name={name}")
        delay = RETRY_SECONDS[0]
        while True:
            try:
                listing = await self._call("GET", collection, query=[selector])
                items = listing.get("items") or []
                yield items[0] if items else None
                version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
                while version:  # each watch ends after WATCH_SECONDS; resume where it ended
                    query = [selector, ("watch", "true"), ("resourceVersion", version)]
                    query += [("allowWatchBookmarks", "true"), ("timeoutSeconds", str(WATCH_SECONDS))]
                    async with contextlib.aclosing(self._stream(collection, query)) as stream:
                        async for event in stream:
                            obj = event.get("object") or {}
                            if event.get("type") == "ERROR" and obj.get("code") == 410:
                                version = ""  # expired: list again
                                break
                            if event.get("type") == "ERROR":
                                code, reason, message = obj.get("code") or 500, obj.get("reason"), obj.get("message")
                                raise ApiError(int(code), str(reason), str(message))
                            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                            if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                                yield None if event["type"] == "DELETED" else obj
                    delay = RETRY_SECONDS[0]
            except ApiError as exc:
                log.warning("Watching %s %s/%s failed (retrying in %.0f s): %s", kind.kind, namespace, name, delay, exc)
                if exc.status == 404:
                    yield None  # the API itself is not served: there is no such object
                await asyncio.sleep(delay)
                delay = min(RETRY_SECONDS[1], delay * 2)

    async def _stream(self, path: str, query: Sequence[tuple[str, str]]) -> AsyncGenerator[dict[str, Any], None]:
        """The events of one watch request. Read in a daemon thread of its own (a watch blocks for minutes,
        which must hold neither the shared worker threads nor the process's exit)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict[str, Any] | Exception | None] = asyncio.Queue()
        opened: dict[str, Any] = {}  # the response, once the thread has it
        stopped = threading.Event()

        def post(item: dict[str, Any] | Exception | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens any more
                loop.call_soon_threadsafe(events.put_nowait, item)

        def pump() -> None:
            try:
                response = self._send("GET", path, query=list(query), read_timeout=WATCH_SECONDS + 30.0)
                opened["response"] = response
                for line in response.response:
                    if stopped.is_set():
                        return
                    if line.strip():
                        post(json.loads(line))
                post(None)
            except ApiError as exc:
                post(exc)
            except NETWORK_ERRORS as exc:  # a reset, a read timeout, a shutdown from below, bad JSON
                post(_transport_error(exc))

        threading.Thread(target=pump, name=f"m3fleet watch {path}", daemon=True).start()
        try:
            while (item := await events.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            stopped.set()
            if "response" in opened:  # unblock the thread's read when we stop listening early
                with contextlib.suppress(Exception):
                    opened["response"].response.shutdown()
                    opened["response"].response.release_conn()


async def still_exists(api: KubeApi, body: Mapping[str, Any]) -> bool:
    """Whether the resource `body` is a version of still exists (same uid). A deletion while the watch was down
    is never delivered (a re-list does not report what is gone): asked before acting on something gone."""
    meta = body["metadata"]
    found = await api.get(M3D, meta["namespace"], meta["name"])
    return found is not None and found["metadata"].get("uid") == meta["uid"]

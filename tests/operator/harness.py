"""The harness for running the real m3fleet operator (kopf, in-process) against the apiserver emulator.

`Cluster` is the test's side of the world: it drives the API like kubectl and the built-in
controllers would (create, patch, scale, delete, report a workload's readiness) and reads the stored
objects back. `Cluster.operator()` runs a fresh operator (new registry, new Reconciler) for as long as
its block runs, so a test can stop and restart it. `rbac_violations` holds the operator's requests to
`m3fleet.controller.kube.RBAC`. Shared by the tests in this directory and by tests/bench.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import kmock as kmock_lib
import kopf
import kubernetes
import yaml

from m3fleet.controller import kube
from m3fleet.controller.autoscaler import AdapterFactory, prometheus_adapter
from m3fleet.controller.handlers import register
from m3fleet.controller.kube import KubeApi
from m3fleet.controller.reconcile import Reconciler
from m3fleet.render.labels import NAME
from tests.conftest import SAMPLES_DIR
from tests.kube.conftest_helpers import eventually, run_operator
from tests.kube.emulator import ApiServerEmulator

NS = "llm"
M3D = "m3fleet.dev/v1alpha1/minimaxm3deployments"
LWS = "leaderworkerset.x-k8s.io/v1/leaderworkersets"
COMPUTE_DOMAINS = "resource.nvidia.com/v1beta1/computedomains"
DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
CONFIGMAPS = "v1/configmaps"
SECRETS = "v1/secrets"
PVCS = "v1/persistentvolumeclaims"
RESOURCE_OF_KIND = {
    "ConfigMap": CONFIGMAPS,
    "ComputeDomain": COMPUTE_DOMAINS,
    "Deployment": DEPLOYMENTS,
    "LeaderWorkerSet": LWS,
    "Service": SERVICES,
    "Secret": SECRETS,
}

VLLM = "vllm-h200-tp8"  # one node: ConfigMap-less Deployment + Service
TRTLLM = "trtllm-gb200-2x4-tep"  # two GB200 nodes: ConfigMap, ComputeDomain, LeaderWorkerSet, Service, SSH Secret
ONE_MILLION = 1048576  # maxModelLen that no longer fits one H200 node: the planner picks 2 nodes

DRIVER_AGENT = "kmock/"  # the emulator's own client (the test), as opposed to kopf and the kubernetes client
VOLATILE = frozenset({"resourceVersion", "uid", "creationTimestamp", "lastTransitionTime", "time"})


# ---------------------------------------------------------------------------------------------
# The cluster: declarations, samples, a deterministic clock
# ---------------------------------------------------------------------------------------------


def declare_cluster(kmock: ApiServerEmulator, *, lws: bool = True, compute_domains: bool = True) -> None:
    kmock.declare_builtin()
    kmock.declare(PVCS, "PersistentVolumeClaim", subresources=("status",), shortnames=("pvc",))
    kmock.declare(M3D, "MiniMaxM3Deployment", subresources=("status", "scale"), shortnames=("m3d",))
    if lws:
        kmock.declare(LWS, "LeaderWorkerSet", subresources=("status", "scale"))
    if compute_domains:
        kmock.declare(COMPUTE_DOMAINS, "ComputeDomain", subresources=("status",))
    add_namespace(kmock, NS)


def add_namespace(kmock: ApiServerEmulator, name: str) -> None:
    kmock.seed("v1/namespaces", {"metadata": {"name": name}})  # kopf with namespace scanning looks for it


def sample(name: str, namespace: str = NS) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES_DIR / f"{name}.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    return doc


def api_client(kmock: ApiServerEmulator) -> kubernetes.client.ApiClient:
    """The operator's own API client (the one `m3fleet run` builds from a kubeconfig), aimed at the emulator."""
    return kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kmock.url).rstrip("/")))


class TickingClock:
    """The Reconciler's clock: one second later on every call, so lastTransitionTime shows every flip."""

    def __init__(self) -> None:
        self._ticks = itertools.count()
        self._start = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> str:
        return (self._start + timedelta(seconds=next(self._ticks))).strftime("%Y-%m-%dT%H:%M:%SZ")


def scrubbed(value: Any) -> Any:
    """A deep copy without what differs between equivalent runs: resourceVersions, uids, timestamps."""
    if isinstance(value, dict):
        return {k: scrubbed(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [scrubbed(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# RBAC: every request the operator made must be allowed by kube.RBAC
# ---------------------------------------------------------------------------------------------

ALLOWED = {(group, resource, verb) for group, resource, verbs in kube.RBAC for verb in verbs}


def rbac_rule(method: str, path: str, params: dict[str, str]) -> tuple[str, str, str] | None:
    """(apiGroup, resource[/subresource], verb) of one request; None for discovery (always allowed)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return None  # /version, /api, /api/v1, /apis, /apis/<g>, /apis/<g>/<v>
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource (but /api/v1/namespaces/<ns> is the Namespace itself)
    resource = "/".join([rest[0], *rest[2:3]])
    named = len(rest) > 1
    if method == "GET":
        verb = "watch" if params.get("watch") in ("true", "1") else "get" if named else "list"
    else:
        verbs = {
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection",
        }
        verb = verbs.get(method, method.lower())
    return group, resource, verb


def operator_requests(requests: Iterable[kmock_lib.Request]) -> list[kmock_lib.Request]:
    """Requests made by kopf and the operator's client, not by the test (the emulator's own client).
    Pass the emulator for its whole request log."""
    return [r for r in requests if not str(r.headers.get("User-Agent", "")).startswith(DRIVER_AGENT)]


def rbac_violations(requests: Iterable[kmock_lib.Request]) -> list[str]:
    found: dict[tuple[str, str, str], str] = {}
    for request in requests:
        method = str(request.method.value)
        rule = rbac_rule(method, request.url.path, dict(request.params))
        if rule is not None and rule not in ALLOWED:
            found.setdefault(rule, f"{method} {request.url.path_qs}")
    return [f"{rule} e.g. {example}" for rule, example in sorted(found.items())]


def assert_rbac(emulator: ApiServerEmulator) -> None:
    violations = rbac_violations(operator_requests(emulator))
    assert not violations, "requests outside kube.RBAC:\n" + "\n".join(violations)


# ---------------------------------------------------------------------------------------------
# The test's side of the API
# ---------------------------------------------------------------------------------------------


class Cluster:
    """Drive the emulator like kubectl and the built-in controllers; read what is stored."""

    def __init__(self, kmock: ApiServerEmulator, namespace: str = NS) -> None:
        self.kmock = kmock
        self.namespace = namespace
        self.clock = TickingClock()

    # -- reads ---------------------------------------------------------------------------------

    def get(self, resource: str, name: str) -> dict[str, Any] | None:
        return self.kmock.get_object(resource, self.namespace, name)

    def m3d(self, name: str) -> dict[str, Any]:
        body = self.get(M3D, name)
        assert body is not None, f"{name} does not exist"
        return body

    def status(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.m3d(name).get("status") or {}
        return status

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = [c for c in self.status(name).get("conditions") or [] if c["type"] == type_]
        assert found, f"no {type_} condition on {name}"
        return found[0]

    def children(self, name: str) -> dict[str, dict[str, Any]]:
        """Every stored object labelled as a child of `name`, by "Kind/name" (exact copies)."""
        found: dict[str, dict[str, Any]] = {}
        for (resource, namespace, obj_name), obj in self.kmock.objects.items():
            if obj.deleted or namespace != self.namespace:
                continue
            body = self.kmock.get_object(resource, namespace, obj_name)
            if body is not None and (body["metadata"].get("labels") or {}).get(NAME) == name:
                found[f"{body['kind']}/{obj_name}"] = body
        return found

    def events(self, name: str) -> list[tuple[str, str]]:
        """(reason, message) of the Events posted about the resource `name`, oldest first."""
        found = []
        for (resource, namespace, obj_name), obj in self.kmock.objects.items():
            if resource == kmock_lib.resource("v1/events") and namespace == self.namespace and not obj.deleted:
                event = self.kmock.get_object(resource, namespace, obj_name)
                if event is not None and event["involvedObject"]["name"] == name:
                    found.append((int(event["metadata"]["resourceVersion"]), event["reason"], event["message"]))
        return [(reason, message) for _, reason, message in sorted(found)]

    def history(self, resource: str, name: str) -> list[dict[str, Any] | None]:
        """Every stored version of an object, oldest first (None where it was deleted)."""
        versions = self.kmock.objects[kmock_lib.resource(resource), self.namespace, name].history
        return [None if v is None else copy.deepcopy(dict(v.raw)) for v in versions]

    def end_state(self, name: str) -> dict[str, Any]:
        """What two equivalent runs must agree on: the children and the status (volatile fields aside)."""
        children = scrubbed(self.children(name))
        for child in children.values():
            if child["kind"] == "Secret":  # generated keys differ from run to run; their names do not
                child["data"] = dict.fromkeys(child.get("data") or {}, "<generated>")
        m3d = self.m3d(name)
        return {
            "children": children,
            "status": scrubbed(m3d.get("status")),
            "finalizers": m3d["metadata"].get("finalizers"),
        }

    def converged(self, name: str) -> bool:
        """The current generation is reconciled and nothing blocks it."""
        m3d = self.get(M3D, name)
        if m3d is None:
            return False
        status = m3d.get("status") or {}
        degraded = [c for c in status.get("conditions") or [] if c["type"] == "Degraded"]
        return bool(
            status.get("observedGeneration") == m3d["metadata"]["generation"] and degraded[0]["status"] == "False"
        )

    async def settled(self, quiet: float = 0.3, timeout: float = 10) -> None:
        """Wait until nothing at all is written for `quiet` seconds (the operator is at rest)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            before = self.kmock.resource_version
            await asyncio.sleep(quiet)
            if self.kmock.resource_version == before:
                return
        raise AssertionError(f"still writing after {timeout}s")

    # -- writes (as kubectl and the built-in controllers) -----------------------------------------

    def _path(self, resource: str, name: str | None = None, subresource: str | None = None) -> str:
        group_version, _, plural = resource.rpartition("/")
        base = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        return "/".join(p for p in (f"{base}/namespaces/{self.namespace}/{plural}", name, subresource) if p)

    async def _send(self, method: str, path: str, body: Any = None, expect: int = 200) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        resp = await self.kmock.request(method, path, json=body, headers=headers)
        text = await resp.text()
        assert resp.status == expect, f"{method} {path}: {resp.status} {text}"
        data: dict[str, Any] = await resp.json()
        return data

    async def create(self, doc: dict[str, Any]) -> str:
        await self._send("POST", self._path(M3D), doc, expect=201)
        name: str = doc["metadata"]["name"]
        return name

    async def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        await self._send("PATCH", self._path(M3D, name), {"spec": spec})

    async def scale(self, name: str, replicas: int) -> dict[str, Any]:
        """`kubectl scale --replicas=N`: a merge patch of the autoscaling/v1 Scale subresource."""
        return await self._send("PATCH", self._path(M3D, name, "scale"), {"spec": {"replicas": replicas}})

    async def get_scale(self, name: str) -> dict[str, Any]:
        return await self._send("GET", self._path(M3D, name, "scale"))

    async def delete(self, name: str, resource: str = M3D) -> None:
        await self._send("DELETE", self._path(resource, name))

    async def report_workload(
        self,
        resource: str,
        name: str,
        *,
        ready: int | None = None,
        updated: int | None = None,
        observed: int | None = None,
    ) -> None:
        """Play the Deployment/LWS controller: by default it observed the current generation, all pods are up."""
        child = self.get(resource, name)
        assert child is not None, f"{resource} {name} does not exist"
        replicas = child["spec"]["replicas"]
        status = {
            "observedGeneration": child["metadata"]["generation"] if observed is None else observed,
            "replicas": replicas,
            "updatedReplicas": replicas if updated is None else updated,
            "readyReplicas": replicas if ready is None else ready,
        }
        await self._send("PATCH", self._path(resource, name, "status"), {"status": status})

    # -- the operator -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def operator(
        self,
        *,
        resync: float = 600.0,
        settings_hook: Callable[[kopf.OperatorSettings], None] | None = None,
        namespaces: Collection[str] = (),
        adapters: AdapterFactory = prometheus_adapter,
    ) -> AsyncIterator[Reconciler]:
        """A fresh operator (registry, Reconciler, API client) running for the block's duration, serving
        this cluster's namespace (or `namespaces`)."""

        def tuned(settings: kopf.OperatorSettings) -> None:
            # On stop, kopf gives a worker that waits out a handler retry 2 s; a stop is a crash here anyway.
            settings.queueing.exit_timeout = 0.1
            if settings_hook is not None:
                settings_hook(settings)

        registry = kopf.OperatorRegistry()
        client = api_client(self.kmock)
        reconciler = register(registry, KubeApi(client), resync_seconds=resync, adapters=adapters)
        reconciler.clock = self.clock
        try:
            served = list(namespaces) or [self.namespace]
            async with run_operator(self.kmock, registry, namespaces=served, settings_hook=tuned):
                yield reconciler
        finally:
            client.close()  # type: ignore[no-untyped-call]


# ---------------------------------------------------------------------------------------------
# Scenarios, and their fault-free end states (computed once, on a fresh emulator of their own)
# ---------------------------------------------------------------------------------------------


async def create_trtllm(cluster: Cluster) -> str:
    name = await cluster.create(sample(TRTLLM))
    await eventually(lambda: cluster.converged(name))
    return name


async def vllm_to_lws(cluster: Cluster) -> str:
    """A one-node Deployment, then maxModelLen 1M: a LeaderWorkerSet is applied, the Deployment pruned."""
    name = await cluster.create(sample(VLLM))
    await eventually(lambda: cluster.converged(name))
    await cluster.patch_spec(name, {"context": {"maxModelLen": ONE_MILLION}})
    await eventually(lambda: cluster.converged(name) and cluster.m3d(name)["metadata"]["generation"] == 2)
    return name


Scenario = Callable[[Cluster], Awaitable[str]]
SCENARIOS: dict[str, Scenario] = {"trtllm": create_trtllm, "vllm-to-lws": vllm_to_lws}
_baselines: dict[str, dict[str, Any]] = {}


@contextlib.asynccontextmanager
async def fresh_cluster(emulator_cls: type[ApiServerEmulator] = ApiServerEmulator) -> AsyncIterator[Cluster]:
    """A second, independent emulator on the current loop (the `kmock` fixture gives one per test)."""
    async with emulator_cls() as emulator, kmock_lib.Server(emulator):
        declare_cluster(emulator)
        yield Cluster(emulator)
        assert_rbac(emulator)


async def baseline(scenario: str) -> dict[str, Any]:
    """The fault-free end state of a scenario (the same objects are created in the same order as in the
    test's own emulator, so their uids agree)."""
    if scenario not in _baselines:
        async with fresh_cluster() as cluster, cluster.operator():
            name = await SCENARIOS[scenario](cluster)
            await cluster.settled()
            _baselines[scenario] = copy.deepcopy(cluster.end_state(name))
    return _baselines[scenario]

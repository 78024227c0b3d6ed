"""The harness for running the m3fleet operator, as users run it, against the apiserver emulator.

The operator is the `m3fleet run` console script in a process of its own, configured only through its
flags, its environment and a kubeconfig that points at the emulator (an aiohttp server in the test's
event loop): nothing is injected into it. `Cluster` is the test's side of the world: it drives the API
like kubectl and the built-in controllers would (create, patch, scale, delete, report a workload's
readiness) and reads the stored objects back. `rbac_violations` holds the operator's requests to
`m3fleet.permissions.RBAC`. Shared by the tests in this directory and by tests/bench.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kmock as kmock_lib
import yaml
from prometheus_client.parser import text_string_to_metric_families

from m3fleet import permissions
from m3fleet.render.labels import NAME
from tests.kube.emulator import ApiServerEmulator
from tests.kube.waiting import eventually
from tests.support.ports import free_port
from tests.support.samples import SAMPLES_DIR

NS = "llm"
M3D = "m3fleet.dev/v1alpha1/minimaxm3deployments"
LWS = "leaderworkerset.x-k8s.io/v1/leaderworkersets"
COMPUTE_DOMAINS = "resource.nvidia.com/v1beta1/computedomains"
DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
CONFIGMAPS = "v1/configmaps"
NETWORK_POLICIES = "networking.k8s.io/v1/networkpolicies"
DISRUPTION_BUDGETS = "policy/v1/poddisruptionbudgets"
SECRETS = "v1/secrets"
PVCS = "v1/persistentvolumeclaims"
PEERINGS = "kopf.dev/v1/kopfpeerings"
RESOURCE_OF_KIND = {
    "ConfigMap": CONFIGMAPS,
    "ComputeDomain": COMPUTE_DOMAINS,
    "Deployment": DEPLOYMENTS,
    "LeaderWorkerSet": LWS,
    "NetworkPolicy": NETWORK_POLICIES,
    "PodDisruptionBudget": DISRUPTION_BUDGETS,
    "Service": SERVICES,
    "Secret": SECRETS,
}
# What the operator watches.
WATCHED = (M3D, DEPLOYMENTS, SERVICES, CONFIGMAPS, LWS, COMPUTE_DOMAINS, NETWORK_POLICIES, DISRUPTION_BUDGETS)

VLLM = "vllm-h200-tp8"  # one node: ConfigMap-less Deployment + Service
TRTLLM = "trtllm-gb200-2x4-tep"  # two GB200 nodes: ConfigMap, ComputeDomain, LeaderWorkerSet, Service, SSH Secret
# More full-length sequences than one H200 node's KV cache holds: the planner picks 2 nodes (TP8 x PP2).
# (1M tokens of bf16 vLLM no longer plans on NVIDIA: its M3 model there ignores YaRN.)
TWO_NODES = {"context": {"minSequencesAtMaxLen": 8}}

DRIVER_AGENT = "kmock/"  # the emulator's own client (the test), as opposed to kopf and the kubernetes client
VOLATILE = frozenset({"resourceVersion", "uid", "creationTimestamp", "lastTransitionTime", "time"})
M3FLEET = shutil.which("m3fleet", path=str(Path(sys.executable).parent)) or "m3fleet"  # the venv's console script


# ---------------------------------------------------------------------------------------------
# The cluster: declarations, samples
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
    kmock.seed("v1/namespaces", {"metadata": {"name": name}})


def sample(name: str, namespace: str = NS) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES_DIR / f"{name}.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    return doc


def scrubbed(value: Any) -> Any:
    """A deep copy without what differs between equivalent runs: resourceVersions, uids, timestamps."""
    if isinstance(value, dict):
        return {k: scrubbed(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [scrubbed(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# RBAC: every request the operator made must be allowed by permissions.RBAC
# ---------------------------------------------------------------------------------------------

ALLOWED = {(grant.group, grant.resource, verb) for grant in permissions.RBAC for verb in grant.verbs}
CLUSTER_SCOPED = frozenset({"namespaces", "customresourcedefinitions", "clusterkopfpeerings"})


def rbac_rule(method: str, path: str, params: Mapping[str, str]) -> tuple[str, str, str] | None:
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
    assert not violations, "requests outside permissions.RBAC:\n" + "\n".join(violations)


def is_write(request: kmock_lib.Request) -> bool:
    """A request that may change something (dry runs do not)."""
    return str(request.method.value) in ("POST", "PUT", "PATCH", "DELETE") and not request.params.get("dryRun")


# ---------------------------------------------------------------------------------------------
# The operator: `m3fleet run` in a process of its own
# ---------------------------------------------------------------------------------------------


def kubeconfig(server: str) -> dict[str, Any]:
    """A kubeconfig as users have one: a cluster, a user, a context (the emulator needs no credentials)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester", "namespace": NS}}],
        "current-context": "emulator",
    }


@dataclass
class OperatorProcess:
    """One running `m3fleet run`: its process, its log, its metrics endpoint, the address it talks to."""

    process: asyncio.subprocess.Process
    log_path: Path
    metrics_port: int
    host: str  # "127.0.0.1:<port>": the emulator endpoint in its kubeconfig (the requests' Host header)
    args: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tracebacks(self) -> list[str]:
        """Tracebacks in the log: a bug surfaced (bad input or an API failure never logs one)."""
        lines = self.log().splitlines()
        return [lines[max(0, i - 1)] for i, line in enumerate(lines) if line.startswith("Traceback")]

    def made(self, request: kmock_lib.Request) -> bool:
        """Sent by this operator: to its own front server, and not by the test's kmock client (which may
        reach the emulator through the same front)."""
        agent = str(request.headers.get("User-Agent", ""))
        return str(request.headers.get("Host", "")) == self.host and not agent.startswith("kmock/")

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The operator's /metrics: (sample name, sorted labels) -> value."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as response,
        ):
            text = await response.text()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    async def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples that carry `labels` (0 when absent)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in (await self.metrics()).items() if n == name and wanted <= set(ls))

    async def stop(self, *, kill: bool = False, timeout: float = 15) -> None:
        """SIGTERM (a graceful stop, as the kubelet does) or SIGKILL (a crash); then wait for the exit."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
                raise AssertionError(f"the operator did not stop within {timeout} s:\n{self.log()[-3000:]}") from None


@contextlib.asynccontextmanager
async def running_operator(
    emulator: ApiServerEmulator,
    directory: Path,
    *,
    url: str | None = None,
    namespace: str | None = NS,
    standalone: bool = True,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 30,
) -> AsyncIterator[OperatorProcess]:
    """`m3fleet run -n <namespace> --standalone` (or -A, or with peering) against the emulator at `url`
    (by default the one its `url` gives), from the moment its watches are open (a replica that starts as a
    standby never opens them: start it first) to a graceful stop at the end of the block."""
    server = (url or str(emulator.url)).rstrip("/")
    host = server.split("://", 1)[1]
    directory.mkdir(parents=True, exist_ok=True)
    index = len(list(directory.glob("operator-*.log")))
    config = directory / f"kubeconfig-{index}.yaml"
    config.write_text(yaml.safe_dump(kubeconfig(server)))
    log_path = directory / f"operator-{index}.log"
    port = free_port()
    args = ["run", *(["-A"] if namespace is None else ["-n", namespace])]
    args += [*(["--standalone"] if standalone else []), "--liveness-port", "0", "--metrics-port", str(port)]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}  # never in-cluster
    environment.update({"KUBECONFIG": str(config), "PYTHONUNBUFFERED": "1", **(env or {})})
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            M3FLEET,
            *args,
            env=environment,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
        )
    operator = OperatorProcess(process, log_path, port, host, args)
    try:
        watched = [r for r in WATCHED if kmock_lib.resource(r) in emulator.resources]

        def ready() -> bool:
            if process.returncode is not None:
                raise RuntimeError(f"m3fleet {' '.join(args)} exited with {process.returncode}:\n{operator.log()}")
            return all(emulator.watching(r, host=host) for r in watched)

        try:
            await eventually(ready, timeout=ready_timeout, interval=0.1)
        except AssertionError:
            raise AssertionError(f"the operator's watches did not open:\n{operator.log()[-5000:]}") from None
        yield operator
    finally:
        await operator.stop()


# ---------------------------------------------------------------------------------------------
# The test's side of the API
# ---------------------------------------------------------------------------------------------


class Cluster:
    """Drive the emulator like kubectl and the built-in controllers; read what is stored."""

    def __init__(self, kmock: ApiServerEmulator, namespace: str = NS) -> None:
        self.kmock = kmock
        self.namespace = namespace

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

    def child(self, name: str, kind: str) -> dict[str, Any]:
        """The one child of `kind` (found by kind, whatever its name)."""
        [found] = [body for key, body in self.children(name).items() if key.startswith(f"{kind}/")]
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
            status.get("observedGeneration") == m3d["metadata"]["generation"]
            and degraded
            and degraded[0]["status"] == "False"
        )

    async def settled(self, quiet: float = 0.5, timeout: float = 15) -> None:
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

    def path(self, resource: str, name: str | None = None, subresource: str | None = None) -> str:
        group_version, _, plural = resource.rpartition("/")
        base = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        return "/".join(p for p in (f"{base}/namespaces/{self.namespace}/{plural}", name, subresource) if p)

    async def send(
        self, method: str, path: str, body: Any = None, expect: int = 200, content: str = "application/merge-patch+json"
    ) -> dict[str, Any]:
        headers = {"Content-Type": content} if method == "PATCH" else {}
        resp = await self.kmock.request(method, path, json=body, headers=headers)
        text = await resp.text()
        assert resp.status == expect, f"{method} {path}: {resp.status} {text}"
        data: dict[str, Any] = await resp.json()
        return data

    async def create(self, doc: dict[str, Any]) -> str:
        await self.send("POST", self.path(M3D), doc, expect=201)
        name: str = doc["metadata"]["name"]
        return name

    async def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        await self.send("PATCH", self.path(M3D, name), {"spec": spec})

    async def edit(self, resource: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A hand edit, as `kubectl edit` or `kubectl patch` makes it (a strategic merge patch)."""
        return await self.send(
            "PATCH", self.path(resource, name), patch, content="application/strategic-merge-patch+json"
        )

    async def delete(self, name: str, resource: str = M3D) -> None:
        await self.send("DELETE", self.path(resource, name))

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
        await self.send("PATCH", self.path(resource, name, "status"), {"status": status})


# ---------------------------------------------------------------------------------------------
# Scenarios, and their fault-free end states (computed once, on a fresh emulator of their own)
# ---------------------------------------------------------------------------------------------


async def create_trtllm(cluster: Cluster) -> str:
    name = await cluster.create(sample(TRTLLM))
    await eventually(lambda: cluster.converged(name))
    return name


async def vllm_to_lws(cluster: Cluster) -> str:
    """A one-node Deployment, then more sequences than one node holds: a LeaderWorkerSet is applied, the
    Deployment pruned."""
    name = await cluster.create(sample(VLLM))
    await eventually(lambda: cluster.converged(name))
    await cluster.patch_spec(name, TWO_NODES)
    await eventually(lambda: cluster.converged(name) and cluster.m3d(name)["metadata"]["generation"] == 2)
    return name


Scenario = Callable[[Cluster], Awaitable[str]]
SCENARIOS: dict[str, Scenario] = {"trtllm": create_trtllm, "vllm-to-lws": vllm_to_lws}


async def run_scenarios(cluster: Cluster) -> dict[str, str]:
    """Every scenario at once (each on its own resource): scenario -> resource name."""
    names = await asyncio.gather(*(scenario(cluster) for scenario in SCENARIOS.values()))
    return dict(zip(SCENARIOS, names, strict=True))


@contextlib.asynccontextmanager
async def fresh_cluster(emulator_cls: type[ApiServerEmulator] = ApiServerEmulator) -> AsyncIterator[Cluster]:
    """A second, independent emulator on the current loop (the `kmock` fixture gives one per test)."""
    async with emulator_cls() as emulator, kmock_lib.Server(emulator):
        declare_cluster(emulator)
        yield Cluster(emulator)
        assert_rbac(emulator)


_baselines: dict[str, dict[str, Any]] = {}


async def baselines(directory: Path) -> dict[str, dict[str, Any]]:
    """The fault-free end state of every scenario, from one run of its own (computed once per session)."""
    if not _baselines:
        async with fresh_cluster() as cluster, running_operator(cluster.kmock, directory):
            names = await run_scenarios(cluster)
            await cluster.settled()
            _baselines.update({scenario: copy.deepcopy(cluster.end_state(n)) for scenario, n in names.items()})
    return _baselines

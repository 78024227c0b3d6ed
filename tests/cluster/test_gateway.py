"""spec.gateway on the real control plane: the Gateway API and GIE CRDs installed from their Go modules (the crds/
that .ci/epp.sh collects), a gatewayed fleet with two context tiers applied through the operator as users run it,
and what a user sees: the pool selects exactly the serving pods, the picker's objects and the route exist and are
owned, GatewayReady follows the Gateway and the route's verdict (no Gateway implementation runs here: the test
writes the route's status as one would), a bad gatewayRef tears nothing down, removing the field prunes the path,
deleting the fleet leaves nothing behind, and minReplicas 0 is admitted only with a gateway."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.support.cluster.cluster import Cluster, eventually
from tests.support.cluster.fleet import condition, delete, operated_namespace, renamed, sample, wait_ready

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "gateway"
NAME = "gw"
GATEWAY = "inference-gateway"
POOLS = "inferencepools.inference.networking.k8s.io"
ROUTES = "httproutes.gateway.networking.k8s.io"
GATEWAYS = "gateways.gateway.networking.k8s.io"
CRDS = (POOLS, ROUTES, GATEWAYS, "inferenceobjectives.inference.networking.x-k8s.io")
MAX_CONTEXT_LABEL = "m3fleet.dev/max-context-tokens"
# The serving path's objects besides the pool and the route (kind as kubectl names it, name).
PICKER = [
    ("deployment", f"{NAME}-epp"),
    ("service", f"{NAME}-epp"),
    ("serviceaccount", f"{NAME}-epp"),
    ("role", f"{NAME}-epp"),
    ("rolebinding", f"{NAME}-epp"),
    ("configmap", f"{NAME}-epp-config"),
]
PATH = [*PICKER, (POOLS, NAME), (ROUTES, NAME), ("deployment", f"{NAME}-short")]


@pytest.fixture(scope="module")
def crds(chart: Cluster) -> Cluster:
    built = subprocess.run(["bash", str(ROOT / ".ci" / "epp.sh")], capture_output=True, text=True, check=True)
    chart.kubectl("apply", "--server-side", "-f", str(Path(built.stdout.strip()) / "crds"))
    chart.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{c}" for c in CRDS))
    return chart


@pytest.fixture(scope="module")
def fleet(crds: Cluster) -> Iterator[Cluster]:
    with operated_namespace(crds, NAMESPACE, "operator-gateway") as operator:
        crds.apply(renamed(sample("vllm-h200-gateway-tiers"), NAME, NAMESPACE))
        yield crds
        assert "Traceback" not in operator.log()


def _gateway_ready(cluster: Cluster) -> dict[str, Any]:
    return condition(cluster.get("m3d", NAME, NAMESPACE), "GatewayReady")


def _reason_is(cluster: Cluster, reason: str) -> bool:
    return _gateway_ready(cluster).get("reason") == reason


def _engine_pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    pods = cluster.list("pods", NAMESPACE, f"m3fleet.dev/name={NAME},app.kubernetes.io/component=engine")
    return {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


def _write_route_status(cluster: Cluster, accepted: bool, reason: str) -> None:
    """What a Gateway controller writes on the route it serves (none runs here)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = "True" if accepted else "False"
    parent = {
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": GATEWAY},
        "controllerName": "example.com/gateway-controller",
        "conditions": [
            {"type": "Accepted", "status": status, "reason": reason, "message": reason, "lastTransitionTime": now}
        ],
    }
    patch = json.dumps({"status": {"parents": [parent]}})
    cluster.kubectl("patch", ROUTES, NAME, "-n", NAMESPACE, "--subresource=status", "--type=merge", "-p", patch)


def _patch(cluster: Cluster, patch: dict[str, Any]) -> None:
    cluster.kubectl("patch", "m3d", NAME, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))


def test_the_pool_selects_exactly_the_serving_pods_of_every_tier(fleet: Cluster) -> None:
    wait_ready(fleet, NAME, NAMESPACE)
    pods = eventually("both tiers' pods", lambda: len(_engine_pods(fleet)) == 2 and _engine_pods(fleet), 90)
    pool = eventually("the InferencePool", lambda: fleet.get(POOLS, NAME, NAMESPACE), 60)
    selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    selected = {p["metadata"]["name"] for p in fleet.list("pods", NAMESPACE, selector)}
    assert selected == set(pods)  # every serving pod of both tiers, and nothing else (not the picker's pod)
    contexts = sorted(int(p["metadata"]["labels"][MAX_CONTEXT_LABEL]) for p in pods.values())
    assert contexts == [131072, 524288]
    ports = {c["ports"][0]["containerPort"] for p in pods.values() for c in p["spec"]["containers"] if c.get("ports")}
    assert [t["number"] for t in pool["spec"]["targetPorts"]] == sorted(ports)
    route = eventually("the HTTPRoute", lambda: fleet.get(ROUTES, NAME, NAMESPACE), 30)
    assert [p["name"] for p in route["spec"]["parentRefs"]] == [GATEWAY]
    assert route["spec"]["rules"][0]["backendRefs"][0] | {"weight": 1} == {
        "group": "inference.networking.k8s.io", "kind": "InferencePool", "name": NAME, "weight": 1
    }  # fmt: skip
    uid = fleet.get("m3d", NAME, NAMESPACE)["metadata"]["uid"]  # type: ignore[index]
    for kind, name in [*PICKER, (POOLS, NAME), (ROUTES, NAME)]:
        obj = fleet.get(kind, name, NAMESPACE)
        assert obj is not None, (kind, name)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid, (kind, name)


def test_gateway_ready_follows_the_gateway_and_the_routes_verdict(fleet: Cluster) -> None:
    wait_ready(fleet, NAME, NAMESPACE)
    eventually("GatewayReady/GatewayNotFound", lambda: _reason_is(fleet, "GatewayNotFound"), 60)
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY, "namespace": NAMESPACE},
        "spec": {"gatewayClassName": "example", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
    }
    fleet.apply(gateway)
    _write_route_status(fleet, True, "Accepted")  # the route's change reconciles the fleet at once
    eventually("GatewayReady/RouteAccepted", lambda: _reason_is(fleet, "RouteAccepted"), 60)
    assert _gateway_ready(fleet)["status"] == "True"
    status = fleet.get("m3d", NAME, NAMESPACE)["status"]  # type: ignore[index]
    assert status["gateway"]["readyEndpoints"] == 2
    assert [(t["name"], t["readyReplicas"]) for t in status["gateway"]["tiers"]] == [("short", 1)]
    _write_route_status(fleet, False, "NotAllowedByListeners")
    eventually("GatewayReady/RouteNotAccepted", lambda: _reason_is(fleet, "RouteNotAccepted"), 60)
    assert "NotAllowedByListeners" in _gateway_ready(fleet)["message"]
    fleet.kubectl("delete", GATEWAYS, GATEWAY, "-n", NAMESPACE)


def test_a_bad_gateway_ref_tears_nothing_down(fleet: Cluster) -> None:
    wait_ready(fleet, NAME, NAMESPACE)
    before = {name: pod["metadata"]["uid"] for name, pod in _engine_pods(fleet).items()}
    _patch(fleet, {"spec": {"gateway": {"gatewayRef": {"name": "nope"}}}})
    eventually("GatewayReady/GatewayNotFound", lambda: _reason_is(fleet, "GatewayNotFound"), 60)
    message = _gateway_ready(fleet)["message"]
    assert "nope" in message and "spec.gateway.gatewayRef" in message
    after = {name: pod["metadata"]["uid"] for name, pod in _engine_pods(fleet).items()}
    assert after == before  # the same pods serve on
    assert condition(fleet.get("m3d", NAME, NAMESPACE), "Ready")["status"] == "True"
    assert fleet.get(POOLS, NAME, NAMESPACE) is not None


def test_scale_from_zero_is_admitted_only_with_a_gateway(fleet: Cluster) -> None:
    document = renamed(sample("vllm-h200-tp8"), "zero", NAMESPACE)
    document["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 0, "prometheus": {"url": "http://prom:9090"}}
    refused = fleet.apply(document, "--dry-run=server", check=False)
    assert refused.returncode != 0
    assert "spec.autoscaling.minReplicas" in refused.stderr and "spec.gateway" in refused.stderr
    document["spec"]["gateway"] = {"gatewayRef": {"name": GATEWAY}}
    fleet.apply(document, "--dry-run=server")


def test_removing_the_field_prunes_the_path_and_deleting_the_fleet_leaves_nothing(fleet: Cluster) -> None:
    wait_ready(fleet, NAME, NAMESPACE)
    fleet.kubectl(
        "patch", "m3d", NAME, "-n", NAMESPACE, "--type=json", "-p", '[{"op":"remove","path":"/spec/gateway"}]'
    )

    def left() -> list[tuple[str, str]]:
        return [(kind, name) for kind, name in PATH if fleet.get(kind, name, NAMESPACE) is not None]

    eventually("the serving path pruned", lambda: not left(), 60)

    def without_gateway_status() -> dict[str, Any] | None:
        body = fleet.get("m3d", NAME, NAMESPACE) or {}
        return None if condition(body, "GatewayReady") or "gateway" in body.get("status", {}) else body

    eventually("GatewayReady and status.gateway gone", without_gateway_status, 60)
    assert fleet.get("deployment", NAME, NAMESPACE) is not None  # the engines stay
    _patch(fleet, {"spec": {"gateway": {"gatewayRef": {"name": GATEWAY}}}})
    eventually("the path back", lambda: fleet.get(POOLS, NAME, NAMESPACE) and fleet.get(ROUTES, NAME, NAMESPACE), 60)
    delete(fleet, NAME, NAMESPACE)
    eventually("nothing left behind", lambda: not left() and fleet.get("deployment", NAME, NAMESPACE) is None, 60)

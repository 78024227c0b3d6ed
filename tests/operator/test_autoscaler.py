"""The autoscaler's tick in the operator: fleet from Kubernetes, decision recorded, replicas applied.

Prometheus is the external boundary here: a scripted `MetricsSource` stands in for it (the adapters
themselves are tested against a real Prometheus in tests/autoscaling). Everything else is real: the
policy, the reconciler, the KubeApi and the apiserver emulator.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from m3fleet.autoscaling.signals import MetricsSnapshot, ReplicaSignals
from m3fleet.controller.autoscaler import Autoscaler, fleet_from
from m3fleet.controller.kube import KubeApi
from m3fleet.controller.reconcile import Reconciler
from tests.kube.conftest_helpers import eventually
from tests.kube.emulator import ApiServerEmulator
from tests.operator.harness import DEPLOYMENTS, M3D, NS, Cluster, api_client, declare_cluster, sample

LOG = logging.getLogger("test")
NAME = "m3-vllm-h200-tp8"
NOW = 1_800_000_000.0


class Recorded:
    """Events the operator would post, kept for assertions."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def info(self, body: Any, reason: str, message: str) -> None:
        self.posted.append(("Normal", reason, message))

    def warn(self, body: Any, reason: str, message: str) -> None:
        self.posted.append(("Warning", reason, message))


class Scripted:
    """What Prometheus would answer: one snapshot per read, the last repeated."""

    def __init__(self, *snapshots: MetricsSnapshot) -> None:
        self.snapshots = list(snapshots)
        self.reads = 0

    def read(self, at: float | None = None) -> MetricsSnapshot:
        self.reads += 1
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]


def loaded(kv_usage: float, waiting: float, replicas: int = 1) -> MetricsSnapshot:
    signals = tuple(
        ReplicaSignals(
            replica=f"pod-{i}",
            sample_time=NOW,
            kv_usage=kv_usage,
            running=4,
            waiting=waiting,
            prompt_tokens_rate=2000.0,
            generation_tokens_rate=500.0,
            first_token_rate=0.5,
            finished_rate=0.5,
        )
        for i in range(replicas)
    )
    return MetricsSnapshot(engine="vllm", time=NOW, replicas=signals)


def iso(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


async def setup(kmock: ApiServerEmulator, source: Scripted, mode: str = "act") -> Autoscaler:
    declare_cluster(kmock)
    api = KubeApi(api_client(kmock))
    doc = sample("vllm-h200-tp8")
    doc["spec"]["autoscaling"] = {
        "enabled": True,
        "mode": mode,
        "minReplicas": 1,
        "maxReplicas": 4,
        "prometheus": {"url": "x"},
    }
    resp = await kmock.post(f"/apis/m3fleet.dev/v1alpha1/namespaces/{NS}/minimaxm3deployments", json=doc)
    assert resp.status == 201
    reconciler = Reconciler(api, events=Recorded())
    await reconciler.reconcile_by_name(NS, NAME, LOG)  # the children exist before the autoscaler decides
    ready = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
    resp = await kmock.patch(
        f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}/status",
        json={"status": ready},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status == 200
    return Autoscaler(api, reconciler, adapters=lambda *_: source, clock=lambda: NOW)


def status_of(kmock: ApiServerEmulator) -> dict[str, Any]:
    return (kmock.get_object(M3D, NS, NAME) or {}).get("status") or {}


async def test_scale_up_reaches_the_workload_not_the_spec(kmock: ApiServerEmulator) -> None:
    autoscaler = await setup(kmock, Scripted(loaded(kv_usage=0.97, waiting=40)))
    decision = await autoscaler.tick(NS, NAME, LOG)
    assert decision is not None and decision.desired_replicas > 1 and decision.applied
    recorded = status_of(kmock)["autoscaling"]
    assert recorded["desiredReplicas"] == decision.desired_replicas and recorded["state"] is not None
    assert set(recorded["terms"]) and recorded["reason"]
    deployment = kmock.get_object(DEPLOYMENTS, NS, NAME)
    assert deployment is not None and deployment["spec"]["replicas"] == decision.desired_replicas
    m3d = kmock.get_object(M3D, NS, NAME)
    assert m3d is not None and m3d["spec"]["replicas"] == 1  # GitOps owns spec: never written
    events = autoscaler.reconciler.events
    assert isinstance(events, Recorded) and any(reason == "Scaled" for _, reason, _ in events.posted)


async def test_advisory_mode_records_but_does_not_scale(kmock: ApiServerEmulator) -> None:
    autoscaler = await setup(kmock, Scripted(loaded(kv_usage=0.97, waiting=40)), mode="advisory")
    decision = await autoscaler.tick(NS, NAME, LOG)
    assert decision is not None and decision.desired_replicas > 1 and not decision.applied
    assert status_of(kmock)["autoscaling"]["mode"] == "advisory"
    events = autoscaler.reconciler.events
    assert isinstance(events, Recorded)
    assert [r for _, r, _ in events.posted if r != "Applied"] == ["ScaleRecommended"]  # recommended, not scaled
    deployment = kmock.get_object(DEPLOYMENTS, NS, NAME)
    assert deployment is not None and deployment["spec"]["replicas"] == 1


async def test_prometheus_outage_holds_and_never_scales_down(kmock: ApiServerEmulator) -> None:
    outage = MetricsSnapshot(engine="vllm", time=NOW, error="prometheus at x: ConnectionError: refused")
    autoscaler = await setup(kmock, Scripted(outage))
    decision = await autoscaler.tick(NS, NAME, LOG)
    assert decision is not None and decision.desired_replicas == 1 and not decision.applied
    assert "prometheus" in status_of(kmock)["autoscaling"]["reason"]


async def test_a_steady_fleet_writes_nothing_between_heartbeats(kmock: ApiServerEmulator) -> None:
    steady = loaded(kv_usage=0.3, waiting=0)
    autoscaler = await setup(kmock, Scripted(steady))
    await autoscaler.tick(NS, NAME, LOG)  # the first decision is recorded
    kmock.reset_writes()
    for _ in range(5):
        await autoscaler.tick(NS, NAME, LOG)
    assert sum(kmock.writes().values()) == 0


def test_fleet_from_measures_time_to_ready_and_starting_ages() -> None:
    workload = {"spec": {"replicas": 3}, "status": {"readyReplicas": 1}}

    def pod(created: float, ready_at: float | None) -> dict[str, Any]:
        conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": iso(ready_at)}] if ready_at else []
        return {"metadata": {"creationTimestamp": iso(created)}, "status": {"conditions": conditions}}

    fleet = fleet_from(workload, [pod(NOW - 900, NOW - 300), pod(NOW - 120, None), pod(NOW - 60, None)], NOW)
    assert fleet.current_replicas == 3 and fleet.ready_replicas == 1
    assert fleet.starting_ages == (60.0, 120.0)
    assert fleet.time_to_ready_seconds == 600.0


class Live:
    """Prometheus answering with fresh samples: a loaded fleet (every read is 'now')."""

    def read(self, at: float | None = None) -> MetricsSnapshot:
        import time

        snapshot = loaded(kv_usage=0.97, waiting=40)
        now = time.time()
        replicas = tuple(dataclasses.replace(r, sample_time=now) for r in snapshot.replicas)
        return dataclasses.replace(snapshot, time=now, replicas=replicas)


async def test_the_running_operator_scales_a_loaded_fleet(cluster: Cluster) -> None:
    """The operator-wide autoscaler loop, inside the real kopf operator: decide, record, apply."""
    doc = sample("vllm-h200-tp8")
    doc["spec"]["autoscaling"] = {"enabled": True, "intervalSeconds": 5, "maxReplicas": 3, "prometheus": {"url": "x"}}
    async with cluster.operator(adapters=lambda *_: Live()):
        name = await cluster.create(doc)
        await eventually(lambda: cluster.get(DEPLOYMENTS, name) is not None)
        await cluster.report_workload(DEPLOYMENTS, name)

        def replicas() -> int:
            deployment = cluster.get(DEPLOYMENTS, name)
            return int(deployment["spec"]["replicas"]) if deployment else 0

        await eventually(lambda: replicas() > 1, timeout=20)
        recorded = cluster.status(name)["autoscaling"]
        assert recorded["action"] == "scale-up" and recorded["desiredReplicas"] == replicas()
        assert cluster.m3d(name)["spec"]["replicas"] == 1
        await eventually(lambda: any(reason == "Scaled" for reason, _ in cluster.events(name)))  # a queued post

"""Time-to-ready on the real tier: kwok runs the engine pods to Ready, the operator (`m3fleet run`, the chart's
ServiceAccount) exports each new replica's phases as Prometheus histograms on its metrics port and writes
`status.timeToReady`; a restarted operator counts no replica twice; a LeaderWorkerSet group is one replica.

What this leaves unproven: kwok marks a pod scheduled, started and ready within a second and posts no
kubelet events, so the phases measured here are near zero and the image phase (read from the kubelet's
`Pulled` events) stays unknown; the unit tests (tests/unit/autoscaling/test_readiness.py) cover real timings,
pull events, images already present and restarts.
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import advisory_fleet, delete, pods, renamed, sample, wait_ready, weight_volumes
from tests.support.ports import free_port

from m3fleet.autoscaling.time_to_ready import epoch

NAMESPACE = "startup"
TTR = "m3fleet_replica_time_to_ready_seconds"
PHASE = "m3fleet_replica_startup_phase_seconds"


@contextlib.contextmanager
def operator(cluster: Cluster, port: int, name: str) -> Iterator[OperatorProcess]:
    with cluster.operator("--all-namespaces", "--standalone", "--metrics-port", str(port), name=name) as running:
        yield running


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The operator's /metrics, as Prometheus reads it: (sample name, labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def count(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], metric: str, **labels: str) -> float:
    key = (f"{metric}_count", tuple(sorted({"namespace": NAMESPACE, **labels}.items())))
    return metrics.get(key, 0.0)


def time_to_ready(cluster: Cluster, name: str) -> dict[str, Any]:
    body = cluster.get("m3d", name, NAMESPACE) or {}
    return dict((body.get("status") or {}).get("timeToReady") or {})


def test_each_new_replica_is_measured_exported_and_recorded_once(chart: Cluster) -> None:
    chart.namespace(NAMESPACE)
    weight_volumes(chart, NAMESPACE)
    document = renamed(sample("vllm-h200-tp8"), "timed", NAMESPACE)
    document["spec"]["replicas"] = 2
    port = free_port()
    try:
        with operator(chart, port, "operator-startup"):
            chart.apply(document)
            wait_ready(chart, "timed", NAMESPACE)
            status = eventually(
                "status.timeToReady counts both replicas",
                lambda: (s := time_to_ready(chart, "timed")).get("replicasMeasured") == 2 and s,
                60,
            )
            live = {p["metadata"]["uid"]: p for p in pods(chart, "timed", NAMESPACE)}
            assert status["samples"] == 2 and len(status["recent"]) == 2
            assert {s["id"] for s in status["recent"]} == set(live)
            for entry in status["recent"]:
                pod = live[entry["id"]]
                ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
                created = epoch(pod["metadata"]["creationTimestamp"])
                became = epoch(ready["lastTransitionTime"])
                assert created is not None and became is not None
                # The whole is the pod's own created -> Ready, and the phases add up to it.
                assert entry["seconds"] == round(became - created, 1)
                phases = entry["phases"]
                assert "image" not in phases  # kwok posts no Pulled event: the image phase is unknown
                known = [phases[k] for k in ("schedule", "start", "load")]
                assert all(v is not None and v >= 0 for v in known)
                assert abs(sum(known) - entry["seconds"]) <= 0.3
                assert entry["replica"] == pod["metadata"]["name"] and entry["restarts"] == 0
            assert status["p90Seconds"] == max(s["seconds"] for s in status["recent"])
            assert status["phases"]["load"]["samples"] == 2 and status["phases"]["image"] == {"samples": 0}

            metrics = eventually("the histograms on the metrics port", lambda: scrape(port), 30)
            assert count(metrics, TTR, name="timed") == 2
            for phase in ("schedule", "start", "load"):
                assert count(metrics, PHASE, name="timed", phase=phase) == 2, phase
            assert count(metrics, PHASE, name="timed", phase="image") == 0
            buckets = {k: v for k, v in metrics.items() if k[0] == f"{TTR}_bucket" and ("name", "timed") in k[1]}
            assert buckets and max(buckets.values()) == 2

        # A new operator process: the replicas in status are not counted again; a new one is, once.
        port = free_port()
        with operator(chart, port, "operator-startup-2") as running:
            eventually("the restarted operator serves metrics", lambda: scrape(port), 30)
            chart.kubectl("scale", "m3d/timed", "-n", NAMESPACE, "--replicas=3")
            eventually(
                "the third replica measured",
                lambda: time_to_ready(chart, "timed").get("replicasMeasured") == 3,
                120,
            )
            metrics = scrape(port)
            assert count(metrics, TTR, name="timed") == 1  # only the new replica, in this process
            assert time_to_ready(chart, "timed")["samples"] == 3
            assert "ready in" in running.log()
    finally:
        delete(chart, "timed", NAMESPACE)


def test_a_leaderworkerset_group_is_one_replica(chart: Cluster) -> None:
    chart.namespace(NAMESPACE)
    weight_volumes(chart, NAMESPACE)
    document = renamed(sample("vllm-h200-tp8"), "grouped", NAMESPACE)
    # 1M tokens, three full-length sequences: a replica spans two H200 nodes (as tests/cluster/test_multinode.py).
    document["spec"]["model"] = {"variant": "mxfp8", "source": {"pvc": {"claimName": "m3-weights-mxfp8"}}}
    document["spec"]["context"] = {"maxModelLen": 1_048_576, "minSequencesAtMaxLen": 3}
    document["spec"]["parallelism"] = {"strategy": "tp", "tensorParallelSize": 0}
    port = free_port()
    try:
        with operator(chart, port, "operator-startup-groups"):
            chart.apply(document)
            body = wait_ready(chart, "grouped", NAMESPACE, timeout=240)
            assert body["status"]["plan"]["nodesPerReplica"] == 2
            status = eventually(
                "status.timeToReady counts the group",
                lambda: (s := time_to_ready(chart, "grouped")).get("replicasMeasured") and s,
                60,
            )
            found = pods(chart, "grouped", NAMESPACE)
            leader = next(p for p in found if p["metadata"]["labels"]["m3fleet.dev/role"] == "leader")
            (entry,) = status["recent"]
            assert status["replicasMeasured"] == 1
            assert entry["id"] == leader["metadata"]["uid"]
            assert sorted(entry["uids"]) == sorted(p["metadata"]["uid"] for p in found)
            # Ready when the last pod of the group is: at or after each pod's own Ready.
            last_ready = max(
                epoch(next(c for c in p["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"]) or 0.0
                for p in found
            )
            first_created = min(epoch(p["metadata"]["creationTimestamp"]) or 0.0 for p in found)
            assert entry["seconds"] == round(last_ready - first_created, 1)
            metrics = scrape(port)
            assert count(metrics, TTR, name="grouped") == 1
    finally:
        delete(chart, "grouped", NAMESPACE)


def test_the_autoscaler_plans_with_the_measured_time_to_ready(chart: Cluster) -> None:
    """Advisory autoscaling with no Prometheus to read (it holds): the horizon it reports moves from the spec's
    coldStartSeconds to the measured p90 once the replica is measured."""
    chart.namespace(NAMESPACE)
    weight_volumes(chart, NAMESPACE)
    # nothing listens at port 9: the policy holds, and says so
    document = advisory_fleet("horizon", NAMESPACE, {"url": "http://127.0.0.1:9"}, coldStartSeconds=900)
    try:
        with operator(chart, free_port(), "operator-startup-horizon"):
            chart.apply(document)
            wait_ready(chart, "horizon", NAMESPACE)

            def autoscaling() -> dict[str, Any]:
                body = chart.get("m3d", "horizon", NAMESPACE) or {}
                return dict((body.get("status") or {}).get("autoscaling") or {})

            measured = eventually(
                "status.autoscaling plans with the measured time-to-ready",
                lambda: (a := autoscaling()).get("timeToReady", {}).get("source", "").startswith("measured") and a,
                60,
            )
            p90 = time_to_ready(chart, "horizon")["p90Seconds"]
            assert measured["timeToReady"]["seconds"] == p90 < 900
            assert measured["terms"]["horizonSeconds"] == p90 + 5
            assert measured["action"] == "hold" and "hold" in measured["reason"]
    finally:
        delete(chart, "horizon", NAMESPACE)

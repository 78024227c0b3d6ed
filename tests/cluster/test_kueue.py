"""spec.podTemplate with Kueue itself on the real tier: Kueue v0.17's manager (built from Go modules by .ci/kueue.sh,
its webhooks on loopback; tests/support/cluster/kueue.py) admits a multi-node fleet's LeaderWorkerSet group as ONE
Workload (podsets leader + worker) when the ClusterQueue's nvidia.com/gpu quota fits it, and then the group's pods
lose their scheduling gate, are scheduled and the fleet goes Ready. With too small a quota the Workload stays pending,
the pods stay gated and the fleet says so: not Ready, reason Unschedulable, naming the gate and where to look.

The only thing a user adds is `kueue.x-k8s.io/queue-name` in spec.podTemplate.metadata.labels: m3fleet puts it on the
LeaderWorkerSet object, where Kueue's LeaderWorkerSet integration reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import condition, operated_namespace, pods, two_node_group, wait_ready
from tests.support.cluster.kueue import quota, running_kueue

NAMESPACE = "kueue-serving"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ADMISSION_GATE = "kueue.x-k8s.io/admission"  # the scheduling gate Kueue's pod webhook puts on each pod it manages
GPUS_PER_GROUP = 16  # two H200 nodes, 8 GPUs each
ADMITTED, PENDING = "m3-kueue-fits", "m3-kueue-too-small"
QUEUES = {ADMITTED: ("serving-16", GPUS_PER_GROUP), PENDING: ("serving-8", GPUS_PER_GROUP // 2)}


@pytest.fixture(scope="module")
def fleets(chart: Cluster) -> Iterator[OperatorProcess]:
    """Kueue, a queue for each fleet (one with room for a group, one with half of it) and both fleets applied at once
    (they wait on different things, so their waits overlap)."""
    with operated_namespace(chart, NAMESPACE, "operator-kueue") as operator, running_kueue(chart, [NAMESPACE]):
        for name, (local_queue, gpus) in QUEUES.items():
            for document in quota("h200", f"{local_queue}-cluster", local_queue, NAMESPACE, gpus):
                chart.apply(document)
            fleet = two_node_group(name, NAMESPACE)
            fleet["spec"]["podTemplate"] = {"metadata": {"labels": {QUEUE_LABEL: local_queue}}}
            chart.apply(fleet)
        yield operator
        # Gone while Kueue still runs: it lifts its finalizers from the Workloads and pods of the groups.
        chart.kubectl("delete", "m3d", "--all", "-n", NAMESPACE, "--wait=true", timeout=120)
        eventually("the fleets' pods gone", lambda: not chart.list("pods", NAMESPACE, "m3fleet.dev/name"), 120)
        eventually("their Workloads gone", lambda: not workloads(chart), 60)
        for local_queue, _ in QUEUES.values():
            chart.kubectl("delete", "clusterqueue", f"{local_queue}-cluster", "--wait=false", check=False)


def workloads(chart: Cluster, leader_worker_set: str | None = None) -> list[dict[str, Any]]:
    found = chart.list("workloads.kueue.x-k8s.io", NAMESPACE)
    return [
        w
        for w in found
        if leader_worker_set is None
        or any(
            o["kind"] == "LeaderWorkerSet" and o["name"] == leader_worker_set
            for o in w["metadata"].get("ownerReferences", [])
        )
    ]


def kueue_condition(workload: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in workload.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def assert_one_workload_for_the_group(chart: Cluster, name: str) -> dict[str, Any]:
    """The LeaderWorkerSet carries the queue; Kueue made exactly one Workload for its one group: a leader podset and
    a worker podset of one pod each, 8 GPUs a pod."""
    leader_worker_set = chart.get("leaderworkerset", name, NAMESPACE)
    assert leader_worker_set is not None
    assert leader_worker_set["metadata"]["labels"][QUEUE_LABEL] == QUEUES[name][0]
    found = eventually(f"a Workload of {name}", lambda: workloads(chart, name), 60)
    assert len(found) == 1, [w["metadata"]["name"] for w in found]
    (workload,) = found
    assert workload["spec"]["queueName"] == QUEUES[name][0]
    podsets = {p["name"]: p for p in workload["spec"]["podSets"]}
    assert sorted(podsets) == ["leader", "worker"], sorted(podsets)
    for podset in podsets.values():
        assert podset["count"] == 1, podset["name"]
        (engine,) = [c for c in podset["template"]["spec"]["containers"] if c["name"] == "engine"]
        assert engine["resources"]["requests"]["nvidia.com/gpu"] == str(GPUS_PER_GROUP // 2), podset["name"]
    return workload


def test_a_group_that_fits_the_quota_is_admitted_as_one_workload_and_serves(
    chart: Cluster, fleets: OperatorProcess
) -> None:
    body = wait_ready(chart, ADMITTED, NAMESPACE, timeout=120)
    workload = assert_one_workload_for_the_group(chart, ADMITTED)
    assert kueue_condition(workload, "Admitted").get("status") == "True", workload.get("status")
    assert workload["status"]["admission"]["clusterQueue"] == f"{QUEUES[ADMITTED][0]}-cluster"
    found = pods(chart, ADMITTED, NAMESPACE)
    assert len(found) == 2, [p["metadata"]["name"] for p in found]
    for pod in found:
        name = pod["metadata"]["name"]
        # Kueue's own marks of a pod of this group's Workload, and its gate lifted: the default scheduler placed it.
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == workload["metadata"]["name"], name
        assert not pod["spec"].get("schedulingGates"), name
        assert pod["spec"].get("nodeName"), name
    assert condition(body, "Available")["status"] == "True"
    # Kueue's webhook added its annotations to the group's templates; the operator does not fight them (it would
    # re-apply the LeaderWorkerSet on every reconcile): it wrote it once.
    target = f"leaderworkersets/{NAMESPACE}/{ADMITTED} -> "
    written = [w for w in fleets.writes(fleets.requests()) if target in w]
    assert written == [f"patch {target}201"], written


def test_a_group_over_the_quota_stays_gated_and_status_says_why(chart: Cluster, fleets: OperatorProcess) -> None:
    workload = assert_one_workload_for_the_group(chart, PENDING)

    def no_room() -> dict[str, Any] | None:
        reserved = kueue_condition(workloads(chart, PENDING)[0], "QuotaReserved")
        return reserved if reserved.get("status") == "False" else None

    reserved = eventually("the Workload's QuotaReserved=False (no room)", no_room, 60)
    assert "insufficient quota" in reserved["message"], reserved
    workload = workloads(chart, PENDING)[0]
    assert kueue_condition(workload, "Admitted").get("status") != "True", workload.get("status")

    def unschedulable() -> dict[str, Any] | None:
        ready = condition(chart.get("m3d", PENDING, NAMESPACE), "Ready")
        return ready if ready.get("reason") == "Unschedulable" else None

    ready = eventually("Ready=False Unschedulable naming Kueue's gate", unschedulable, 60)
    assert ready["status"] == "False"
    assert ADMISSION_GATE in ready["message"] and "2 of 2 pods" in ready["message"], ready
    found = pods(chart, PENDING, NAMESPACE)
    assert len(found) == 2, [p["metadata"]["name"] for p in found]
    for pod in found:
        assert {"name": ADMISSION_GATE} in pod["spec"]["schedulingGates"], pod["metadata"]["name"]
        assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending", pod["metadata"]["name"]
    body = chart.get("m3d", PENDING, NAMESPACE)
    available = condition(body, "Available")
    assert (available["status"], available["message"]) == ("False", "0 of 1 replicas ready"), available
    assert (body or {})["status"]["readyReplicas"] == 0

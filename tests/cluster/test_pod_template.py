"""spec.podTemplate on the real control plane: what a platform team sets lands where Kueue, Volcano and the scheduler
read it, through the real ReplicaSet and LeaderWorkerSet controllers, and the fleet stays honest when the scheduler
it names is not there.

Kueue itself runs in tests/cluster/test_kueue.py; here the queue-name label is on the LeaderWorkerSet and Deployment
objects and on a Deployment's pods, where Kueue's "Run LeaderWorkerSet" / "Run Deployment" integrations read it. The
priority class is a real PriorityClass the apiserver's Priority admission resolves into each pod's spec.priority;
`default-scheduler` named explicitly still schedules; `volcano` (not running) leaves the pods Pending and status says
why.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import (
    condition,
    delete,
    operated_namespace,
    pods,
    renamed,
    sample,
    two_node_group,
    wait_ready,
)

NAMESPACE = "platform"
PRIORITY_CLASS = "m3-serving-high"
PRIORITY = 100_000
QUEUE = {"kueue.x-k8s.io/queue-name": "gpu-serving"}
ANNOTATIONS = {"example.com/cost-center": "ml-42"}


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    chart.apply(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": PRIORITY_CLASS},
            "value": PRIORITY,
            "description": "m3fleet test: engine pods of a platform's serving queue",
        }
    )
    with operated_namespace(chart, NAMESPACE, "operator-platform") as running:
        yield running
    chart.kubectl("delete", "priorityclass", PRIORITY_CLASS, check=False)


def pod_template(scheduler: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": dict(QUEUE), "annotations": dict(ANNOTATIONS)},
        "priorityClassName": PRIORITY_CLASS,
        "schedulerName": scheduler,
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }


def single_node(name: str, scheduler: str) -> dict[str, Any]:
    document = renamed(sample("vllm-h200-tp8"), name, NAMESPACE)
    document["spec"]["podTemplate"] = pod_template(scheduler)
    return document


def multi_node(name: str) -> dict[str, Any]:
    document = two_node_group(name, NAMESPACE)
    document["spec"]["podTemplate"] = pod_template("default-scheduler")
    return document


def assert_on_pod(pod: dict[str, Any], scheduler: str, grouped: bool = False) -> None:
    """`grouped`: a LeaderWorkerSet's pod, which Kueue labels with the queue itself (tests/cluster/test_kueue.py)."""
    name = pod["metadata"]["name"]
    assert (QUEUE.items() <= pod["metadata"]["labels"].items()) != grouped, name
    assert ANNOTATIONS.items() <= pod["metadata"]["annotations"].items(), name
    assert pod["spec"]["schedulerName"] == scheduler, name
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == (PRIORITY_CLASS, PRIORITY), name
    assert {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}} in pod["spec"]["volumes"], name
    (engine,) = [c for c in pod["spec"]["containers"] if c["name"] == "engine"]
    assert {"name": "scratch", "mountPath": "/scratch"} in engine["volumeMounts"], name


@pytest.mark.parametrize(("name", "kind"), [("platform-single", "deployment"), ("platform-group", "lws")])
def test_labels_priority_scheduler_and_volume_land_on_the_workload_and_every_pod(
    chart: Cluster, operator: OperatorProcess, name: str, kind: str
) -> None:
    document = single_node(name, "default-scheduler") if kind == "deployment" else multi_node(name)
    chart.apply(document)
    wait_ready(chart, name, NAMESPACE, timeout=240)
    workload = chart.get(kind, name, NAMESPACE)
    assert workload is not None
    # Kueue reads the queue name on the LeaderWorkerSet object itself (one Workload per group) and on a Deployment's
    # pods; both objects carry it, with m3fleet's own labels intact.
    assert QUEUE.items() <= workload["metadata"]["labels"].items()
    assert ANNOTATIONS.items() <= workload["metadata"]["annotations"].items()
    assert workload["metadata"]["labels"]["m3fleet.dev/name"] == name
    found = pods(chart, name, NAMESPACE)
    assert len(found) == (1 if kind == "deployment" else 2), [p["metadata"]["name"] for p in found]
    for pod in found:
        assert_on_pod(pod, "default-scheduler", grouped=kind == "lws")
        assert pod["spec"].get("nodeName"), pod["metadata"]["name"]  # the default scheduler placed it
    delete(chart, name, NAMESPACE)


def test_a_scheduler_that_is_not_running_leaves_pods_pending_and_status_says_so(
    chart: Cluster, operator: OperatorProcess
) -> None:
    name = "platform-volcano"
    chart.apply(single_node(name, "volcano"))

    def unschedulable() -> dict[str, Any] | None:
        ready = condition(chart.get("m3d", name, NAMESPACE), "Ready")
        return ready if ready.get("reason") == "Unschedulable" else None

    ready = eventually("Ready=False Unschedulable naming volcano", unschedulable, 120)
    assert isinstance(ready, dict) and ready["status"] == "False"
    assert "scheduler volcano" in ready["message"] and "spec.podTemplate.schedulerName" in ready["message"], ready
    (pod,) = pods(chart, name, NAMESPACE)
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    assert_on_pod(pod, "volcano")
    # Everything status says is true: nothing serves, the spec is valid and applied, the rollout has not finished.
    body = chart.get("m3d", name, NAMESPACE)
    available = condition(body, "Available")
    assert (available["status"], available["message"]) == ("False", "0 of 1 replicas ready"), available
    assert condition(body, "Degraded")["status"] == "False"
    assert condition(body, "Progressing")["status"] == "True"
    assert (body or {})["status"]["readyReplicas"] == 0
    delete(chart, name, NAMESPACE)

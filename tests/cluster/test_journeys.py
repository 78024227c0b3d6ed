"""User journeys on the real control plane, with the operator started as users start it (the `m3fleet run`
console script, as the chart's ServiceAccount, cluster scope). Each journey is what a platform engineer
does with kubectl; the checks read what the real controllers (Deployment, ReplicaSet, scheduler, kwok,
LeaderWorkerSet, garbage collector, HPA) made of it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import (
    assert_on_pool,
    condition,
    delete,
    operated_namespace,
    pods,
    renamed,
    samples,
    wait_ready,
)

from m3fleet.api import parse_resource
from m3fleet.planner import plan

NAMESPACE = "fleet"


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    with operated_namespace(chart, NAMESPACE, "operator-journeys") as running:
        yield running


def _nodes_per_replica(document: dict[str, Any]) -> int:
    return plan(parse_resource(document).spec).nodes_per_replica


SINGLE_NODE = [(stem, doc) for stem, doc in samples() if _nodes_per_replica(doc) == 1]


def test_the_chart_installed_the_operator_under_pod_security_restricted(chart: Cluster) -> None:
    eventually(
        "the operator's own pod Ready",
        lambda: [d["status"].get("readyReplicas") for d in chart.list("deployments", "m3fleet-system")] == [1],
        60,
    )
    labels = chart.get("namespace", "m3fleet-system")["metadata"]["labels"]  # type: ignore[index]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_every_single_node_sample_reaches_ready_on_its_pool(chart: Cluster, operator: OperatorProcess) -> None:
    for stem, document in SINGLE_NODE:
        chart.apply(renamed(document, stem, NAMESPACE))
    try:
        for stem, document in SINGLE_NODE:
            body = wait_ready(chart, stem, NAMESPACE)
            assert condition(body, "Available")["status"] == "True"
            assert body["status"]["readyReplicas"] == body["status"]["replicas"] == document["spec"].get("replicas", 1)
            assert_on_pool(chart, stem, NAMESPACE, document["spec"]["accelerator"])
            deployment = chart.get("deployment", stem, NAMESPACE)
            assert deployment is not None and deployment["metadata"]["ownerReferences"][0]["name"] == stem
        table = chart.kubectl("get", "m3d", "-n", NAMESPACE).stdout
        header = table.splitlines()[0].split()
        for column in ("ENGINE", "ACCELERATOR", "TP", "READY", "CONTEXT"):
            assert column in header, table
    finally:
        for stem, _ in SINGLE_NODE:
            delete(chart, stem, NAMESPACE, wait=False)
        for stem, _ in SINGLE_NODE:
            eventually(f"{stem} pods gone", lambda stem=stem: not pods(chart, stem, NAMESPACE), 120)


def test_a_spec_no_node_matches_stays_not_ready_and_says_why(chart: Cluster, operator: OperatorProcess) -> None:
    document = renamed(dict(SINGLE_NODE)["vllm-h200-tp8"], "nowhere", NAMESPACE)
    document["spec"]["nodePool"] = {"nodeSelector": {"example.com/pool": "does-not-exist"}}
    chart.apply(document)
    try:
        eventually(
            "the pod is Pending",
            lambda: [p for p in pods(chart, "nowhere", NAMESPACE) if p["status"].get("phase") == "Pending"],
            60,
        )

        def says_pending() -> dict[str, Any] | None:
            ready = condition(chart.get("m3d", "nowhere", NAMESPACE), "Ready")
            return ready if ready.get("status") == "False" and "schedul" in ready.get("message", "").lower() else None

        ready = eventually("Ready=False saying the pods cannot be scheduled", says_pending, 60)
        assert condition(chart.get("m3d", "nowhere", NAMESPACE), "Available")["status"] == "False", ready
    finally:
        delete(chart, "nowhere", NAMESPACE)


def test_kubectl_scale_and_an_hpa_drive_the_workload(chart: Cluster, operator: OperatorProcess) -> None:
    document = renamed(dict(SINGLE_NODE)["vllm-h200-tp8"], "scaled", NAMESPACE)
    chart.apply(document)
    try:
        wait_ready(chart, "scaled", NAMESPACE)
        chart.kubectl("scale", "m3d/scaled", "-n", NAMESPACE, "--replicas=2")
        eventually("Deployment at 2", lambda: chart.get("deployment", "scaled", NAMESPACE)["spec"]["replicas"] == 2, 60)  # type: ignore[index]
        body = wait_ready(chart, "scaled", NAMESPACE)
        assert body["status"]["readyReplicas"] == 2
        # An HPA on the scale subresource (minReplicas above the current count: the HPA raises it
        # without needing a metrics server).
        chart.apply(
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "scaled", "namespace": NAMESPACE},
                "spec": {
                    "scaleTargetRef": {
                        "apiVersion": "m3fleet.dev/v1alpha1",
                        "kind": "MiniMaxM3Deployment",
                        "name": "scaled",
                    },
                    "minReplicas": 3,
                    "maxReplicas": 3,
                    "metrics": [
                        {
                            "type": "Resource",
                            "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                        }
                    ],
                },
            }
        )
        eventually(
            "the HPA set spec.replicas 3", lambda: chart.get("m3d", "scaled", NAMESPACE)["spec"]["replicas"] == 3, 90
        )  # type: ignore[index]
        eventually("Deployment at 3", lambda: chart.get("deployment", "scaled", NAMESPACE)["spec"]["replicas"] == 3, 60)  # type: ignore[index]
        assert wait_ready(chart, "scaled", NAMESPACE)["status"]["readyReplicas"] == 3
    finally:
        chart.kubectl("delete", "hpa/scaled", "-n", NAMESPACE, check=False)
        delete(chart, "scaled", NAMESPACE)


def test_delete_collects_the_children_and_keeps_the_weights(chart: Cluster, operator: OperatorProcess) -> None:
    document = renamed(dict(SINGLE_NODE)["vllm-h200-tp8"], "deleted", NAMESPACE)
    chart.apply(document)
    wait_ready(chart, "deleted", NAMESPACE)
    children = {
        kind: [o["metadata"]["name"] for o in chart.list(kind, NAMESPACE, "m3fleet.dev/name=deleted")]
        for kind in ("deployments", "services", "configmaps")
    }
    assert children["deployments"] == ["deleted"], children
    chart.kubectl("delete", "m3d/deleted", "-n", NAMESPACE, "--wait=true")
    for kind in ("deployments", "services", "configmaps", "pods"):
        eventually(
            f"{kind} of deleted collected",
            lambda kind=kind: not chart.list(kind, NAMESPACE, "m3fleet.dev/name=deleted"),
            90,
        )
    claims = {p["metadata"]["name"]: p["status"]["phase"] for p in chart.list("pvc", NAMESPACE)}
    assert claims.get("m3-weights") == "Bound", claims


def test_no_request_of_the_operator_was_forbidden(operator: OperatorProcess) -> None:
    assert operator.forbidden() == [], operator.forbidden()
    assert operator.requests(), "the audit log shows no request of the operator's ServiceAccount"


def _run(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl(*args, check=False)

"""Evictions take one engine pod at a time (real tier): the PodDisruptionBudget each fleet gets, read by the real
disruption controller (kube-controller-manager) and enforced by the real eviction API, the way `kubectl drain`
evicts. A two-replica Deployment fleet gives one pod up and refuses the second until the first is back; a
LeaderWorkerSet fleet's budget counts its leaders and workers; a fleet of one never holds a drain.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import delete, operated_namespace, pods, renamed, sample, wait_ready

NAMESPACE = "disruption"


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    with operated_namespace(chart, NAMESPACE, "operator-disruption") as running:
        yield running


def evict(cluster: Cluster, pod: str) -> tuple[bool, str]:
    """The eviction API, as `kubectl drain` calls it: (admitted, the API server's words)."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": NAMESPACE}}
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction"
    result = cluster.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(body), check=False)
    return result.returncode == 0, result.stderr


def budget(cluster: Cluster, name: str) -> dict[str, Any]:
    body = cluster.get("pdb", name, NAMESPACE)
    assert body is not None, f"no PodDisruptionBudget {name}"
    return body


def test_a_drain_takes_one_engine_pod_at_a_time(chart: Cluster, operator: OperatorProcess) -> None:
    fleet = renamed(sample("vllm-h200-tp8"), "two", NAMESPACE)
    fleet["spec"]["replicas"] = 2
    try:
        chart.apply(fleet)
        wait_ready(chart, "two", NAMESPACE)
        pdb = budget(chart, "two")
        assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        owner = pdb["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner.get("controller")) == ("MiniMaxM3Deployment", "two", True)
        eventually(
            "the disruption controller allows one",
            lambda: (
                (budget(chart, "two").get("status") or {}).get("disruptionsAllowed") == 1
                and budget(chart, "two")["status"].get("expectedPods") == 2
            ),
            60,
        )
        # As `kubectl drain` does, nodes are cordoned first: here every H200 node, so the replacement of an evicted
        # pod has nowhere to go and stays unready (kwok would otherwise make it ready within the test's next call).
        h200 = [n["metadata"]["name"] for n in chart.list("nodes", None, "nvidia.com/gpu.product=NVIDIA-H200")]
        for node in h200:
            chart.kubectl("cordon", node)
        first, second = sorted(p["metadata"]["name"] for p in pods(chart, "two", NAMESPACE))
        admitted, words = evict(chart, first)
        assert admitted, words
        admitted, words = evict(chart, second)  # the first's replacement cannot be ready
        assert not admitted and "disruption budget" in words, words
        assert chart.get("pod", second, NAMESPACE) is not None
        # Once the replacement is ready, the next pod may go.
        for node in h200:
            chart.kubectl("uncordon", node)
        eventually(
            "one disruption allowed again",
            lambda: (budget(chart, "two").get("status") or {}).get("disruptionsAllowed") == 1,
            90,
        )
        assert evict(chart, second)[0]
    finally:
        for node in [n["metadata"]["name"] for n in chart.list("nodes", None, "nvidia.com/gpu.product=NVIDIA-H200")]:
            chart.kubectl("uncordon", node, check=False)
        delete(chart, "two", NAMESPACE)
    eventually("its budget goes with it", lambda: chart.get("pdb", "two", NAMESPACE) is None, 60)


def test_a_group_counts_its_leader_and_workers_and_a_fleet_of_one_never_holds_a_drain(
    chart: Cluster, operator: OperatorProcess
) -> None:
    fleet = renamed(sample("vllm-h200-tp8"), "group", NAMESPACE)
    fleet["spec"]["parallelism"] = {"strategy": "tp", "tensorParallelSize": 16}  # one replica over two H200 nodes
    try:
        chart.apply(fleet)
        wait_ready(chart, "group", NAMESPACE)
        assert chart.get("leaderworkerset", "group", NAMESPACE) is not None
        eventually(
            "the budget counts both pods of the group",
            lambda: (budget(chart, "group").get("status") or {}).get("expectedPods") == 2,
            60,
        )
        eventually(
            "one allowed",
            lambda: (budget(chart, "group").get("status") or {}).get("disruptionsAllowed") == 1,
            60,
        )
        # A fleet of one replica: its pod may be evicted (a drain is never held), the group restarts.
        worker = next(
            p for p in pods(chart, "group", NAMESPACE) if p["metadata"]["labels"]["m3fleet.dev/role"] == "worker"
        )
        admitted, words = evict(chart, worker["metadata"]["name"])
        assert admitted, words
    finally:
        delete(chart, "group", NAMESPACE)

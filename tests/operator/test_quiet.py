"""Quiet at rest: no writes and no polling reads; a watch restart or an operator restart writes nothing;
only resources with autoscaling enabled are looked at between events."""

from __future__ import annotations

import asyncio
from pathlib import Path

import kmock

from tests.kube.waiting import eventually
from tests.operator.harness import (
    DEPLOYMENTS,
    LWS,
    M3D,
    TRTLLM,
    VLLM,
    Cluster,
    OperatorProcess,
    is_write,
    operator_requests,
    running_operator,
    sample,
)

RECONCILES = "m3fleet_reconciles_total"


async def converge_both(cluster: Cluster) -> list[str]:
    """A ready one-node vLLM resource and a ready two-node TensorRT-LLM one, then nothing left to do."""
    names = [await cluster.create(sample(VLLM)), await cluster.create(sample(TRTLLM))]
    await eventually(lambda: all(cluster.converged(n) for n in names))
    await cluster.report_workload(DEPLOYMENTS, names[0])
    await cluster.report_workload(LWS, names[1])
    await eventually(lambda: all(cluster.condition(n, "Ready")["status"] == "True" for n in names))
    await cluster.settled()
    return names


async def test_at_rest_nothing_is_written_or_read(cluster: Cluster, operator: OperatorProcess) -> None:
    """No resync and no polling: the watches are open and quiet, and so is the operator. Its own status
    writes come back as watch events and cause no reconcile."""
    await converge_both(cluster)
    reconciles = await operator.metric(RECONCILES)
    mark = len(list(cluster.kmock))
    await asyncio.sleep(3)
    assert [r.url.path_qs for r in operator_requests(list(cluster.kmock)[mark:])] == []
    assert await operator.metric(RECONCILES) == reconciles


async def test_watch_restart_writes_nothing(cluster: Cluster, operator: OperatorProcess) -> None:
    await converge_both(cluster)
    reconciles = await operator.metric(RECONCILES)
    cluster.kmock.reset_writes()
    assert cluster.kmock.expire_watches() >= 3
    # kopf lists again and delivers what it already had: nothing new, so no reconcile at all.
    await eventually(lambda: cluster.kmock.watching(M3D, host=operator.host) == 1)
    await cluster.settled()
    assert cluster.kmock.writes() == {}
    assert await operator.metric(RECONCILES) == reconciles


async def test_operator_restart_checks_every_child_and_writes_nothing(cluster: Cluster, tmp_path: Path) -> None:
    async with running_operator(cluster.kmock, tmp_path):
        names = await converge_both(cluster)
    cluster.kmock.reset_writes()
    children = sum(1 for n in names for key in cluster.children(n) if not key.startswith("Secret/"))
    async with running_operator(cluster.kmock, tmp_path) as operator:  # every resource reconciles when first seen

        async def reconciled() -> bool:
            return await operator.metric(RECONCILES) >= len(names)

        await eventually(reconciled)
        await cluster.settled()
    assert cluster.kmock.writes() == {}
    assert sum(cluster.kmock.dry_runs().values()) == children  # each child compared with the API server once


async def test_only_autoscaling_resources_are_ticked(cluster: Cluster, operator: OperatorProcess) -> None:
    """An autoscaling resource is ticked every intervalSeconds (here Prometheus is unreachable: the policy
    holds and says why, once); one without autoscaling costs no request at all between events."""
    plain = await cluster.create(sample(VLLM))
    doc = sample(VLLM)
    doc["metadata"]["name"] = scaled = "m3-autoscaled"
    doc["spec"]["autoscaling"] = {"enabled": True, "intervalSeconds": 5, "prometheus": {"url": "http://127.0.0.1:9"}}
    await cluster.create(doc)
    await eventually(lambda: cluster.converged(plain) and cluster.converged(scaled))
    for name in (plain, scaled):
        await cluster.report_workload(DEPLOYMENTS, cluster.child(name, "Deployment")["metadata"]["name"])
    await eventually(lambda: "autoscaling" in cluster.status(scaled), timeout=10)
    recorded = cluster.status(scaled)["autoscaling"]
    assert recorded["desiredReplicas"] == 1 and "prometheus" in recorded["reason"]
    await cluster.settled()
    mark = len(list(cluster.kmock))

    def about(name: str) -> list[kmock.Request]:
        return [r for r in operator_requests(list(cluster.kmock)[mark:]) if name in r.url.path_qs]

    await eventually(lambda: any("/pods" in r.url.path for r in about(scaled)), timeout=8)  # the next tick, 5 s on
    assert [r.url.path_qs for r in about(plain)] == []
    assert not [r for r in about(scaled) if is_write(r)]  # the same decision again: nothing to record

"""Quiet at rest: on unchanged resources, a resync, a watch restart or an operator restart writes nothing."""

from __future__ import annotations

import asyncio

import pytest

from m3fleet.controller.kube import M3D as M3D_KIND
from tests.kube.conftest_helpers import eventually
from tests.operator.harness import DEPLOYMENTS, LWS, NS, TRTLLM, VLLM, Cluster, operator_requests, sample

RESYNC = 60.0


async def converge_both(cluster: Cluster) -> list[str]:
    """A ready one-node vLLM resource and a ready two-node TensorRT-LLM one, then nothing left to do."""
    names = [await cluster.create(sample(VLLM)), await cluster.create(sample(TRTLLM))]
    await eventually(lambda: all(cluster.converged(n) for n in names))
    await cluster.report_workload(DEPLOYMENTS, names[0])
    await cluster.report_workload(LWS, names[1])
    await eventually(lambda: all(cluster.condition(n, "Ready")["status"] == "True" for n in names))
    await cluster.settled()
    return names


def operator_gets(cluster: Cluster, name: str, since: int) -> int:
    """How often the operator's own client read the resource: each reconcile starts with one GET."""
    path = f"{M3D_KIND.collection(NS)}/{name}"
    requests = operator_requests(cluster.kmock)
    return sum(1 for r in requests if r.id >= since and r.method.value == "GET" and r.url.path == path)


@pytest.mark.looptime
async def test_resync_writes_nothing(cluster: Cluster) -> None:
    async with cluster.operator(resync=RESYNC):
        names = await converge_both(cluster)
        cluster.kmock.reset_writes()
        mark = len(list(cluster.kmock))
        await asyncio.sleep(5 * RESYNC + 1)  # loop time: five resyncs in a fraction of a second
        assert all(operator_gets(cluster, n, mark) >= 5 for n in names)  # the resync did reconcile
        assert cluster.kmock.writes() == {}


async def test_watch_restart_writes_nothing(cluster: Cluster) -> None:
    async with cluster.operator():
        names = await converge_both(cluster)
        cluster.kmock.reset_writes()
        mark = len(list(cluster.kmock))
        assert cluster.kmock.expire_watches() >= 3  # the resource, Deployments and LeaderWorkerSets
        # kopf re-lists; the child handler reconciles both parents again from the fresh listing.
        await eventually(lambda: all(operator_gets(cluster, n, mark) >= 1 for n in names))
        await cluster.settled()
    assert cluster.kmock.writes() == {}


async def test_operator_restart_writes_nothing(cluster: Cluster) -> None:
    async with cluster.operator():
        names = await converge_both(cluster)
    cluster.kmock.reset_writes()
    mark = len(list(cluster.kmock))
    async with cluster.operator():  # a fresh registry and Reconciler: on.resume reconciles everything
        await eventually(lambda: all(operator_gets(cluster, n, mark) >= 1 for n in names))
        await cluster.settled()
    assert cluster.kmock.writes() == {}

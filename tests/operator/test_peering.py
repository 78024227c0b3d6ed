"""Standby replicas (kopf peering, no --standalone): the paused operator writes nothing at all, its own
retries and ticks included, and takes over when the active one goes.

Each operator talks to the emulator through a server of its own, so every request says who made it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import kmock

from tests.kube.waiting import eventually
from tests.operator.harness import (
    M3D,
    NS,
    PEERINGS,
    TRTLLM,
    VLLM,
    Cluster,
    OperatorProcess,
    is_write,
    running_operator,
    sample,
)

PRIORITY = "M3FLEET_PEERING_PRIORITY"


def status_attempts(cluster: Cluster, operator: OperatorProcess, name: str) -> int:
    path = cluster.path(M3D, name, "status")
    return sum(1 for r in cluster.kmock if operator.made(r) and r.method.value == "PATCH" and r.url.path == path)


async def paused(operator: OperatorProcess) -> float:
    return await operator.metric("m3fleet_paused")


async def test_the_standby_writes_nothing_until_the_active_replica_goes(cluster: Cluster, tmp_path: Path) -> None:
    cluster.kmock.seed(PEERINGS, {"metadata": {"name": "m3fleet", "namespace": NS}})
    failing = cluster.kmock.inject_error("PATCH", M3D, 500, subresource="status", namespace=NS, times=None)
    async with (
        kmock.Server(cluster.kmock) as standby_server,
        kmock.Server(cluster.kmock) as active_server,
        running_operator(
            cluster.kmock, tmp_path, url=str(standby_server.url), standalone=False, env={PRIORITY: "100"}
        ) as standby,
    ):
        # Alone, it is active: its status writes fail, and it keeps retrying (1 s, 2 s, 4 s, ...).
        busy = await cluster.create(sample(VLLM))
        await eventually(lambda: status_attempts(cluster, standby, busy) >= 2)

        async with running_operator(
            cluster.kmock, tmp_path, url=str(active_server.url), standalone=False, env={PRIORITY: "200"}
        ) as active:

            async def standing_by() -> bool:
                return await paused(standby) == 1

            await eventually(standing_by)
            await asyncio.sleep(0.5)  # a retry already under way when it paused may finish
            mark = len(list(cluster.kmock))
            other = await cluster.create(sample(TRTLLM))
            await eventually(lambda: len(cluster.children(other)) == 7)  # the active one works
            await eventually(lambda: status_attempts(cluster, active, busy) >= 2)
            await asyncio.sleep(4)  # the standby's next retries were due by now
            by_standby = [r for r in list(cluster.kmock)[mark:] if standby.made(r)]
            assert [r.url.path_qs for r in by_standby if is_write(r) and "kopfpeerings" not in r.url.path] == []
            assert await paused(active) == 0
            cluster.kmock.clear_errors()
            await eventually(lambda: cluster.converged(busy))

        # The active one stops (kopf withdraws its peer record): the standby takes over at once.
        async def active_again() -> bool:
            return await paused(standby) == 0

        await eventually(active_again)
        await cluster.patch_spec(other, {"replicas": 2})
        await eventually(lambda: cluster.child(other, "LeaderWorkerSet")["spec"]["replicas"] == 2)
        await eventually(lambda: cluster.converged(other))
        lws = cluster.path("leaderworkerset.x-k8s.io/v1/leaderworkersets", other)
        assert [r for r in list(cluster.kmock)[mark:] if standby.made(r) and is_write(r) and r.url.path == lws]
        assert failing.hits >= 4
    assert not standby.tracebacks()

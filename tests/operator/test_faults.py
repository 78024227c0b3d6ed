"""Faults on every write path, watch expiry and a crash between apply and status: the same end state.

Each fault is injected by the emulator *before* any state change (the write is rejected, not lost).
The end state of a faulted run (children and status, without resourceVersions, uids and times) must
equal the fault-free run of the same scenario. Recovery uses whatever the operator has: kopf's API
retries, handler retries, child events and a short resync; kopf's handler retries wait in wall-clock
time (looptime cannot shorten them), hence the short real resync rather than fake time here.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from tests.kube.conftest_helpers import eventually
from tests.operator.harness import (
    COMPUTE_DOMAINS,
    CONFIGMAPS,
    DEPLOYMENTS,
    LWS,
    M3D,
    NS,
    RESOURCE_OF_KIND,
    SCENARIOS,
    SECRETS,
    SERVICES,
    TRTLLM,
    VLLM,
    Cluster,
    baseline,
    sample,
)

RESYNC = 0.2  # real seconds: the safety net that also recovers from faults kopf does not retry

# Every write the operator (or kopf on its behalf) makes, and the scenario that makes it.
WRITE_PATHS: dict[str, tuple[str, str, str, str | None]] = {
    "apply-ConfigMap": ("trtllm", "PATCH", CONFIGMAPS, None),
    "apply-ComputeDomain": ("trtllm", "PATCH", COMPUTE_DOMAINS, None),
    "apply-LeaderWorkerSet": ("trtllm", "PATCH", LWS, None),
    "apply-Service": ("trtllm", "PATCH", SERVICES, None),
    "apply-Deployment": ("vllm-to-lws", "PATCH", DEPLOYMENTS, None),
    "prune-Deployment": ("vllm-to-lws", "DELETE", DEPLOYMENTS, None),
    "create-Secret": ("trtllm", "POST", SECRETS, None),
    "status": ("trtllm", "PATCH", M3D, "status"),
    "kopf-patch": ("trtllm", "PATCH", M3D, None),  # kopf's last-handled-configuration annotation
    "kopf-event": ("trtllm", "POST", "v1/events", None),
}


async def converges_to(cluster: Cluster, name: str, expected: dict[str, Any], timeout: float = 10) -> None:
    with contextlib.suppress(AssertionError):
        await eventually(lambda: cluster.end_state(name) == expected, timeout=timeout)
    assert cluster.end_state(name) == expected  # on failure: pytest's diff of the two end states


def never_recreated(cluster: Cluster, name: str) -> None:
    """No duplicates: every child was created exactly once and never deleted in between."""
    for key in cluster.children(name):
        kind, child = key.split("/", 1)
        history = cluster.history(RESOURCE_OF_KIND[kind], child)
        assert None not in history, f"{key} was deleted and created again"
        assert len({v["metadata"]["uid"] for v in history if v}) == 1


def unexpected_tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Errors logged with a traceback, i.e. not mapped to a retry. kopf's own throttling after its own
    patch was rejected (409/422 on kopf-patch) is kopf's behaviour and logs one by design."""
    return [r.getMessage() for r in caplog.records if r.exc_info and not r.getMessage().startswith("Throttling")]


@pytest.mark.parametrize("code", [409, 422, 429, 500])
@pytest.mark.parametrize("path", list(WRITE_PATHS))
async def test_fault_on_write_path_converges(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, path: str, code: int
) -> None:
    scenario, method, resource, subresource = WRITE_PATHS[path]
    expected = await baseline(scenario)
    # A 429 carries Retry-After: 1 (the emulator's default, as the apiserver's throttling always says).
    fault = cluster.kmock.inject_error(method, resource, code, subresource=subresource, namespace=NS)
    async with cluster.operator(resync=RESYNC):
        name = await SCENARIOS[scenario](cluster)
        await converges_to(cluster, name, expected)
    assert fault.hits == 1, f"the {path} write was never attempted"
    never_recreated(cluster, name)
    assert not unexpected_tracebacks(caplog)


async def test_watch_410_converges(cluster: Cluster) -> None:
    expected = await baseline("vllm-to-lws")
    for resource in (M3D, DEPLOYMENTS, LWS):  # the very first watch of each resource is already too old
        cluster.kmock.inject_error("WATCH", resource, 410)
    async with cluster.operator():
        scenario = asyncio.create_task(SCENARIOS["vllm-to-lws"](cluster))
        expiries = 0
        while not scenario.done():  # and every watch keeps expiring (history compacted): kopf must re-list
            expiries += cluster.kmock.expire_watches()
            await asyncio.sleep(0.05)
        name = await scenario
        await converges_to(cluster, name, expected)
    assert expiries >= 3
    never_recreated(cluster, name)


async def test_retry_after_is_honoured(cluster: Cluster) -> None:
    """A throttled first apply: nothing else can trigger a reconcile, so kopf's retry must come after 1 s."""
    fault = cluster.kmock.inject_error("PATCH", DEPLOYMENTS, 429, retry_after=1, namespace=NS)
    loop = asyncio.get_running_loop()
    async with cluster.operator():  # resync far away
        name = await cluster.create(sample(VLLM))
        await eventually(lambda: fault.hits == 1)
        throttled = loop.time()
        await eventually(lambda: cluster.get(DEPLOYMENTS, name) is not None)
        waited = loop.time() - throttled
        await eventually(lambda: cluster.converged(name))
    assert 0.9 <= waited < 4  # Retry-After, not the 5 s default


async def test_operator_stopped_between_child_apply_and_status_write(cluster: Cluster) -> None:
    """Chaos: the children are applied, every status write fails, the operator dies; a new one finishes."""
    expected = await baseline("trtllm")
    fault = cluster.kmock.inject_error("PATCH", M3D, 500, subresource="status", namespace=NS, times=None)
    async with cluster.operator(resync=0.1):
        name = await cluster.create(sample(TRTLLM))
        await eventually(lambda: fault.hits >= 3)
        applied = cluster.children(name)
        assert set(applied) == set(expected["children"]) and "status" not in cluster.m3d(name)
    cluster.kmock.clear_errors()
    async with cluster.operator():
        await converges_to(cluster, name, expected)
        await cluster.settled()
    never_recreated(cluster, name)
    secret = f"Secret/{name}-mpi-ssh"
    assert cluster.children(name)[secret] == applied[secret]  # the generated key survived, untouched
    assert sum(1 for r in cluster.kmock if r.method.value == "POST" and r.url.path.endswith("/secrets")) == 1

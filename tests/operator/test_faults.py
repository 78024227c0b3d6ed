"""Faults a real API server cannot be made to produce on demand: the operator must converge all the same.

Each fault is injected by the emulator *before* any state change (the write is rejected, not lost). The
end state of a faulted run (children and status, without resourceVersions, uids and times) must equal the
fault-free run of the same scenarios. Recovery is the operator's own: its work queue retries a failed
reconcile after a backoff (or the server's Retry-After), and any event for the resource retries at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from pathlib import Path
from typing import Any

import pytest

from tests.kube.waiting import eventually
from tests.operator.harness import (
    COMPUTE_DOMAINS,
    CONFIGMAPS,
    DEPLOYMENTS,
    LWS,
    M3D,
    NS,
    RESOURCE_OF_KIND,
    SECRETS,
    SERVICES,
    TRTLLM,
    TWO_NODES,
    VLLM,
    Cluster,
    baselines,
    run_scenarios,
    running_operator,
    sample,
)

# Every write the operator makes (and kopf, posting its Events), each hit by one of the scenarios.
WRITE_PATHS: dict[str, tuple[str, str, str | None]] = {
    "apply-ConfigMap": ("PATCH", CONFIGMAPS, None),
    "apply-ComputeDomain": ("PATCH", COMPUTE_DOMAINS, None),
    "apply-LeaderWorkerSet": ("PATCH", LWS, None),
    "apply-Service": ("PATCH", SERVICES, None),
    "apply-Deployment": ("PATCH", DEPLOYMENTS, None),
    "prune-Deployment": ("DELETE", DEPLOYMENTS, None),
    "create-Secret": ("POST", SECRETS, None),
    "status": ("PATCH", M3D, "status"),
    "event": ("POST", "v1/events", None),
}


async def converges_to(cluster: Cluster, name: str, expected: dict[str, Any], timeout: float = 20) -> None:
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


@pytest.mark.parametrize("code", [409, 422, 429, 500])
async def test_a_fault_on_every_write_path_converges(cluster: Cluster, tmp_path: Path, code: int) -> None:
    """Every write path fails once (a 429 with Retry-After: 1, as the apiserver's throttling says)."""
    expected = await baselines(tmp_path / "baseline")
    faults = {
        path: cluster.kmock.inject_error(method, resource, code, subresource=sub, namespace=NS, dry_run=False)
        for path, (method, resource, sub) in WRITE_PATHS.items()
    }
    async with running_operator(cluster.kmock, tmp_path) as operator:
        names = await run_scenarios(cluster)
        for scenario, name in names.items():
            await converges_to(cluster, name, expected[scenario])
    assert {path: fault.hits for path, fault in faults.items()} == dict.fromkeys(WRITE_PATHS, 1)
    for name in names.values():
        never_recreated(cluster, name)
    assert not operator.tracebacks()


async def test_watch_410_converges(cluster: Cluster, tmp_path: Path) -> None:
    expected = await baselines(tmp_path / "baseline")
    for resource in (M3D, DEPLOYMENTS, LWS):  # the very first watch of each resource is already too old
        cluster.kmock.inject_error("WATCH", resource, 410)
    async with running_operator(cluster.kmock, tmp_path):
        scenarios = asyncio.create_task(run_scenarios(cluster))
        expiries = 0
        while not scenarios.done():  # and every watch keeps expiring (history compacted): kopf must re-list
            expiries += cluster.kmock.expire_watches()
            await asyncio.sleep(0.1)
        names = await scenarios
        for scenario, name in names.items():
            await converges_to(cluster, name, expected[scenario])
    assert expiries >= 3
    for name in names.values():
        never_recreated(cluster, name)


async def test_a_child_edited_while_its_watch_is_down_is_restored_from_the_re_list(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Every watch of Deployments fails (410 Gone), so kopf lists them over and over: the hand edit reaches the
    operator only as a listed object in a version it has not seen. That is news; the versions it has seen are not
    (the quiet tier checks a restart with nothing changed reconciles nothing)."""
    async with running_operator(cluster.kmock, tmp_path):
        name = await cluster.create(sample(VLLM))
        await eventually(lambda: cluster.converged(name))
        await cluster.report_workload(DEPLOYMENTS, name)
        await cluster.settled()
        cluster.kmock.inject_error("WATCH", DEPLOYMENTS, 410, times=None)
        cluster.kmock.expire_watches(DEPLOYMENTS)
        await cluster.edit(DEPLOYMENTS, name, {"spec": {"replicas": 3}})
        await eventually(lambda: cluster.get(DEPLOYMENTS, name)["spec"]["replicas"] == 1, timeout=15)
        cluster.kmock.clear_errors()


async def test_retry_after_is_honoured(cluster: Cluster, tmp_path: Path) -> None:
    """A throttled first apply: nothing else can trigger a reconcile, so the retry comes after Retry-After
    (2 s here), not after the first backoff step (1 s)."""
    fault = cluster.kmock.inject_error("PATCH", DEPLOYMENTS, 429, retry_after=2, namespace=NS)
    loop = asyncio.get_running_loop()
    async with running_operator(cluster.kmock, tmp_path):
        name = await cluster.create(sample(VLLM))
        await eventually(lambda: fault.hits == 1)
        throttled = loop.time()
        await eventually(lambda: cluster.get(DEPLOYMENTS, name) is not None)
        waited = loop.time() - throttled
        await eventually(lambda: cluster.converged(name))
    assert 1.9 <= waited < 4


async def test_a_rejected_update_is_reported_and_its_fix_applies_at_once(cluster: Cluster, tmp_path: Path) -> None:
    """The API server rejects the new Deployment (422, e.g. an admission webhook): Degraded/ApplyFailed, the
    running children stay. The user's next change is applied at once, not after a long backoff."""
    async with running_operator(cluster.kmock, tmp_path):
        name = await cluster.create(sample(VLLM))
        await eventually(lambda: cluster.converged(name))
        rejection = cluster.kmock.inject_error("PATCH", DEPLOYMENTS, 422, namespace=NS, times=None, dry_run=False)
        await cluster.patch_spec(name, {"engine": {"extraArgs": ["--max-num-seqs=64"]}})
        await eventually(lambda: cluster.condition(name, "Degraded")["reason"] == "ApplyFailed")
        assert "422" in cluster.condition(name, "Degraded")["message"]
        await eventually(lambda: rejection.hits >= 3, timeout=15)  # retried with a backoff (1 s, 2 s, ...)
        cluster.kmock.clear_errors()
        loop = asyncio.get_running_loop()
        fixed = loop.time()
        await cluster.patch_spec(name, {"engine": {"extraArgs": ["--max-num-seqs=32"]}})
        await eventually(lambda: cluster.converged(name) and cluster.status(name)["observedGeneration"] == 3)
        assert loop.time() - fixed < 2
        container = cluster.child(name, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert "--max-num-seqs=32" in [*container.get("command", []), *container.get("args", [])]


async def test_operator_stopped_between_child_apply_and_status_write(cluster: Cluster, tmp_path: Path) -> None:
    """Chaos: the children are applied, every status write fails, the operator is killed; a new one
    finishes (its first look at each child, a dry run, fails once too), and never regenerates the key."""
    expected = (await baselines(tmp_path / "baseline"))["trtllm"]
    fault = cluster.kmock.inject_error("PATCH", M3D, 500, subresource="status", namespace=NS, times=None)
    async with running_operator(cluster.kmock, tmp_path) as first:
        name = await cluster.create(sample(TRTLLM))
        await eventually(lambda: fault.hits >= 2)
        applied = cluster.children(name)
        assert set(applied) == set(expected["children"]) and "status" not in cluster.m3d(name)
        await first.stop(kill=True)
    cluster.kmock.clear_errors()
    dry_run = cluster.kmock.inject_error("PATCH", LWS, 500, namespace=NS, dry_run=True)
    async with running_operator(cluster.kmock, tmp_path) as second:
        await converges_to(cluster, name, expected)
        await cluster.settled()
    assert dry_run.hits == 1
    never_recreated(cluster, name)
    secret = f"Secret/{name}-mpi-ssh"
    assert cluster.children(name)[secret] == applied[secret]  # the generated key survived, untouched
    assert sum(1 for r in cluster.kmock if r.method.value == "POST" and r.url.path.endswith("/secrets")) == 1
    private_key = base64.b64decode(applied[secret]["data"]["id_ed25519"]).decode()
    for log in (first.log(), second.log()):
        assert not [s for s in [applied[secret]["data"]["id_ed25519"], *private_key.splitlines()[1:-1]] if s in log]
    assert not second.tracebacks()


@pytest.mark.apis(lws=False)
async def test_a_fleet_blocked_on_a_missing_api_is_applied_once_the_api_is_installed(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Installing LeaderWorkerSet sends the operator no event about the resource it blocked: it must look again by
    itself (once the discovery it caches, 30 s, is asked again), not wait for an edit or a restart."""
    document = sample(VLLM)
    document["spec"].update(TWO_NODES)
    async with running_operator(cluster.kmock, tmp_path):
        name = await cluster.create(document)
        await eventually(lambda: cluster.condition(name, "Degraded").get("reason") == "LeaderWorkerSetNotInstalled")
        cluster.kmock.declare(LWS, "LeaderWorkerSet", subresources=("status", "scale"))
        await eventually(lambda: cluster.get(LWS, name) is not None, timeout=75)
        await cluster.report_workload(LWS, name)
        await eventually(lambda: cluster.condition(name, "Degraded").get("reason") == "AsExpected")


async def test_a_rejected_workload_keeps_the_secret_the_running_one_mounts(cluster: Cluster, tmp_path: Path) -> None:
    """A multi-node TensorRT-LLM fleet mounts its generated SSH Secret. A change to one node (no Secret needed)
    whose Deployment the API server rejects leaves the LeaderWorkerSet running: its Secret must stay. It goes once
    the Deployment is applied."""
    async with running_operator(cluster.kmock, tmp_path):
        name = await cluster.create(sample(TRTLLM))
        await eventually(lambda: cluster.converged(name))
        [secret] = cluster.status(name)["generatedSecrets"]
        rejection = cluster.kmock.inject_error("PATCH", DEPLOYMENTS, 422, namespace=NS, times=None, dry_run=False)
        await cluster.patch_spec(
            name, {"accelerator": "h200", "parallelism": {"strategy": "tp-ep", "tensorParallelSize": 8}}
        )
        await eventually(lambda: cluster.condition(name, "Degraded").get("reason") == "ApplyFailed")
        await eventually(lambda: rejection.hits >= 2)  # and retried
        assert cluster.get(SECRETS, secret) is not None, "the running LeaderWorkerSet's Secret was deleted"
        assert cluster.get(LWS, name) is not None
        cluster.kmock.clear_errors()
        await eventually(lambda: cluster.get(DEPLOYMENTS, name) is not None)
        await eventually(lambda: cluster.get(SECRETS, secret) is None and cluster.get(LWS, name) is None)

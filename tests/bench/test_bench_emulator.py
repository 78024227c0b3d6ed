"""`m3fleet bench` end to end against the apiserver emulator, run as a user runs it: the console entry point
with a kubeconfig (KUBECONFIG) aimed at the emulator. The test plays the Job controller and the kubelet (the
emulator has no pod lifecycle): it adds the Job's pod, serves its log (a real vLLM client log, from
tests/bench/fixtures) and marks the Job complete. The real control plane tier (tests/cluster/) is the
source of truth for the Job itself; this holds the command's own behaviour: what it refuses, what it creates
and owns, what it keeps and what it cleans up.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import kmock as kmock_lib
import pytest
import yaml

from m3fleet.bench.results import RESULT_KEY, BenchResult
from m3fleet.cli import main
from m3fleet.exitcodes import EXIT_BENCH_FAILED
from m3fleet.render import service_name
from tests.kube.emulator import ApiServerEmulator
from tests.operator.harness import M3D, NS, declare_cluster, sample
from tests.support.samples import SAMPLES_DIR

pytestmark = pytest.mark.kmock(cls=ApiServerEmulator)

JOBS, PODS, CONFIGMAPS = "batch/v1/jobs", "v1/pods", "v1/configmaps"
SAMPLE = SAMPLES_DIR / "vllm-h200-tp8.yaml"
NAME = "m3-vllm-h200-tp8"
FIXTURE_LOG = Path(__file__).with_name("fixtures") / "vllm-standin.log"
# The fixture's workload: input 32, output 8, concurrency 1 then 4, 8 prompts each.
ARGS = ("--input-len", "32", "--output-len", "8", "--concurrency", "1,4", "--num-prompts", "8", "--timeout", "600")


@pytest.fixture
def emulator(kmock: ApiServerEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ApiServerEmulator:
    declare_cluster(kmock)
    kmock.declare(JOBS, "Job", subresources={"status"})
    server = str(kmock.url).rstrip("/")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "me", "namespace": NS}}],
        "current-context": "emulator",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    return kmock


def seed_resource(kmock: ApiServerEmulator, ready: str = "True") -> dict[str, Any]:
    doc = sample("vllm-h200-tp8")
    condition = {
        "type": "Ready",
        "status": ready,
        "reason": "AllReplicasReady" if ready == "True" else "RolloutInProgress",
        "message": "" if ready == "True" else "0 of 1 replicas ready",
        "observedGeneration": 1,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    doc["status"] = {"observedGeneration": 1, "conditions": [condition], "readyReplicas": 1 if ready == "True" else 0}
    return kmock.seed(M3D, doc)


async def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["bench", "-f", str(SAMPLE), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def jobs(kmock: ApiServerEmulator) -> list[dict[str, Any]]:
    found = []
    for (resource, namespace, name), obj in kmock.objects.items():
        if resource == kmock_lib.resource(JOBS) and namespace == NS and not obj.deleted:
            body = kmock.get_object(resource, namespace, name)
            if body is not None:
                found.append(body)
    return found


async def created_job(kmock: ApiServerEmulator, task: asyncio.Task[Any]) -> dict[str, Any]:
    for _ in range(200):
        found = jobs(kmock)
        if found:
            return found[0]
        assert not task.done(), task.result() if task.done() else None
        await asyncio.sleep(0.05)
    raise AssertionError("m3fleet bench created no Job")


async def patch_status(kmock: ApiServerEmulator, path: str, status: dict[str, Any]) -> None:
    headers = {"Content-Type": "application/merge-patch+json"}
    async with (
        aiohttp.ClientSession() as session,
        session.patch(f"{str(kmock.url).rstrip('/')}{path}/status", json={"status": status}, headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()


def start_pod(kmock: ApiServerEmulator, job: dict[str, Any], waiting: dict[str, str] | None = None) -> str:
    name = f"{job['metadata']['name']}-x7k2p"
    state = {"waiting": waiting} if waiting else {"running": {"startedAt": "2026-01-01T00:00:05Z"}}
    pod = {
        "metadata": {"name": name, "namespace": NS, "labels": {"job-name": job["metadata"]["name"]}},
        "spec": job["spec"]["template"]["spec"],
        "status": {
            "phase": "Pending" if waiting else "Running",
            "containerStatuses": [{"name": "bench", "state": state}],
        },
    }
    kmock.seed(PODS, pod)
    return name


async def test_a_benchmark_runs_is_kept_and_cleaned_up(
    emulator: ApiServerEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    owner = seed_resource(emulator)
    task = asyncio.create_task(bench(capsys, *ARGS))
    job = await created_job(emulator, task)
    assert job["metadata"]["ownerReferences"] == [
        {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": NAME, "uid": owner["metadata"]["uid"]}
    ]
    assert job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "m3fleet-bench"
    pod = start_pod(emulator, job)
    log = FIXTURE_LOG.read_text()
    emulator["get", re.compile(rf"^/api/v1/namespaces/{NS}/pods/{pod}/log$")] << log.encode()
    complete = {"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:01:00Z"}
    await patch_status(
        emulator,
        f"/apis/batch/v1/namespaces/{NS}/jobs/{job['metadata']['name']}",
        {"conditions": [complete], "succeeded": 1},
    )
    code, out, err = await task
    assert code == 0, err
    assert out.splitlines()[0] == "============ Serving Benchmark Result ============"
    assert out.splitlines()[1].split() == ["Max", "concurrency:", "1", "4"]
    assert f"Job {NS}/{job['metadata']['name']}" in err and "result kept in configmap" in err
    kept = emulator.get_object(CONFIGMAPS, NS, job["metadata"]["name"])
    assert kept is not None and kept["metadata"]["ownerReferences"] == job["metadata"]["ownerReferences"]
    result = BenchResult.from_document(json.loads(kept["data"][RESULT_KEY]))
    assert [r.completed for r in result.runs] == [8, 8] and result.complete and result.ready_replicas == 1
    assert (
        result.target["url"] == f"http://{service_name(NAME)}.{NS}.svc:8000"
        and result.resource["uid"] == owner["metadata"]["uid"]
    )
    gone = emulator.get_object(JOBS, NS, job["metadata"]["name"])
    assert gone is None or gone["metadata"].get("deletionTimestamp")


async def test_a_pod_that_cannot_start_stops_the_benchmark(
    emulator: ApiServerEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_resource(emulator)
    task = asyncio.create_task(bench(capsys, *ARGS, "--api-key-secret", "m3-api-key/token"))
    job = await created_job(emulator, task)
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": {"name": "m3-api-key", "key": "token"}}} in env
    start_pod(emulator, job, {"reason": "CreateContainerConfigError", "message": 'secret "m3-api-key" not found'})
    code, out, err = await task
    assert (code, out) == (EXIT_BENCH_FAILED, "")
    assert 'the benchmark pod cannot start: CreateContainerConfigError: secret "m3-api-key" not found' in err
    gone = emulator.get_object(JOBS, NS, job["metadata"]["name"])
    assert gone is None or gone["metadata"].get("deletionTimestamp")
    assert emulator.get_object(CONFIGMAPS, NS, job["metadata"]["name"]) is None


@pytest.mark.parametrize("ready", [None, "False"])
async def test_a_missing_or_unready_resource_is_refused(
    emulator: ApiServerEmulator, capsys: pytest.CaptureFixture[str], ready: str | None
) -> None:
    if ready is not None:
        seed_resource(emulator, ready)
    code, out, err = await bench(capsys, *ARGS)
    assert (code, out) == (2, "") and err.count("\n") == 1
    if ready is None:
        assert f"minimaxm3deployment {NS}/{NAME} does not exist in kube context 'emulator'" in err
    else:
        assert "cannot be benchmarked: it is not Ready (RolloutInProgress: 0 of 1 replicas ready)" in err
        assert f"fix: wait for it: kubectl wait m3d/{NAME} -n {NS} --for=condition=Ready" in err
    assert jobs(emulator) == []

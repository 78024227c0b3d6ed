"""`m3fleet bench` on the real tier, run as a user runs it (the console script, with the user's kubeconfig):
the Job is created next to the resource, owned by it (not controlled: the operator never prunes it),
scheduled on the resource's pool without a GPU, completed by kwok, and collected with the resource.

kwok runs no containers and serves no pod logs, so the benchmark client never runs here and the command
fails (exit 1) when it reads the Job's log, keeping the Job; parsing real client output is proven in the
engine-parser tier (tests/engine_parsers/test_bench_clients.py). Through the proxy of the fault tier, standing in
for the kubelet with a real vLLM client's log (tests/bench/fixtures), the command runs to its end: the result kept
in a ConfigMap owned by the resource, the Job cleaned up; reporting what a kubelet would of a pod whose Secret is
missing (kwok checks none), the command stops, says why and deletes its Job."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.bench_results import FIXTURES
from tests.support.cluster.cluster import BIN, Cluster, OperatorProcess, eventually
from tests.support.cluster.faultproxy import FaultProxy
from tests.support.cluster.fleet import (
    NODE_POOL,
    delete,
    operated_namespace,
    renamed,
    sample,
    wait_ready,
    write_manifest,
)

from m3fleet.bench.results import RESULT_KEY, BenchResult
from m3fleet.exitcodes import EXIT_BENCH_FAILED
from m3fleet.render import service_name

NAMESPACE = "benchjob"
BENCH_SELECTOR = "app.kubernetes.io/managed-by=m3fleet-bench"


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    with operated_namespace(chart, NAMESPACE, "operator-bench-job") as running:
        yield running


def bench(
    cluster: Cluster, manifest: Path, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig or cluster.kubeconfig)}
    command = [str(BIN / "m3fleet"), "bench", "-f", str(manifest), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)


def test_the_bench_job_runs_next_to_the_resource_and_goes_with_it(
    chart: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    document = renamed(sample("vllm-h200-tp8"), "bench-target", NAMESPACE)
    chart.apply(document)
    body = wait_ready(chart, "bench-target", NAMESPACE)
    manifest = write_manifest(tmp_path, document)
    result = bench(
        chart, manifest, "--input-len", "32", "--output-len", "8", "--concurrency", "1", "--num-prompts", "4"
    )
    assert result.returncode == EXIT_BENCH_FAILED, (result.returncode, result.stderr)  # kwok's pod prints no result
    [job] = chart.list("jobs", NAMESPACE, f"{BENCH_SELECTOR},m3fleet.dev/name=bench-target")
    [owner] = job["metadata"]["ownerReferences"]
    assert owner["kind"] == "MiniMaxM3Deployment" and owner["uid"] == body["metadata"]["uid"]
    assert not owner.get("controller"), owner  # owned, never controlled: the operator's pruning skips it
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == _engine_image(chart, "bench-target")
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources") or {})
    [pod] = chart.list("pods", NAMESPACE, BENCH_SELECTOR)
    assert NODE_POOL[pod["spec"]["nodeName"]] == "h200", pod["spec"].get("nodeName")

    def completed() -> bool:
        current = chart.get("job", job["metadata"]["name"], NAMESPACE) or {}
        conditions = (current.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    eventually("kwok completes the Job's pod and the Job controller the Job", completed, 60)
    delete(chart, "bench-target", NAMESPACE)
    eventually("the Job collected with its resource", lambda: not chart.list("jobs", NAMESPACE, BENCH_SELECTOR), 90)


def test_a_resource_that_is_not_ready_is_refused_and_nothing_is_created(
    chart: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    document = renamed(sample("vllm-h200-tp8"), "bench-pending", NAMESPACE)
    document["spec"]["nodePool"] = {"nodeSelector": {"example.com/pool": "none"}}
    chart.apply(document)
    try:
        eventually(
            "the resource has a status", lambda: (chart.get("m3d", "bench-pending", NAMESPACE) or {}).get("status"), 60
        )
        result = bench(chart, write_manifest(tmp_path, document))
        assert result.returncode == 2 and "Ready" in result.stderr, (result.returncode, result.stderr)
        assert chart.list("jobs", NAMESPACE, f"{BENCH_SELECTOR},m3fleet.dev/name=bench-pending") == []
        missing = renamed(document, "no-such-resource", NAMESPACE)
        result = bench(chart, write_manifest(tmp_path, missing))
        assert result.returncode == 2 and "no-such-resource" in result.stderr, result.stderr
        assert chart.list("jobs", NAMESPACE, f"{BENCH_SELECTOR},m3fleet.dev/name=no-such-resource") == []
    finally:
        delete(chart, "bench-pending", NAMESPACE)


def user_through(cluster: Cluster, proxy: FaultProxy) -> Path:
    """A kubeconfig of this namespace's admin, through the proxy: a token (the proxy passes headers, not client
    certificates)."""
    cluster.kubectl("create", "serviceaccount", "bench-user", "-n", NAMESPACE, check=False)
    user = f"--serviceaccount={NAMESPACE}:bench-user"
    cluster.kubectl("create", "rolebinding", "bench-user", "--clusterrole=admin", user, "-n", NAMESPACE, check=False)
    kubeconfig, _, _ = cluster.service_account_kubeconfig(NAMESPACE, "bench-user", proxy.server)
    return kubeconfig


def job_named_in(stderr: str) -> str:
    job = re.search(rf"Job {NAMESPACE}/(\S+)", stderr)
    assert job is not None, stderr
    return job.group(1)


def test_a_benchmark_that_runs_to_its_end_keeps_its_result_and_cleans_up_its_job(
    chart: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = "bench-done"
    document = renamed(sample("vllm-h200-tp8"), name, NAMESPACE)
    chart.apply(document)
    try:
        body = wait_ready(chart, name, NAMESPACE)
        with FaultProxy(chart.control_plane, chart.workdir).running() as proxy:
            log = (FIXTURES / "vllm-standin.log").read_bytes()  # input 32, output 8, concurrency 1 then 4, 8 prompts
            proxy.stand_in("get", "pods", log, subresource="log", namespace=NAMESPACE, times=None)
            kubeconfig = user_through(chart, proxy)
            args = ("--input-len", "32", "--output-len", "8", "--concurrency", "1,4", "--num-prompts", "8")
            result = bench(chart, write_manifest(tmp_path, document), *args, kubeconfig=kubeconfig)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == "============ Serving Benchmark Result ============"
        assert lines[1].split() == ["Max", "concurrency:", "1", "4"]
        job_name = job_named_in(result.stderr)
        assert "result kept in configmap" in result.stderr
        kept = chart.get("configmap", job_name, NAMESPACE)
        assert kept is not None
        [owner] = kept["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("MiniMaxM3Deployment", body["metadata"]["uid"])
        measured = BenchResult.from_document(json.loads(kept["data"][RESULT_KEY]))
        assert [r.completed for r in measured.runs] == [8, 8] and measured.complete and measured.ready_replicas == 1
        assert measured.target["url"] == f"http://{service_name(name)}.{NAMESPACE}.svc:8000"
        eventually("the Job cleaned up", lambda: chart.get("job", job_name, NAMESPACE) is None, 60)
    finally:
        delete(chart, name, NAMESPACE)


MISSING_KEY = 'secret "m3-api-key" not found'


def cannot_start(pods: dict[str, Any]) -> None:
    """What a kubelet reports of a pod whose container names a Secret that does not exist (kwok checks none)."""
    waiting = {"reason": "CreateContainerConfigError", "message": MISSING_KEY}
    for pod in pods.get("items") or []:
        statuses = [
            {"name": c["name"], "ready": False, "restartCount": 0, "state": {"waiting": waiting}}
            for c in pod["spec"]["containers"]
        ]
        pod["status"] = {"phase": "Pending", "containerStatuses": statuses}


def unfinished(job: dict[str, Any]) -> None:
    """The Job as long as its pod cannot start: no outcome (kwok completes every pod)."""
    for key in ("conditions", "succeeded", "failed", "completionTime"):
        (job.get("status") or {}).pop(key, None)


def test_a_benchmark_pod_that_cannot_start_stops_the_benchmark(
    chart: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Its API-key Secret missing, the pod cannot start: the command says so, deletes its Job and keeps no result."""
    name = "bench-unstartable"
    document = renamed(sample("vllm-h200-tp8"), name, NAMESPACE)
    chart.apply(document)
    try:
        wait_ready(chart, name, NAMESPACE)
        with FaultProxy(chart.control_plane, chart.workdir).running() as proxy:
            proxy.rewrite("list", "pods", cannot_start, namespace=NAMESPACE, times=None)
            proxy.rewrite("get", "jobs", unfinished, namespace=NAMESPACE, times=None)
            manifest, key = write_manifest(tmp_path, document), ("--api-key-secret", "m3-api-key/token")
            result = bench(chart, manifest, *key, kubeconfig=user_through(chart, proxy))
        assert (result.returncode, result.stdout) == (EXIT_BENCH_FAILED, ""), result.stderr
        assert f"the benchmark pod cannot start: CreateContainerConfigError: {MISSING_KEY}" in result.stderr
        job_name = job_named_in(result.stderr)
        eventually("the Job deleted", lambda: chart.get("job", job_name, NAMESPACE) is None, 60)
        assert chart.get("configmap", job_name, NAMESPACE) is None
    finally:
        delete(chart, name, NAMESPACE)


def _engine_image(cluster: Cluster, name: str) -> Any:
    deployment = cluster.get("deployment", name, NAMESPACE)
    assert deployment is not None
    return deployment["spec"]["template"]["spec"]["containers"][0]["image"]

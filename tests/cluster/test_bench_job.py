"""`m3fleet bench` on the real tier, run as a user runs it (the console script, with the user's kubeconfig):
the Job is created next to the resource, owned by it (not controlled: the operator never prunes it),
scheduled on the resource's pool without a GPU, completed by kwok, and collected with the resource.

kwok runs no containers and serves no pod logs, so the benchmark client never runs here and the command
fails (exit 1) when it reads the Job's log, keeping the Job; parsing real client output is proven in the
engine-parser tier (tests/engine_parsers/test_bench_clients.py)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.cluster.cluster import BIN, Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import (
    NODE_POOL,
    delete,
    operated_namespace,
    renamed,
    sample,
    wait_ready,
    write_manifest,
)

from m3fleet.exitcodes import EXIT_BENCH_FAILED

NAMESPACE = "benchjob"
BENCH_SELECTOR = "app.kubernetes.io/managed-by=m3fleet-bench"


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    with operated_namespace(chart, NAMESPACE, "operator-bench-job") as running:
        yield running


def bench(cluster: Cluster, manifest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
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


def _engine_image(cluster: Cluster, name: str) -> Any:
    deployment = cluster.get("deployment", name, NAMESPACE)
    assert deployment is not None
    return deployment["spec"]["template"]["spec"]["containers"][0]["image"]

"""MiniMaxM3ModelCache on the real tier: admission, the staging Jobs pinned to each pool node and completed, node
labels, status and `kubectl get` columns, a node joining the pool staged at once, bad input reported without
touching what is staged, the pre-pull DaemonSet, a deployment that requires the cache's nodes and mounts the
copy, a failed staging pod retried and never labelled, a rejected source failing its Job at once, and removal
(labels off, cleanup Jobs, finalizer released). The operator runs as the chart's ServiceAccount.

What kwok leaves unproven: kwok runs no containers. On kwok nodes a Job's pod is moved to Running and then
Succeeded by kwok's stages, and the real job controller (kube-controller-manager) then marks the Job Complete;
so here a "completed" staging Job proves the operator's wiring (Job spec admitted, pinned by the real scheduler,
its completion read, the node labelled), not the staging program, which is proven on its own against a stand-in
Hugging Face Hub and a claim directory (tests/services/test_stage.py, the same `m3fleet stage` console script the
Job runs). Failures are driven on a node that no kwok process manages (the test plays its kubelet and patches the
pod's status to Failed with the exit code and termination message `m3fleet stage` writes); the real job
controller then retries the pod or, for exit code 3, fails the Job by its pod failure policy. Not proven here:
that images are really pulled (no container runtime), hostPath mounts, and that the engine loads the copy.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.cluster.cluster import OPERATOR_NAMESPACE, Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import condition, delete, operated_namespace, renamed, sample, wait_ready

NAMESPACE = "cache"
POOL_LABEL = "m3fleet.test/cache-pool"
NODE_LABEL = f"cache.m3fleet.dev/{NAMESPACE}.m3"
REVISION = "0123456789abcdef0123456789abcdef01234567"
MANUAL_NODE = "h200-manual"  # no kwok: the test is its kubelet
MANUAL_TAINT = {"key": "m3fleet.test/manual", "value": "true", "effect": "NoSchedule"}


def chart_cache_env(cluster: Cluster) -> dict[str, str]:
    """The model cache's rules as the installed chart gives them to the operator (its Deployment's env, from the
    chart's default values): the operator process here starts with the same."""
    [deployment] = cluster.list("deployments", OPERATOR_NAMESPACE, "app.kubernetes.io/name=m3fleet")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    wanted = ("M3FLEET_CACHE_PATH_PREFIXES", "M3FLEET_STAGER_IMAGES", "M3FLEET_STAGER_IMAGE")
    return {e["name"]: e["value"] for e in container["env"] if e["name"] in wanted}


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    env = chart_cache_env(chart)
    assert env["M3FLEET_CACHE_PATH_PREFIXES"] == "/var/lib/m3fleet,/mnt/*/m3fleet", env
    with operated_namespace(chart, NAMESPACE, "operator-model-cache", env) as running:
        yield running


def cache(name: str, pool: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "source": {
            "huggingFace": {
                "repo": "MiniMaxAI/MiniMax-M3",
                "revision": REVISION,
                "tokenSecretRef": {"name": "hf-token", "key": "token"},
            }
        },
        "nodes": {
            "accelerator": "h200",
            "nodeSelector": {POOL_LABEL: pool},
            "tolerations": [{**MANUAL_TAINT, "operator": "Equal"}],
        },
        "path": "/mnt/nvme/m3fleet/m3",
        "deleteFilesOnRemoval": True,
    }
    body.update(spec)
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3ModelCache",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": body,
    }


def host_path(job: dict[str, Any]) -> str:
    (volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
    return str(volume["hostPath"]["path"])


def label_node(cluster: Cluster, node: str, key: str, value: str | None) -> None:
    cluster.kubectl("label", "node", node, f"{key}={value}" if value is not None else f"{key}-", "--overwrite")


def node_labels(cluster: Cluster, node: str) -> dict[str, str]:
    body = cluster.get("node", node)
    assert body is not None
    labels: dict[str, str] = body["metadata"].get("labels") or {}
    return labels


def jobs(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return cluster.list("jobs", NAMESPACE, f"m3fleet.dev/cache={name}")


def job_node(job: dict[str, Any]) -> str:
    return str(job["metadata"]["annotations"]["m3fleet.dev/node"])


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    body = cluster.get("m3cache", name, NAMESPACE) or {}
    value: dict[str, Any] = body.get("status") or {}
    return value


def get_columns(cluster: Cluster, name: str) -> dict[str, str]:
    out = cluster.kubectl("get", "m3cache", name, "-n", NAMESPACE).stdout.splitlines()
    header, row = out[0].split(), out[1].split()
    return dict(zip(header, row, strict=False))


def test_bad_input_is_rejected_at_admission(chart: Cluster) -> None:
    chart.namespace(NAMESPACE)
    result = chart.apply(cache("relative", "a", path="mnt/nvme"), check=False)
    assert result.returncode != 0 and "path" in result.stderr and "absolute" in result.stderr, result.stderr
    body = cache("branch", "a")
    body["spec"]["source"]["huggingFace"]["revision"] = "main"
    result = chart.apply(body, check=False)
    assert result.returncode != 0 and "revision" in result.stderr, result.stderr


def test_staged_labelled_used_and_removed(chart: Cluster, operator: OperatorProcess) -> None:
    pool = ("h200-4", "h200-5")
    for node in pool:
        label_node(chart, node, POOL_LABEL, "a")
    chart.kubectl("create", "secret", "generic", "hf-token", "-n", NAMESPACE, "--from-literal=token=hf_x")
    deployment = renamed(sample("vllm-h200-tp8"), "cached", NAMESPACE)
    watching = contextlib.ExitStack()
    deployment["spec"]["model"]["cacheRef"] = {"name": "m3"}
    # The old pod stays until its replacement is ready (on a node holding the new copy): the path change below
    # must not empty the old directory under it.
    deployment["spec"]["rollout"] = {"maxSurge": 1, "maxUnavailable": 0}
    try:
        chart.apply(cache("m3", "a"))

        # One Job per pool node, pinned to it by the real scheduler, completed; the nodes labelled.
        eventually("a staging Job per pool node", lambda: sorted(map(job_node, jobs(chart, "m3"))) == list(pool), 60)
        for job in jobs(chart, "m3"):
            [pod] = chart.list("pods", NAMESPACE, f"batch.kubernetes.io/job-name={job['metadata']['name']}")
            assert pod["spec"]["nodeName"] == job_node(job)
            volume = pod["spec"]["volumes"][0]["hostPath"]
            assert volume == {"path": "/mnt/nvme/m3fleet/m3", "type": "DirectoryOrCreate"}
            assert pod["spec"]["containers"][0]["command"][:3] == ["m3fleet", "stage", "huggingface"]
        eventually(
            "both nodes labelled ready", lambda: all(node_labels(chart, n).get(NODE_LABEL) == "ready" for n in pool), 90
        )
        eventually(
            "status 2/2 Ready", lambda: condition({"status": status(chart, "m3")}, "Ready").get("status") == "True", 60
        )
        columns = get_columns(chart, "m3")
        assert columns["NODES"] == "2/2" and columns["READY"] == "True", columns
        assert {n["name"]: n["phase"] for n in status(chart, "m3")["nodes"]} == dict.fromkeys(pool, "Ready")
        assert "h200-0" not in {n["name"] for n in status(chart, "m3")["nodes"]}  # not in the pool

        # A deployment that requires the cache: placed on a labelled node, mounting the copy; status says so.
        chart.apply(deployment)
        body = wait_ready(chart, "cached", NAMESPACE)
        assert (
            body["status"]["modelCache"]["name"] == "m3" and body["status"]["modelCache"]["nodeAffinity"] == "Required"
        )
        assert body["status"]["plan"]["modelCache"] == "m3"
        [pod] = chart.list("pods", NAMESPACE, "m3fleet.dev/name=cached")
        assert pod["spec"]["nodeName"] in pool
        assert {"name": "model-cache", "hostPath": {"path": "/mnt/nvme/m3fleet/m3", "type": "Directory"}} in pod[
            "spec"
        ]["volumes"]

        # The engine image is pre-pulled on the pool by a DaemonSet the cache owns.
        def prepull() -> dict[str, Any] | None:
            ds = chart.get("daemonset", "m3-prepull", NAMESPACE)
            return ds if ds and (ds.get("status") or {}).get("numberReady") == len(pool) else None

        ds = eventually("the pre-pull DaemonSet ready on the pool", prepull, 90)
        [init] = ds["spec"]["template"]["spec"]["initContainers"]
        assert init["image"] == body["status"]["plan"]["image"] and init["command"] == ["sh", "-c", "exit 0"]
        assert ds["metadata"]["ownerReferences"][0]["kind"] == "MiniMaxM3ModelCache"

        # Quiet at rest: once staged and rolled out, the operator writes nothing (node heartbeats, DaemonSet and
        # Job status changes are read, never answered with a write).
        def quiet() -> bool:
            mark = operator.mark()
            time.sleep(8)
            return not operator.writes(operator.requests_since(mark))

        eventually("the operator writes nothing at rest", quiet, 90, 0)

        # A node joining the pool is staged at once.
        label_node(chart, "h200-3", POOL_LABEL, "a")
        eventually("the new node labelled", lambda: node_labels(chart, "h200-3").get(NODE_LABEL) == "ready", 90)
        eventually("3/3", lambda: status(chart, "m3").get("nodesSummary") == "3/3", 60)

        # A new path: staged there on every node, the deployment mounts it, and (deleteFilesOnRemoval) the old
        # directory is removed by a cleanup Job on each node once the new copy is complete there and no engine pod
        # there mounts it. The other pool nodes cordoned: the engine pod's replacement has nowhere to go (its own
        # node's GPUs are the old pod's), so the old pod stays, and its node's old directory with it.
        seen: dict[str, set[str]] = {}  # cleanup Job -> its node and the directory it empties (they go once done)
        [engine] = chart.list("pods", NAMESPACE, "m3fleet.dev/name=cached")
        engine_node = engine["spec"]["nodeName"]
        others = sorted({*pool, "h200-3"} - {engine_node})
        new_path = "/mnt/nvme/m3fleet/m3-v2"

        # Watched, not polled: a cleanup Job may come and go between two polls on a busy machine.
        watched = watching.enter_context(
            chart.watch(
                "jobs",
                NAMESPACE,
                "m3fleet.dev/cache=m3,m3fleet.dev/cache-action=clean",
                r"{.metadata.name} {.metadata.annotations.m3fleet\.dev/node}"
                " {.spec.template.spec.volumes[*].hostPath.path}",
            )
        )

        def cleanups() -> dict[str, set[str]]:
            for line in list(watched):
                name, node, path = line.split(" ", 2)
                seen[name] = {node, path}
            return seen

        def new_copy_on(node: str) -> bool:
            return any(
                job_node(j) == node and host_path(j) == new_path and condition(j, "Complete").get("status") == "True"
                for j in jobs(chart, "m3")
            )

        for node in others:
            chart.kubectl("cordon", node)
        chart.kubectl(
            "patch", "m3cache", "m3", "-n", NAMESPACE, "--type=merge", "-p", json.dumps({"spec": {"path": new_path}})
        )
        eventually("the new copy on the engine pod's node", lambda: new_copy_on(engine_node), 90)
        eventually(
            "status: the old copy kept under the engine pod",
            lambda: (
                "while pods on the node mount it"
                in next(n["message"] for n in status(chart, "m3")["nodes"] if n["name"] == engine_node)
            ),
            60,
        )
        assert chart.get("pod", engine["metadata"]["name"], NAMESPACE) is not None
        assert not any(engine_node in v for v in cleanups().values()), seen  # not emptied under it
        for node in others:
            chart.kubectl("uncordon", node)

        def moved() -> bool:
            cleanups()
            staged = {job_node(j) for j in jobs(chart, "m3") if host_path(j) == new_path}
            return staged == {*pool, "h200-3"} and all(host_path(j) == new_path for j in jobs(chart, "m3"))

        eventually("staged at the new path, the old pod replaced, the old Jobs gone", moved, 240, 0.2)
        assert sorted(map(sorted, seen.values())) == sorted(
            sorted([n, "/mnt/nvme/m3fleet/m3"]) for n in (*pool, "h200-3")
        ), seen
        eventually("3/3 at the new path", lambda: status(chart, "m3").get("nodesSummary") == "3/3", 60)
        assert all(node_labels(chart, n).get(NODE_LABEL) == "ready" for n in (*pool, "h200-3"))

        def mounted() -> str:
            template = (chart.get("deployment", "cached", NAMESPACE) or {})["spec"]["template"]["spec"]
            (volume,) = [v for v in template["volumes"] if v["name"] == "model-cache"]
            return str(volume["hostPath"]["path"])

        eventually("the deployment mounts the new path", lambda: mounted() == "/mnt/nvme/m3fleet/m3-v2", 60)

        # Bad input: a Secret that does not exist, then a pool with no nodes. Reported; nothing staged is touched.
        before = sorted(j["metadata"]["uid"] for j in jobs(chart, "m3"))
        patch = {"spec": {"source": {"huggingFace": {"tokenSecretRef": {"name": "nope", "key": "token"}}}}}
        chart.kubectl("patch", "m3cache", "m3", "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))
        degraded = eventually(
            "SecretNotFound",
            lambda: (
                (c := condition({"status": status(chart, "m3")}, "Degraded")).get("reason") == "SecretNotFound" and c
            ),
            60,
        )
        assert "Secret nope does not exist" in degraded["message"] and "fix:" in degraded["message"]
        patch = {"spec": {"nodes": {"nodeSelector": {POOL_LABEL: "typo"}}}}
        chart.kubectl("patch", "m3cache", "m3", "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))
        ready = eventually(
            "NoNodes",
            lambda: (c := condition({"status": status(chart, "m3")}, "Ready")).get("reason") == "NoNodes" and c,
            60,
        )
        assert "typo" in ready["message"]
        assert sorted(j["metadata"]["uid"] for j in jobs(chart, "m3")) == before
        assert all(node_labels(chart, n).get(NODE_LABEL) == "ready" for n in (*pool, "h200-3"))
        assert chart.get("deployment", "cached", NAMESPACE) is not None

        # Removal: labels off, a cleanup Job per node that held a copy (completed by kwok), finalizer released.
        delete(chart, "cached", NAMESPACE)
        chart.kubectl("delete", "m3cache", "m3", "-n", NAMESPACE, "--wait=false")

        def cleaned() -> bool:
            cleanups = chart.list("jobs", NAMESPACE, "m3fleet.dev/cache=m3,m3fleet.dev/cache-action=clean")
            return sorted(map(job_node, cleanups)) == sorted((*pool, "h200-3"))

        eventually("a cleanup Job per node", cleaned, 60)
        eventually("the cache gone", lambda: chart.get("m3cache", "m3", NAMESPACE) is None, 90)
        assert not any(NODE_LABEL in node_labels(chart, n) for n in (*pool, "h200-3"))
    finally:
        watching.close()
        chart.kubectl("delete", "m3d", "cached", "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        chart.kubectl("delete", "m3cache", "m3", "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        for node in ("h200-3", *pool):
            label_node(chart, node, POOL_LABEL, None)
            chart.kubectl("uncordon", node, check=False)


def manual_node(cluster: Cluster) -> None:
    """An H200 node no kwok process manages: Ready as far as the scheduler can tell, its pods never run."""
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": MANUAL_NODE,
                "labels": {
                    "kubernetes.io/arch": "amd64",
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/hostname": MANUAL_NODE,
                    "nvidia.com/gpu.product": "NVIDIA-H200",
                    POOL_LABEL: "manual",
                },
            },
            "spec": {"taints": [MANUAL_TAINT]},
        }
    )
    ready = {
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "the test"}],
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        }
    }
    cluster.kubectl("patch", "node", MANUAL_NODE, "--subresource=status", "--type=merge", "-p", json.dumps(ready))


def fail_pod(cluster: Cluster, pod: dict[str, Any], code: int, message: str) -> None:
    """What the kubelet reports when `m3fleet stage` exits `code` after writing `message` to the termination log
    (0: it succeeded)."""
    terminated = {
        "exitCode": code,
        "reason": "Error",
        "message": message,
        "startedAt": "2026-01-01T00:00:00Z",
        "finishedAt": "2026-01-01T00:00:01Z",
    }
    patch = {
        "status": {
            "phase": "Failed" if code else "Succeeded",
            "containerStatuses": [
                {
                    "name": pod["spec"]["containers"][0]["name"],
                    "image": pod["spec"]["containers"][0]["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
    }
    cluster.kubectl(
        "patch",
        "pod",
        pod["metadata"]["name"],
        "-n",
        NAMESPACE,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
    )


def pods_of(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    return cluster.list("pods", NAMESPACE, f"batch.kubernetes.io/job-name={job}")


def scheduled_pod(cluster: Cluster, job: str) -> dict[str, Any]:
    [pod] = eventually("its pod scheduled", lambda: [p for p in pods_of(cluster, job) if p["spec"].get("nodeName")], 60)
    return pod


def test_failures_are_retried_never_labelled_and_a_rejected_source_is_reported(
    chart: Cluster, operator: OperatorProcess
) -> None:
    manual_node(chart)
    chart.kubectl("create", "secret", "generic", "hf-token", "-n", NAMESPACE, "--from-literal=token=hf_x", check=False)
    try:
        chart.apply(cache("flaky", "manual", deleteFilesOnRemoval=False))  # no kubelet here to run a cleanup
        [job] = eventually("a Job for the manual node", lambda: jobs(chart, "flaky"), 60)
        assert job_node(job) == MANUAL_NODE
        name = job["metadata"]["name"]
        [pod] = eventually(
            "its pod scheduled", lambda: [p for p in pods_of(chart, name) if p["spec"].get("nodeName")], 60
        )
        fail_pod(chart, pod, 1, "1 of 4 files failed verification: model.safetensors: sha256 ab != published cd")
        # The job controller retries the pod (its own backoff); the node is never labelled meanwhile.
        eventually("a second pod (the job controller's retry)", lambda: len(pods_of(chart, name)) == 2, 90)
        entry = eventually(
            "the node reported Staging",
            lambda: next((n for n in status(chart, "flaky").get("nodes", []) if n["name"] == MANUAL_NODE), None),
            30,
        )
        assert entry["phase"] in ("Staging", "Failed")
        assert NODE_LABEL.replace(".m3", ".flaky") not in node_labels(chart, MANUAL_NODE)
        chart.kubectl("delete", "m3cache", "flaky", "-n", NAMESPACE, "--wait=false")
        eventually("flaky gone", lambda: chart.get("m3cache", "flaky", NAMESPACE) is None, 60, 1)

        # A rejected source (exit code 3) fails the Job at once and is reported with the program's own words.
        body = cache("unknown", "manual", deleteFilesOnRemoval=False)
        body["spec"]["source"]["huggingFace"]["revision"] = "f" * 40
        chart.apply(body)
        [job] = eventually("a Job for the unknown revision", lambda: jobs(chart, "unknown"), 60)
        name = job["metadata"]["name"]
        [pod] = eventually(
            "its pod scheduled", lambda: [p for p in pods_of(chart, name) if p["spec"].get("nodeName")], 60
        )
        words = f"revision {'f' * 40} does not exist in MiniMaxAI/MiniMax-M3: give a commit of the repo"
        fail_pod(chart, pod, 3, words)
        degraded = eventually(
            "SourceRejected",
            lambda: (
                (c := condition({"status": status(chart, "unknown")}, "Degraded")).get("reason") == "SourceRejected"
                and c
            ),
            90,
        )
        assert words in degraded["message"]
        failed = chart.get("job", name, NAMESPACE)
        assert failed is not None
        [cond] = [c for c in failed["status"]["conditions"] if c["type"] == "Failed"]
        assert cond["reason"] == "PodFailurePolicy" and len(pods_of(chart, name)) == 1  # not retried
        assert "cache.m3fleet.dev/cache.unknown" not in node_labels(chart, MANUAL_NODE)
        assert get_columns(chart, "unknown")["NODES"] == "0/1"
    finally:
        for name in ("flaky", "unknown"):
            chart.kubectl("delete", "m3cache", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        chart.kubectl("delete", "node", MANUAL_NODE, "--ignore-not-found", "--wait=false", check=False)


GONE_NODE = "h200-gone"  # no kwok, no kubelet: its Ready condition Unknown for an hour


def test_removal_leaves_the_copy_on_a_node_long_not_ready_and_says_so(
    chart: Cluster, operator: OperatorProcess
) -> None:
    """Nothing runs on a node whose kubelet is gone: the removal stops waiting for it (after 15 minutes not Ready),
    leaves its copy there and says so in a Warning Event, instead of keeping the cache for ever."""
    chart.apply(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": GONE_NODE,
                "labels": {
                    "kubernetes.io/arch": "amd64",
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/hostname": GONE_NODE,
                    "nvidia.com/gpu.product": "NVIDIA-H200",
                    POOL_LABEL: "gone",
                },
            },
        }
    )
    hour_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    unknown = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": hour_ago,
        "lastTransitionTime": hour_ago,
    }
    patch = {"status": {"conditions": [unknown], "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"}}}
    chart.kubectl("patch", "node", GONE_NODE, "--subresource=status", "--type=merge", "-p", json.dumps(patch))
    body = cache("gone", "gone")
    del body["spec"]["source"]["huggingFace"]["tokenSecretRef"]
    try:
        chart.apply(body)
        eventually("a staging Job on the node", lambda: [job_node(j) for j in jobs(chart, "gone")] == [GONE_NODE], 60)
        chart.kubectl("delete", "m3cache", "gone", "-n", NAMESPACE, "--wait=false")
        eventually("the cache gone", lambda: chart.get("m3cache", "gone", NAMESPACE) is None, 90)
        messages = [
            str(e.get("message"))
            for e in chart.list("events", NAMESPACE)
            if e.get("reason") == "CopyLeftOnNode" and e["involvedObject"].get("name") == "gone"
        ]
        assert len(messages) == 1 and f"node {GONE_NODE} has not been Ready for" in messages[0], messages
        assert "its copy in /mnt/nvme/m3fleet/m3 is left there" in messages[0]
    finally:
        chart.kubectl("delete", "m3cache", "gone", "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        chart.kubectl("delete", "node", GONE_NODE, "--ignore-not-found", "--wait=false", check=False)


def test_one_directory_is_the_first_caches_until_it_goes(chart: Cluster, operator: OperatorProcess) -> None:
    """Two caches naming one directory would each overwrite the other's copy: on the nodes both pools hold, the one
    created second stages nothing there and says why, and takes the directory once the first is gone."""
    pool = ("h200-4", "h200-5")
    for node in pool:
        label_node(chart, node, POOL_LABEL, "shared")
    chart.kubectl("create", "secret", "generic", "hf-token", "-n", NAMESPACE, "--from-literal=token=hf_x", check=False)
    first_label, second_label = (f"cache.m3fleet.dev/{NAMESPACE}.{name}" for name in ("first", "second"))
    try:
        chart.apply(cache("first", "shared", path="/mnt/nvme/m3fleet/shared/m3", deleteFilesOnRemoval=False))
        eventually("first 2/2", lambda: status(chart, "first").get("nodesSummary") == "2/2", 90)
        staged = sorted(j["metadata"]["uid"] for j in jobs(chart, "first"))
        chart.apply(cache("second", "shared", path="/mnt/nvme/m3fleet/shared"))  # holds the first one's directory
        degraded = eventually(
            "second: PathConflict",
            lambda: (
                (c := condition({"status": status(chart, "second")}, "Degraded")).get("reason") == "PathConflict" and c
            ),
            60,
        )
        assert f"h200-4 ({NAMESPACE}/first), h200-5 ({NAMESPACE}/first)" in degraded["message"], degraded
        assert "fix: give this cache a directory of its own" in degraded["message"]
        assert jobs(chart, "second") == [] and get_columns(chart, "second")["NODES"] == "0/2"
        assert all(second_label not in node_labels(chart, n) for n in pool)
        # The first is untouched.
        assert sorted(j["metadata"]["uid"] for j in jobs(chart, "first")) == staged
        assert all(node_labels(chart, n).get(first_label) == "ready" for n in pool)

        # A deployment that requires the second cache's nodes: its pods wait, and its status says why in the
        # cache's own words, not only the scheduler's.
        waiting = renamed(sample("vllm-h200-tp8"), "waits", NAMESPACE)
        waiting["spec"]["model"]["cacheRef"] = {"name": "second"}
        chart.apply(waiting)

        def ready_message() -> str:
            return str(condition(chart.get("m3d", "waits", NAMESPACE) or {}, "Ready").get("message") or "")

        message = eventually("the deployment says why", lambda: "PathConflict" in ready_message() and ready_message())
        assert "cannot be scheduled" in message and "model cache second is not Ready (PathConflict:" in message

        # The first goes (its files stay: no deleteFilesOnRemoval); the second stages at once, without being told.
        chart.kubectl("delete", "m3cache", "first", "-n", NAMESPACE, "--wait=false")
        eventually("second 2/2", lambda: status(chart, "second").get("nodesSummary") == "2/2", 90)
        assert condition({"status": status(chart, "second")}, "Degraded").get("reason") == "AsExpected"
        assert all(node_labels(chart, n).get(second_label) == "ready" for n in pool)
        eventually(
            "the deployment ready",
            lambda: condition(chart.get("m3d", "waits", NAMESPACE) or {}, "Ready").get("status") == "True",
            90,
        )
    finally:
        delete(chart, "waits", NAMESPACE)
        for name in ("first", "second"):
            chart.kubectl("delete", "m3cache", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        eventually("both gone", lambda: not chart.list("m3cache", NAMESPACE), 90)
        for node in pool:
            label_node(chart, node, POOL_LABEL, None)


def test_a_directory_another_cache_is_emptying_is_staged_after_its_cleanup(
    chart: Cluster, operator: OperatorProcess
) -> None:
    """A cache moved off a directory empties it (deleteFilesOnRemoval); a cache created on that directory meanwhile
    waits for the cleanup to end before it stages, or the cleanup would delete its new copy. On the manual node the
    test is the kubelet: each pod ends when it says so."""
    manual_node(chart)
    chart.kubectl("create", "secret", "generic", "hf-token", "-n", NAMESPACE, "--from-literal=token=hf_x", check=False)
    old, new = "/mnt/nvme/m3fleet/mover", "/mnt/nvme/m3fleet/mover-v2"
    try:
        chart.apply(cache("mover", "manual", path=old))
        [job] = eventually("mover's staging Job", lambda: jobs(chart, "mover"), 60)
        fail_pod(chart, scheduled_pod(chart, job["metadata"]["name"]), 0, "")
        eventually("mover 1/1", lambda: status(chart, "mover").get("nodesSummary") == "1/1", 60)
        patch = json.dumps({"spec": {"path": new}})
        chart.kubectl("patch", "m3cache", "mover", "-n", NAMESPACE, "--type=merge", "-p", patch)
        [job] = eventually(
            "mover's staging Job at the new path",
            lambda: [j for j in jobs(chart, "mover") if host_path(j) == new and j["metadata"]["annotations"]],
            60,
        )
        fail_pod(chart, scheduled_pod(chart, job["metadata"]["name"]), 0, "")

        def cleanup() -> list[dict[str, Any]]:
            return [
                j for j in jobs(chart, "mover") if j["metadata"]["labels"].get("m3fleet.dev/cache-action") == "clean"
            ]

        [clean] = eventually("mover's cleanup Job of the old directory", cleanup, 60)
        assert host_path(clean) == old
        cleanup_pod = scheduled_pod(chart, clean["metadata"]["name"])  # runs: no kubelet ends it until the test does

        chart.apply(cache("newcomer", "manual", path=old, deleteFilesOnRemoval=False))
        entry = eventually(
            "newcomer waits for the cleanup",
            lambda: next((n for n in status(chart, "newcomer").get("nodes", []) if "cleanup" in n["message"]), None),
            60,
        )
        assert entry["message"] == f"waiting for cleanup job {clean['metadata']['name']} of {old}", entry
        time.sleep(3)  # a few more rounds: still nothing staged under the running cleanup
        assert jobs(chart, "newcomer") == []

        fail_pod(chart, cleanup_pod, 0, "")
        [staging] = eventually("newcomer stages once the cleanup ended", lambda: jobs(chart, "newcomer"), 60)
        assert host_path(staging) == old
    finally:
        for name in ("mover", "newcomer"):
            chart.kubectl("delete", "m3cache", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        chart.kubectl("delete", "node", MANUAL_NODE, "--ignore-not-found", "--wait=false", check=False)
        eventually("both gone", lambda: not chart.list("m3cache", NAMESPACE), 90)


def degraded_reason(cluster: Cluster, name: str, reason: str) -> dict[str, Any]:
    """The cache's Degraded condition, once it has this reason."""

    def found() -> dict[str, Any] | None:
        got = condition({"status": status(cluster, name)}, "Degraded")
        return got if got.get("reason") == reason else None

    result: dict[str, Any] = eventually(f"{name}: Degraded {reason}", found, 60)
    return result


def owned_jobs(cluster: Cluster, name: str, uid: str) -> list[dict[str, Any]]:
    """The Jobs the cache itself controls (a look-alike carrying its labels is not one)."""
    return [
        j
        for j in jobs(cluster, name)
        if any(r.get("uid") == uid and r.get("controller") for r in j["metadata"].get("ownerReferences") or [])
    ]


def test_a_path_outside_the_allowed_prefixes_stages_nothing(chart: Cluster, operator: OperatorProcess) -> None:
    """The chart's default prefixes (/var/lib/m3fleet, /mnt/*/m3fleet), given to the operator as the chart does: a
    cache on /raid or in the kubelet's directory gets no Job at all, and its condition says how to fix it."""
    try:
        for name, path in (("raid", "/raid/models"), ("kubelet", "/var/lib/kubelet/pods")):
            chart.apply(cache(name, "a", path=path))
            degraded = degraded_reason(chart, name, "PathNotAllowed")
            assert f"spec.path: {path} is not inside a directory the cluster admin allows" in degraded["message"]
            assert "modelCache.allowedPathPrefixes" in degraded["message"]
            assert jobs(chart, name) == []
    finally:
        for name in ("raid", "kubelet"):
            chart.kubectl("delete", "m3cache", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)


def test_a_path_edited_to_the_parent_of_the_copy_pods_mount_is_refused_and_nothing_is_removed(
    chart: Cluster, operator: OperatorProcess
) -> None:
    """The issue's case: a live cache's path edited to its parent while an engine pod runs from the copy. Nothing is
    staged into the parent and nothing is cleaned; the condition names the node and the directory pods mount. A
    directory beside the old one is then staged, and the old copy is kept while the pod mounts it."""
    node, old, parent, beside = "h200-4", "/mnt/nvme/m3fleet/nest/m3", "/mnt/nvme/m3fleet/nest", "/mnt/nvme/m3fleet/b"
    label_node(chart, node, POOL_LABEL, "nest")
    chart.kubectl("create", "secret", "generic", "hf-token", "-n", NAMESPACE, "--from-literal=token=hf_x", check=False)
    deployment = renamed(sample("vllm-h200-tp8"), "nested", NAMESPACE)
    deployment["spec"]["model"]["cacheRef"] = {"name": "nest"}
    deployment["spec"]["rollout"] = {"maxSurge": 1, "maxUnavailable": 0}  # the old pod stays until one replaces it
    try:
        chart.apply(cache("nest", "nest", path=old))
        eventually("nest 1/1", lambda: status(chart, "nest").get("nodesSummary") == "1/1", 90)
        chart.apply(deployment)
        wait_ready(chart, "nested", NAMESPACE)
        [engine] = chart.list("pods", NAMESPACE, "m3fleet.dev/name=nested")
        assert engine["spec"]["nodeName"] == node

        patch = json.dumps({"spec": {"path": parent}})
        chart.kubectl("patch", "m3cache", "nest", "-n", NAMESPACE, "--type=merge", "-p", patch)
        degraded = degraded_reason(chart, "nest", "PathNested")
        assert (
            f"spec.path: {parent} is nested with {old}, which engine pods on node {node} still mount"
            in degraded["message"]
        ), degraded
        assert "fix: choose a directory beside the old one" in degraded["message"]
        time.sleep(5)  # a few more rounds: still nothing written into the parent, nothing cleaned
        assert [host_path(j) for j in jobs(chart, "nest")] == [old]
        assert chart.get("pod", engine["metadata"]["name"], NAMESPACE) is not None

        patch = json.dumps({"spec": {"path": beside}})
        chart.kubectl("patch", "m3cache", "nest", "-n", NAMESPACE, "--type=merge", "-p", patch)
        eventually("staged beside the old copy", lambda: beside in {host_path(j) for j in jobs(chart, "nest")}, 60)
        entry = eventually(
            "the old copy kept under the engine pod",
            lambda: next(
                (
                    n
                    for n in status(chart, "nest").get("nodes", [])
                    if "while pods on the node mount it" in n["message"]
                ),
                None,
            ),
            90,
        )
        assert old in entry["message"]
        clean = [j for j in jobs(chart, "nest") if j["metadata"]["labels"]["m3fleet.dev/cache-action"] == "clean"]
        assert clean == [] and condition({"status": status(chart, "nest")}, "Degraded").get("reason") == "AsExpected"
    finally:
        delete(chart, "nested", NAMESPACE)
        chart.kubectl("delete", "m3cache", "nest", "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        eventually("nest gone", lambda: chart.get("m3cache", "nest", NAMESPACE) is None, 90)
        label_node(chart, node, POOL_LABEL, None)


FORGER = "forger"  # a namespace where someone with `edit` makes look-alikes


def look_alike_job(name: str, namespace: str, node: str, content: str, suspend: bool) -> dict[str, Any]:
    """A Job carrying a cache cleanup Job's labels and annotations, no volume, owned by no one."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/managed-by": "m3fleet",
                "m3fleet.dev/cache": "target",
                "m3fleet.dev/cache-action": "clean",
                "m3fleet.dev/cache-content": content,
            },
            "annotations": {"m3fleet.dev/node": node, "m3fleet.dev/attempt": "1"},
        },
        "spec": {
            "suspend": suspend,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                                ]
                            }
                        }
                    },
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "clean", "image": "busybox:1.36", "command": ["true"]}],
                }
            },
        },
    }


def test_look_alike_jobs_and_daemonsets_in_any_namespace_change_nothing(
    chart: Cluster, operator: OperatorProcess
) -> None:
    """Jobs carrying a cleanup Job's labels — suspended with no volume, or completed, in another namespace or the
    cache's own — and a DaemonSet carrying the pre-pull one's: none is controlled by a live cache, so the cache's
    node labels, Jobs and status stay as they are, and the look-alikes are left alone."""
    pool = ("h200-4", "h200-5")
    for node in pool:
        label_node(chart, node, POOL_LABEL, "forge")
    chart.kubectl("create", "secret", "generic", "hf-token", "-n", NAMESPACE, "--from-literal=token=hf_x", check=False)
    chart.namespace(FORGER)
    target_label = f"cache.m3fleet.dev/{NAMESPACE}.target"
    try:
        chart.apply(cache("target", "forge", path="/mnt/nvme/m3fleet/target", prePullImages=True))
        eventually("target 2/2", lambda: status(chart, "target").get("nodesSummary") == "2/2", 90)
        body = chart.get("m3cache", "target", NAMESPACE)
        assert body is not None
        uid, before = body["metadata"]["uid"], status(chart, "target")
        staged = sorted(j["metadata"]["uid"] for j in owned_jobs(chart, "target", uid))
        assert len(staged) == 2 and all(node_labels(chart, n).get(target_label) == "ready" for n in pool)

        content = before["content"]
        forged = [
            look_alike_job("suspended", FORGER, "h200-4", content, suspend=True),
            look_alike_job("completed", FORGER, "h200-5", content, suspend=False),
            look_alike_job("completed-here", NAMESPACE, "h200-4", content, suspend=False),
        ]
        daemonset = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {
                "name": "not-the-prepull",
                "namespace": NAMESPACE,
                "labels": {"app.kubernetes.io/managed-by": "m3fleet", "m3fleet.dev/cache": "target"},
            },
            "spec": {
                "selector": {"matchLabels": {"app": "not-the-prepull"}},
                "template": {
                    "metadata": {"labels": {"app": "not-the-prepull"}},
                    "spec": {
                        "nodeSelector": {"m3fleet.test/nowhere": "true"},
                        "containers": [{"name": "c", "image": "busybox:1.36"}],
                    },
                },
            },
        }
        mark = operator.mark()
        for obj in (*forged, daemonset):
            chart.apply(obj)
        for job in forged[1:]:
            eventually(
                f"look-alike {job['metadata']['name']} completed",
                lambda job=job: (
                    condition(
                        chart.get("job", job["metadata"]["name"], job["metadata"]["namespace"]) or {}, "Complete"
                    ).get("status")
                    == "True"
                ),
                90,
            )
        # Every cache looks again (a node relabelled); the operator has listed Jobs since the look-alikes exist.
        label_node(chart, "h200-4", "m3fleet.test/poke", "1")
        eventually(
            "the operator looked at Jobs again",
            lambda: any(
                e.get("verb") == "list" and (e.get("objectRef") or {}).get("resource") == "jobs"
                for e in operator.requests_since(mark)
            ),
            30,
        )
        time.sleep(5)
        after = status(chart, "target")
        assert all(node_labels(chart, n).get(target_label) == "ready" for n in pool)
        assert sorted(j["metadata"]["uid"] for j in owned_jobs(chart, "target", uid)) == staged
        assert {n["name"]: n["phase"] for n in after["nodes"]} == dict.fromkeys(pool, "Ready")
        assert after["nodesSummary"] == "2/2" and condition({"status": after}, "Ready").get("status") == "True"
        assert chart.get("daemonset", "not-the-prepull", NAMESPACE) is not None
        assert all(chart.get("job", j["metadata"]["name"], j["metadata"]["namespace"]) for j in forged)
        writes = operator.writes(operator.requests_since(mark))
        assert not [w for w in writes if "not-the-prepull" in w or "nodes" in w], writes
    finally:
        chart.kubectl("delete", "namespace", FORGER, "--ignore-not-found", "--wait=false", check=False)
        chart.kubectl("delete", "job", "completed-here", "-n", NAMESPACE, "--ignore-not-found", check=False)
        chart.kubectl("delete", "daemonset", "not-the-prepull", "-n", NAMESPACE, "--ignore-not-found", check=False)
        chart.kubectl("delete", "m3cache", "target", "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        eventually("target gone", lambda: chart.get("m3cache", "target", NAMESPACE) is None, 90)
        for node in pool:
            label_node(chart, node, POOL_LABEL, None)
        label_node(chart, "h200-4", "m3fleet.test/poke", None)


def test_files_the_cache_did_not_write_stop_staging_and_name_node_path_and_file(
    chart: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """The real `m3fleet stage` run on a directory holding another team's files (as the Job would on the node): its
    exit code and termination message, reported by the node's kubelet (the test, on the manual node), fail the Job at
    once by its pod failure policy, and the cache says which node, which path and which file."""
    dest = tmp_path / "crowded"
    (dest / "team-b").mkdir(parents=True)
    (dest / "team-b" / "weights.safetensors").write_bytes(b"w" * 64)
    (dest / "NOTES.md").write_text("ours\n")
    source = tmp_path / "claim"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"m" * 64)
    log = tmp_path / "termination-log"
    run = subprocess.run(
        [str(Path(sys.executable).parent / "m3fleet"), "stage", "copy", "--from", str(source), "--dest", str(dest)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "M3FLEET_TERMINATION_LOG": str(log)},
        timeout=60,
        check=False,
    )
    assert run.returncode == 3 and (dest / "NOTES.md").read_text() == "ours\n", run.stderr
    manual_node(chart)
    chart.kubectl("create", "secret", "generic", "hf-token", "-n", NAMESPACE, "--from-literal=token=hf_x", check=False)
    path = "/mnt/nvme/m3fleet/crowded"
    try:
        chart.apply(cache("crowded", "manual", path=path, deleteFilesOnRemoval=False))
        [job] = eventually("a Job for the manual node", lambda: jobs(chart, "crowded"), 60)
        name = job["metadata"]["name"]
        fail_pod(chart, scheduled_pod(chart, name), run.returncode, log.read_text())
        degraded = degraded_reason(chart, "crowded", "ForeignFiles")
        assert degraded["message"].startswith(
            f"spec.path: {path} on node {MANUAL_NODE} holds files m3fleet did not write (first: NOTES.md)"
        ), degraded
        assert "fix: give this cache an empty directory of its own, or move those files out" in degraded["message"]
        failed = chart.get("job", name, NAMESPACE)
        assert failed is not None
        [cond] = [c for c in failed["status"]["conditions"] if c["type"] == "Failed"]
        assert cond["reason"] == "PodFailurePolicy" and len(pods_of(chart, name)) == 1
        assert f"cache.m3fleet.dev/{NAMESPACE}.crowded" not in node_labels(chart, MANUAL_NODE)
    finally:
        chart.kubectl(
            "delete", "m3cache", "crowded", "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False
        )
        eventually("crowded gone", lambda: chart.get("m3cache", "crowded", NAMESPACE) is None, 60)
        chart.kubectl("delete", "node", MANUAL_NODE, "--ignore-not-found", "--wait=false", check=False)

"""`helm uninstall` with a fleet and a model cache present, on a control plane of its own: the chart's pre-delete hook
(`m3fleet release-caches`, as the operator's ServiceAccount) stops the operator and lets every cache go, so deleting
the cache's namespace afterwards is not held by a finalizer no one would release, no node keeps the cache's label,
and the CRDs, the cache object and the PVCs stay until the user deletes them. A restart of the operator (SIGTERM
while its Deployment exists) releases nothing.

What kwok leaves unproven: kwok runs no containers, so the hook Job `helm uninstall` creates is completed by kwok's
stages without running. The test therefore runs the hook's own command line (read from `helm get hooks`) as the
hook's pod would, with a token of the chart's ServiceAccount, before `helm uninstall`; and it plays the kubelet of
the operator's pod: when the hook has scaled the Deployment to 0, the operator process gets SIGTERM.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tests.cluster.cluster import BIN, OPERATOR_NAMESPACE, OPERATOR_SA, RELEASE, Cluster, eventually, fresh_cluster
from tests.cluster.fleet import renamed, sample, wait_ready, weight_volumes

from m3fleet.api.cache import NODE_LABEL_PREFIX
from m3fleet.cache.plan import FINALIZER

NAMESPACE = "leaving"
POOL = ("h200-4", "h200-5")
POOL_LABEL = "m3fleet.test/uninstall-pool"
CACHE_LABEL = f"{NODE_LABEL_PREFIX}{NAMESPACE}.m3"
CRDS = ("minimaxm3deployments.m3fleet.dev", "minimaxm3modelcaches.m3fleet.dev")


@pytest.fixture(scope="module")
def installed() -> Iterator[Cluster]:
    with fresh_cluster("m3fleet-uninstall-") as cluster:
        cluster.install_chart()
        cluster.namespace(NAMESPACE)
        weight_volumes(cluster, NAMESPACE)
        for node in POOL:
            cluster.kubectl("label", "node", node, f"{POOL_LABEL}=a", "--overwrite")
        yield cluster


def chart_env(cluster: Cluster) -> dict[str, str]:
    """The plain env the installed chart gives the operator's container: the host process starts with the same."""
    deployment = cluster.get("deployment", f"{RELEASE}", OPERATOR_NAMESPACE)
    assert deployment is not None
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def hook_command(cluster: Cluster) -> list[str]:
    """The pre-delete hook's container command line, as `helm get hooks` shows the installed release's."""
    hooks = [d for d in yaml.safe_load_all(cluster.helm("get", "hooks", RELEASE, "-n", OPERATOR_NAMESPACE).stdout) if d]
    [job] = [d for d in hooks if d["kind"] == "Job" and d["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == OPERATOR_SA
    return [str(BIN / "m3fleet"), *container["args"]]


def cache() -> dict[str, Any]:
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3ModelCache",
        "metadata": {"name": "m3", "namespace": NAMESPACE},
        "spec": {
            "source": {
                "huggingFace": {"repo": "MiniMaxAI/MiniMax-M3", "revision": "0123456789abcdef0123456789abcdef01234567"}
            },
            "nodes": {"accelerator": "h200", "nodeSelector": {POOL_LABEL: "a"}},
            "path": "/var/lib/m3fleet/uninstall",
        },
    }


def labelled(cluster: Cluster) -> set[str]:
    return {n["metadata"]["name"] for n in cluster.list("nodes", selector=CACHE_LABEL)}


def finalizers(cluster: Cluster) -> list[str]:
    body = cluster.get("m3cache", "m3", NAMESPACE)
    assert body is not None, "the cache object is gone"
    return list(body["metadata"].get("finalizers") or [])


def replicas(cluster: Cluster) -> int:
    body = cluster.get("deployment", RELEASE, OPERATOR_NAMESPACE)
    assert body is not None
    return int(body["spec"]["replicas"])


def test_uninstall_leaves_no_finalizer_no_node_label_and_keeps_crds_caches_and_claims(installed: Cluster) -> None:
    cluster, env = installed, chart_env(installed)
    with cluster.operator("--all-namespaces", "--standalone", name="operator-before-restart", env=env) as running:
        cluster.apply(renamed(sample("vllm-h200-tp8"), "leaving", NAMESPACE))
        cluster.apply(cache())
        wait_ready(cluster, "leaving", NAMESPACE)
        eventually("the pool's nodes labelled", lambda: labelled(cluster) == set(POOL), 120)
        assert FINALIZER in finalizers(cluster)
        running.process.stop()  # SIGTERM, as on a rolling restart: the Deployment is still there
    assert replicas(cluster) == 1
    assert FINALIZER in finalizers(cluster), "a restart released the cache"
    assert labelled(cluster) == set(POOL), "a restart took the cache's labels off"

    command = hook_command(cluster)
    with cluster.operator("--all-namespaces", "--standalone", name="operator-after-restart", env=env) as running:
        kubeconfig, _, _ = cluster.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SA)
        log = cluster.workdir / "release-caches.log"
        with log.open("wb") as out:
            hook = subprocess.Popen(
                command, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            eventually("the hook scales the operator's Deployment to 0", lambda: replicas(cluster) == 0, 60)
            running.process.stop()  # the kubelet stops the operator's pod
            assert hook.wait(180) == 0, log.read_text()
        finally:
            if hook.poll() is None:
                hook.kill()
    said = log.read_text()
    assert f"Released MiniMaxM3ModelCache {NAMESPACE}/m3" in said, said
    assert FINALIZER not in finalizers(cluster)
    assert labelled(cluster) == set()
    again = subprocess.run(
        command, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, capture_output=True, text=True, check=False
    )
    assert again.returncode == 0 and "released 0 model cache(s)" in again.stdout, again.stdout + again.stderr

    cluster.helm("uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--timeout", "180s")
    assert cluster.get("deployment", RELEASE, OPERATOR_NAMESPACE) is None
    for crd in CRDS:
        assert cluster.get("crd", crd) is not None, f"helm uninstall removed the CRD {crd}"
    assert cluster.get("m3cache", "m3", NAMESPACE) is not None, "the cache object went with the release"
    assert cluster.get("m3d", "leaving", NAMESPACE) is not None, "the fleet went with the release"
    assert cluster.get("pvc", "m3-weights", NAMESPACE) is not None, "a weight PVC went with the release"

    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
    eventually("the namespace is gone", lambda: cluster.get("namespace", NAMESPACE) is None, 120)
    assert labelled(cluster) == set()
    for crd in CRDS:
        assert cluster.get("crd", crd) is not None

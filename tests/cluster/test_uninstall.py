"""`helm uninstall` with a fleet and a model cache present, on a control plane of its own: the chart's pre-delete hook
(`m3fleet release-caches`, as the operator's ServiceAccount) stops the operator and lets every cache go, so deleting
the cache's namespace afterwards is not held by a finalizer no one would release, no node keeps the cache's label,
and the CRDs, the cache object and the PVCs stay until the user deletes them; for a cluster-wide and for a
namespace-scoped install (whose operator's grants do not cover its own Deployment: the hook's Role does). A restart
of the operator (SIGTERM while its Deployment exists) releases nothing; running the hook twice changes nothing.

What kwok leaves unproven: kwok runs no containers, so the hook Job `helm uninstall` creates is completed by kwok's
stages without running. The test therefore runs the hook's own command line (read from `helm get hooks`) as the
hook's pod would, with a token of the chart's ServiceAccount, before `helm uninstall`; and it plays the kubelet of
the operator's pod: when the hook has scaled the Deployment to 0, the operator process gets SIGTERM.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tests.support.cluster.cluster import (
    BIN,
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    RELEASE,
    Cluster,
    eventually,
    fresh_cluster,
)
from tests.support.cluster.fleet import hub_cache, renamed, sample, wait_ready, weight_volumes

from m3fleet.api.cache import node_label_key
from m3fleet.cache.plan import FINALIZER

POOL = ("h200-4", "h200-5")
POOL_LABEL = "m3fleet.test/uninstall-pool"
KUBELET = "m3fleet.test/kubelet"  # the test plays the kubelet of the operator's pod (module docstring)
CRDS = ("minimaxm3deployments.m3fleet.dev", "minimaxm3modelcaches.m3fleet.dev")
# The chart's two scopes: a cluster-wide operator, and one watching a single namespace other than its own (its
# grants there do not cover its own Deployment: the hook's Role does).
SCOPES = {
    "cluster": ("uninstall-cluster", (), ("--all-namespaces",)),
    "namespace": ("uninstall-ns", ("--set", "scope=namespace", "--set", "watchNamespace=uninstall-ns"), ()),
}


@pytest.fixture(scope="module")
def bare() -> Iterator[Cluster]:
    """A control plane of its own: the chart is installed and uninstalled by each test."""
    with fresh_cluster("m3fleet-uninstall-") as cluster:
        for node in POOL:
            cluster.kubectl("label", "node", node, f"{POOL_LABEL}=a", "--overwrite")
        yield cluster


def chart_env(cluster: Cluster) -> dict[str, str]:
    """The plain env the installed chart gives the operator's container: the host process starts with the same."""
    deployment = cluster.get("deployment", f"{RELEASE}", OPERATOR_NAMESPACE)
    assert deployment is not None
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def pre_delete_hook(cluster: Cluster) -> tuple[list[str], list[dict[str, Any]]]:
    """The pre-delete hook of the installed release, as `helm get hooks` shows it: its Job's command line, and the
    objects Helm creates before that Job (lower hook weight: the Role and RoleBinding it runs with)."""
    hooks = [d for d in yaml.safe_load_all(cluster.helm("get", "hooks", RELEASE, "-n", OPERATOR_NAMESPACE).stdout) if d]
    pre_delete = [d for d in hooks if d["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"]
    [job] = [d for d in pre_delete if d["kind"] == "Job"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == OPERATOR_SA
    weight = int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    before = [d for d in pre_delete if int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) < weight]
    return [str(BIN / "m3fleet"), *container["args"]], before


def cache(namespace: str) -> dict[str, Any]:
    return hub_cache(namespace, "/var/lib/m3fleet/uninstall", POOL_LABEL)


def labelled(cluster: Cluster, namespace: str) -> set[str]:
    return {n["metadata"]["name"] for n in cluster.list("nodes", selector=node_label_key(namespace, "m3"))}


def finalizers(cluster: Cluster, namespace: str) -> list[str]:
    body = cluster.get("m3cache", "m3", namespace)
    assert body is not None, "the cache object is gone"
    return list(body["metadata"].get("finalizers") or [])


def operator_pods(cluster: Cluster) -> list[str]:
    return [p["metadata"]["name"] for p in cluster.list("pods", OPERATOR_NAMESPACE, "app.kubernetes.io/name=m3fleet")]


def terminating(cluster: Cluster, pod: str) -> bool:
    body = cluster.get("pod", pod, OPERATOR_NAMESPACE)
    return body is not None and bool(body["metadata"].get("deletionTimestamp"))


def replicas(cluster: Cluster) -> int:
    body = cluster.get("deployment", RELEASE, OPERATOR_NAMESPACE)
    assert body is not None
    return int(body["spec"]["replicas"])


@pytest.mark.parametrize("scope", SCOPES)
def test_uninstall_leaves_no_finalizer_no_node_label_and_keeps_crds_caches_and_claims(
    bare: Cluster, scope: str
) -> None:
    cluster, (namespace, values, watch) = bare, SCOPES[scope]
    cluster.namespace(namespace)
    weight_volumes(cluster, namespace)
    cluster.install_chart(RELEASE, OPERATOR_NAMESPACE, *values)
    env, run = chart_env(cluster), (*(watch or ("--namespace", namespace)), "--standalone")
    with cluster.operator(*run, name=f"operator-{scope}-before-restart", env=env) as running:
        cluster.apply(renamed(sample("vllm-h200-tp8"), "leaving", namespace))
        cluster.apply(cache(namespace))
        wait_ready(cluster, "leaving", namespace)
        eventually("the pool's nodes labelled", lambda: labelled(cluster, namespace) == set(POOL), 120)
        assert FINALIZER in finalizers(cluster, namespace)
        running.process.stop()  # SIGTERM, as on a rolling restart: the Deployment is still there
    assert replicas(cluster) == 1
    assert FINALIZER in finalizers(cluster, namespace), "a restart released the cache"
    assert labelled(cluster, namespace) == set(POOL), "a restart took the cache's labels off"

    command, made_first = pre_delete_hook(cluster)
    assert sorted(d["kind"] for d in made_first) == ["Role", "RoleBinding"]
    for document in made_first:  # as Helm does at uninstall, before the hook's Job
        cluster.apply(document)
    with cluster.operator(*run, name=f"operator-{scope}-after-restart", env=env) as running:
        [pod] = operator_pods(cluster)
        # kwok would drop the operator's pod at once; a kubelet keeps it until its container has exited
        held = {"metadata": {"finalizers": [KUBELET]}}
        cluster.kubectl("patch", "pod", pod, "-n", OPERATOR_NAMESPACE, "--type", "merge", "-p", json.dumps(held))
        kubeconfig, _, _ = cluster.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SA)
        log = cluster.workdir / f"release-caches-{scope}.log"
        with log.open("wb") as out:
            hook = subprocess.Popen(
                command, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            eventually("the hook has the operator's pod deleted", lambda: terminating(cluster, pod), 60)
            assert replicas(cluster) == 0
            running.process.stop()  # SIGTERM, as the kubelet does to a pod being deleted; then the pod may go
            released = {"metadata": {"finalizers": None}}
            cluster.kubectl(
                "patch", "pod", pod, "-n", OPERATOR_NAMESPACE, "--type", "merge", "-p", json.dumps(released)
            )
            assert hook.wait(180) == 0, log.read_text()
        finally:
            if hook.poll() is None:
                hook.kill()
    said = log.read_text()
    assert f"Released MiniMaxM3ModelCache {namespace}/m3" in said, said
    assert FINALIZER not in finalizers(cluster, namespace)
    events = cluster.list("events", namespace)
    said_on_cache = [e["message"] for e in events if e["involvedObject"]["name"] == "m3" and e["reason"] == "Released"]
    assert said_on_cache and "kept" in said_on_cache[0], [e["reason"] for e in events]
    assert labelled(cluster, namespace) == set()
    again = subprocess.run(
        command, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, capture_output=True, text=True, check=False
    )
    assert again.returncode == 0 and "released 0 model cache(s)" in again.stdout, again.stdout + again.stderr

    cluster.helm("uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--timeout", "180s")
    assert cluster.get("deployment", RELEASE, OPERATOR_NAMESPACE) is None
    for crd in CRDS:
        assert cluster.get("crd", crd) is not None, f"helm uninstall removed the CRD {crd}"
    assert cluster.get("m3cache", "m3", namespace) is not None, "the cache object went with the release"
    assert cluster.get("m3d", "leaving", namespace) is not None, "the fleet went with the release"
    assert cluster.get("pvc", "m3-weights", namespace) is not None, "a weight PVC went with the release"

    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    eventually("the namespace is gone", lambda: cluster.get("namespace", namespace) is None, 120)
    assert labelled(cluster, namespace) == set()
    for crd in CRDS:
        assert cluster.get("crd", crd) is not None

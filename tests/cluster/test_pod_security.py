"""Pod Security admission and the engine NetworkPolicy on the real control plane.

Each engine pod's documented level (the workload's m3fleet.dev/pod-security-level annotation, the table in
docs/security.md) is proven with the apiserver's own PodSecurity admission: in a namespace labelled
`pod-security.kubernetes.io/enforce=<level>` the real ReplicaSet / LeaderWorkerSet controllers create the pods and
the resource becomes Ready; in a namespace one level stricter the controllers' pod creations are refused (their
FailedCreate events say `violates PodSecurity`, and so do the resource's Ready and Degraded conditions). NVIDIA
vLLM/SGLang/TensorRT-LLM single-node pods are `restricted` (nothing is stricter), TensorRT-LLM multi-node
`baseline`, AMD `privileged`, and any pod with RDMA (`nodePool.extraResources`, here on H200 nodes that advertise
`rdma/ib`) `privileged`, and so is any pod that mounts a model cache's node-local copy (a hostPath volume).

The NetworkPolicy is a child like the others: created, owned, drift-corrected, re-created and pruned.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.cluster import dra
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import delete, pods, renamed, sample, wait_ready, weight_volumes
from tests.support.cluster.nodes import RDMA_RESOURCE

ENFORCE = "pod-security.kubernetes.io/enforce"
LEVEL = "m3fleet.dev/pod-security-level"
STRICTER = {"privileged": "baseline", "baseline": "restricted"}
RDMA = {"nodePool": {"extraResources": {RDMA_RESOURCE: 1}}}
CACHE_REF = {"model": {"cacheRef": {"name": "psa", "nodeAffinity": "Preferred"}}}
# sample, the level its engine pods need, what the case changes in the sample's spec
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "vllm-h200": ("vllm-h200-tp8", "restricted", {}),
    "sglang-gb200": ("sglang-gb200-mxfp8-2x4-tp8-ep8", "restricted", {}),
    "trtllm-gb200": ("trtllm-gb200-2x4-tep", "baseline", {}),
    "vllm-mi355x": ("vllm-mi355x-mxfp4", "privileged", {}),
    "vllm-h200-rdma": ("vllm-h200-tp8", "privileged", RDMA),
    # the model cache's node-local copy is a hostPath volume, which baseline forbids (Preferred: the pods need no
    # node that holds a copy, they mount the host directory wherever they run)
    "vllm-h200-cache": ("vllm-h200-tp8", "privileged", CACHE_REF),
}


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    dra.install(chart)  # GB200 multi-node pods claim a ComputeDomain channel
    with chart.operator("--all-namespaces", "--standalone", name="operator-psa") as running:
        yield running


def _namespace(cluster: Cluster, name: str, level: str) -> str:
    cluster.namespace(name, {ENFORCE: level})
    weight_volumes(cluster, name)
    return name


def _workload(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    found = eventually(
        f"workload of {name}",
        lambda: cluster.get("deployment", name, namespace) or cluster.get("leaderworkerset", name, namespace),
        60,
    )
    assert isinstance(found, dict)
    return found


def _violations(cluster: Cluster, namespace: str) -> list[str]:
    events = cluster.list("events", namespace)
    return [
        f"{e['involvedObject']['kind']}/{e['involvedObject']['name']}: {e.get('message', '')}"
        for e in events
        if e.get("reason") == "FailedCreate" and "violates PodSecurity" in e.get("message", "")
    ]


def _model_cache(name: str, namespace: str, deployment: dict[str, Any]) -> dict[str, Any]:
    """The MiniMaxM3ModelCache a deployment's cacheRef names, copying from the deployment's own claim."""
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3ModelCache",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "source": {"pvc": deployment["spec"]["model"]["source"]["pvc"]},
            "nodes": {"accelerator": deployment["spec"]["accelerator"]},
            "path": "/mnt/nvme/m3fleet/psa",
            "prePullImages": False,
        },
    }


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_engine_pods_are_admitted_at_their_level_and_refused_one_stricter(
    chart: Cluster, operator: OperatorProcess, case: str
) -> None:
    stem, level, change = CASES[case]

    def document(namespace: str) -> dict[str, Any]:
        body = renamed(sample(stem), case, namespace)
        for key, value in change.items():  # merged one level down: a cacheRef joins the sample's model
            body["spec"][key] = {**body["spec"].get(key, {}), **value}
        if "cacheRef" in body["spec"]["model"]:
            chart.apply(_model_cache(body["spec"]["model"]["cacheRef"]["name"], namespace, body))
        return body

    admitted = _namespace(chart, f"psa-{case}-{level}", level)
    chart.apply(document(admitted))
    if document(admitted)["spec"]["accelerator"] == "gb200":
        dra.serve_compute_domain(chart, f"{case}-compute-domain", admitted)  # what the DRA driver does
    assert _workload(chart, case, admitted)["metadata"]["annotations"][LEVEL] == level
    wait_ready(chart, case, admitted, timeout=240)
    created = pods(chart, case, admitted)
    assert created and not _violations(chart, admitted)
    if level == "restricted":
        for pod in created:
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    for resource in change.get("nodePool", {}).get("extraResources", {}):
        for pod in created:  # scheduled on a node that has it, with the capability RDMA needs
            [engine] = [c for c in pod["spec"]["containers"] if resource in c["resources"].get("limits", {})]
            assert "IPC_LOCK" in engine["securityContext"]["capabilities"]["add"], engine["securityContext"]
    delete(chart, case, admitted)  # frees the GPU nodes for the next case
    if level == "restricted":
        return  # nothing is stricter than restricted
    stricter = _namespace(chart, f"psa-{case}-{STRICTER[level]}", STRICTER[level])
    chart.apply(document(stricter))
    found = eventually(f"PodSecurity refusals in {stricter}", lambda: _violations(chart, stricter), 120)
    assert any(f'"{STRICTER[level]}:' in v for v in found), found
    assert not pods(chart, case, stricter)

    def refused() -> dict[str, dict[str, Any]]:
        body = chart.get("m3d", case, stricter) or {}
        conditions = {c["type"]: c for c in (body.get("status") or {}).get("conditions") or []}
        return conditions if conditions.get("Ready", {}).get("reason") == "FailedCreate" else {}

    # Status says why there are no pods: the workload controller's refusal, in its own words (the operator
    # reads its FailedCreate events; it may find them only on its next look, 30 s later).
    conditions = eventually(f"Ready=False FailedCreate on {case} in {stricter}", refused, 90)
    assert conditions["Ready"]["status"] == "False", conditions
    assert f'violates PodSecurity "{STRICTER[level]}:' in conditions["Ready"]["message"], conditions["Ready"]
    assert "cannot create pods" in conditions["Ready"]["message"], conditions["Ready"]
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == ("True", "FailedCreate")
    delete(chart, case, stricter, wait=False)


def test_network_policy_is_owned_drift_corrected_recreated_and_pruned(
    chart: Cluster, operator: OperatorProcess
) -> None:
    namespace = _namespace(chart, "psa-netpol", "restricted")
    name = "netpol"
    chart.apply(renamed(sample("vllm-h200-tp8"), name, namespace))
    policy_name = f"{name}-ingress"
    policy = eventually("NetworkPolicy", lambda: chart.get("networkpolicy", policy_name, namespace), 60)
    assert isinstance(policy, dict)
    owner = policy["metadata"]["ownerReferences"][0]
    body = chart.get("m3d", name, namespace)
    assert body is not None and owner["uid"] == body["metadata"]["uid"] and owner["controller"] is True
    wanted = policy["spec"]

    # A hand edit that opens the pods to everyone is undone.
    opened = [{"op": "replace", "path": "/spec/ingress", "value": [{}]}]
    chart.kubectl("patch", f"networkpolicy/{policy_name}", "-n", namespace, "--type=json", "-p", json.dumps(opened))
    eventually(
        "NetworkPolicy restored",
        lambda: (chart.get("networkpolicy", policy_name, namespace) or {}).get("spec") == wanted,
        60,
    )
    # Deleted: re-created.
    chart.kubectl("delete", f"networkpolicy/{policy_name}", "-n", namespace)
    eventually("NetworkPolicy re-created", lambda: chart.get("networkpolicy", policy_name, namespace), 60)
    # spec.network.ingressPolicy false: pruned.
    patch = {"spec": {"network": {"ingressPolicy": False}}}
    chart.kubectl("patch", f"m3d/{name}", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    eventually("NetworkPolicy pruned", lambda: chart.get("networkpolicy", policy_name, namespace) is None, 60)

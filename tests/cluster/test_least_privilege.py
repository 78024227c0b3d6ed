"""Least privilege by default, on a control plane of its own: the chart installed with every default value (the
session's chart grants Secrets in the namespaces other test files use, see conftest.py).

Checked, as the operator's ServiceAccount (a TokenRequest token, what `m3fleet run` uses):
* it may not read Secrets in any namespace (the apiserver's own authorizer, asked through `kubectl auth can-i`);
* the chart's ValidatingAdmissionPolicies refuse every node change but a `cache.m3fleet.dev/` label (another label,
  a taint, an annotation) and every pod change but `pod-deletion-cost` on m3fleet's own pods, each with a message
  naming what it tried; the same changes by the cluster admin are admitted (the policies match the operator only);
* the operator, run as that ServiceAccount, brings a fleet to Ready and stages a model cache on its pool (node labels
  set, then removed with the cache) without one 403 in the audit log.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from tests.support.cluster import dra
from tests.support.cluster.cluster import OPERATOR_NAMESPACE, OPERATOR_SA, Cluster, eventually, fresh_cluster
from tests.support.cluster.fleet import condition, delete, hub_cache, pods, renamed, sample, wait_ready, weight_volumes

from m3fleet import kubeapi
from m3fleet.api.cache import NODE_LABEL_PREFIX
from m3fleet.autoscaling.policy import POD_DELETION_COST

NAMESPACE = "tenant"
POOL = ("h200-4", "h200-5")
POOL_LABEL = "m3fleet.test/least-privilege-pool"
OTHER_NODE = "h200-0"
CACHE_LABEL = f"{NODE_LABEL_PREFIX}{NAMESPACE}.m3"


@pytest.fixture(scope="module")
def defaults() -> Iterator[Cluster]:
    """A fresh control plane with the chart installed at its defaults (plus the loopback webhook URL every
    install on this tier needs: the operator runs on the host)."""
    with fresh_cluster("m3fleet-least-") as cluster:
        cluster.install_chart()
        cluster.namespace(NAMESPACE)
        weight_volumes(cluster, NAMESPACE)
        yield cluster


@pytest.fixture(scope="module")
def as_operator(defaults: Cluster) -> Path:
    """A kubeconfig of the operator's ServiceAccount with a token of its own (a copy: each operator run rewrites the
    file with its token, and the refusals provoked here must not count as the operator's)."""
    path, _, _ = defaults.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SA)
    own = defaults.workdir / "as-operator.kubeconfig"
    shutil.copyfile(path, own)
    return own


def _patch(kubeconfig: Path, kind: str, name: str, patch: dict[str, Any], namespace: str = "") -> str:
    """A merge patch as the kubeconfig's user, sent as is (kubectl patch would GET the object first, which the
    operator may not do on nodes): "" when admitted, else the apiserver's message."""
    client = kubernetes.config.new_client_from_config(str(kubeconfig))
    path = f"/api/v1/namespaces/{namespace}/{kind}s/{name}" if namespace else f"/api/v1/{kind}s/{name}"
    try:
        kubeapi.call(client, "PATCH", path, patch, content="application/merge-patch+json")
    except kubeapi.ApiError as exc:
        return exc.message
    finally:
        client.close()
    return ""


def _refused(kubeconfig: Path, kind: str, name: str, patch: dict[str, Any], namespace: str = "") -> str:
    """The apiserver's refusal of the operator's patch (once the policy is in force: it is watched, not read)."""
    message: str = eventually(
        f"the policy refuses {patch} on {kind} {name}", lambda: _patch(kubeconfig, kind, name, patch, namespace), 30
    )
    assert "ValidatingAdmissionPolicy" in message, message
    return message


def _labels(cluster: Cluster, node: str) -> dict[str, str]:
    body = cluster.get("node", node) or {}
    return dict((body.get("metadata") or {}).get("labels") or {})


def test_the_default_install_grants_no_secrets_anywhere(defaults: Cluster, as_operator: Path) -> None:
    def can_i(*args: str) -> str:
        result = defaults.kubectl("auth", "can-i", *args, kubeconfig=as_operator, check=False)
        return result.stdout.strip()

    for namespace in (NAMESPACE, OPERATOR_NAMESPACE, "kube-system", "default"):
        assert can_i("get", "secrets", "-n", namespace) == "no", namespace
        assert can_i("create", "secrets", "-n", namespace) == "no", namespace
    assert can_i("list", "secrets", "--all-namespaces") == "no"
    # What the policies narrow is granted by RBAC: the refusals below are the policies', not RBAC's.
    assert can_i("patch", "nodes") == "yes"
    assert can_i("patch", "pods", "-n", "kube-system") == "yes"


def test_the_operator_may_change_only_cache_labels_on_nodes(defaults: Cluster, as_operator: Path) -> None:
    message = _refused(as_operator, "node", OTHER_NODE, {"metadata": {"labels": {"team": "evil"}}})
    assert "may change only the model cache labels (cache.m3fleet.dev/*) on a node, not team" in message
    removal = {"metadata": {"labels": {"kubernetes.io/hostname": None}}}
    assert "not kubernetes.io/hostname" in _refused(as_operator, "node", OTHER_NODE, removal)
    taint = {"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}}
    assert "may not change a node's spec" in _refused(as_operator, "node", OTHER_NODE, taint)
    cordon = {"spec": {"unschedulable": True}}
    assert "may not change a node's spec" in _refused(as_operator, "node", OTHER_NODE, cordon)
    annotation = {"metadata": {"annotations": {"evil": "x"}}}
    assert "annotations" in _refused(as_operator, "node", OTHER_NODE, annotation)
    mixed = {"metadata": {"labels": {CACHE_LABEL: "ready", "team": "evil"}}}
    assert "not team" in _refused(as_operator, "node", OTHER_NODE, mixed)
    assert "team" not in _labels(defaults, OTHER_NODE) and CACHE_LABEL not in _labels(defaults, OTHER_NODE)

    # Its own labels go through, on and off; and the admin is not matched by the policy at all.
    assert _patch(as_operator, "node", OTHER_NODE, {"metadata": {"labels": {CACHE_LABEL: "ready"}}}) == ""
    assert _labels(defaults, OTHER_NODE)[CACHE_LABEL] == "ready"
    assert _patch(as_operator, "node", OTHER_NODE, {"metadata": {"labels": {CACHE_LABEL: None}}}) == ""
    assert CACHE_LABEL not in _labels(defaults, OTHER_NODE)
    assert _patch(defaults.kubeconfig, "node", OTHER_NODE, {"metadata": {"labels": {"team": "admin"}}}) == ""
    defaults.kubectl("label", "node", OTHER_NODE, "team-")


def test_fleet_and_model_cache_run_on_the_defaults_and_pods_take_only_the_deletion_cost(
    defaults: Cluster, as_operator: Path
) -> None:
    for node in POOL:
        defaults.kubectl("label", "node", node, f"{POOL_LABEL}=a", "--overwrite")
    fleet = renamed(sample("vllm-h200-tp8"), "least", NAMESPACE)
    cache = hub_cache(NAMESPACE, "/mnt/nvme/m3fleet/least", POOL_LABEL, deleteFilesOnRemoval=True)
    try:
        with defaults.operator("--all-namespaces", "--standalone", name="operator-least-privilege") as running:
            defaults.apply(fleet)
            body = wait_ready(defaults, "least", NAMESPACE)
            assert condition(body, "Available")["status"] == "True"
            defaults.apply(cache)
            eventually(
                "the pool's nodes labelled ready",
                lambda: all(_labels(defaults, n).get(CACHE_LABEL) == "ready" for n in POOL),
                120,
            )
            assert CACHE_LABEL not in _labels(defaults, OTHER_NODE)

            [pod] = pods(defaults, "least", NAMESPACE)
            name = pod["metadata"]["name"]
            cost = {"metadata": {"annotations": {POD_DELETION_COST: "7"}}}
            assert _patch(as_operator, "pod", name, cost, NAMESPACE) == ""
            other = {"metadata": {"annotations": {"evil": "x"}}}
            message = _refused(as_operator, "pod", name, other, NAMESPACE)
            assert f"may change only the annotations {POD_DELETION_COST} on a pod, not evil" in message
            relabel = {"metadata": {"labels": {"app.kubernetes.io/managed-by": "someone"}}}
            assert "labels" in _refused(as_operator, "pod", name, relabel, NAMESPACE)

            defaults.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "foreign", "namespace": NAMESPACE},
                    "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]},
                }
            )
            foreign = {"metadata": {"annotations": {POD_DELETION_COST: "1"}}}
            assert "only pods it manages" in _refused(as_operator, "pod", "foreign", foreign, NAMESPACE)

            defaults.kubectl("delete", "m3cache", "m3", "-n", NAMESPACE, "--wait=false")
            eventually("the cache removed", lambda: defaults.get("m3cache", "m3", NAMESPACE) is None, 120)
            assert not any(CACHE_LABEL in _labels(defaults, n) for n in POOL)
            assert running.requests(), "the audit log shows no request of the operator's ServiceAccount"
        # Leaving the block checked that no request of the operator was answered 403 (cluster.operator).
    finally:
        delete(defaults, "least", NAMESPACE)
        defaults.kubectl("delete", "pod", "foreign", "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        for node in POOL:
            defaults.kubectl("label", "node", node, f"{POOL_LABEL}-", check=False)


def test_a_fleet_that_needs_a_secret_where_none_is_granted_says_how_to_grant_it(defaults: Cluster) -> None:
    """Multi-node TensorRT-LLM needs its SSH key Secret; in a namespace the chart grants no Secrets, the apiserver
    refuses the operator (its only 403s, all on secrets) and the resource says which value grants them — and nothing
    of the fleet is applied meanwhile."""
    dra.install(defaults)  # GB200 groups need the ComputeDomain API served, or the fleet waits for that first
    document = renamed(sample("trtllm-gb200-2x4-tep"), "keyed", NAMESPACE)
    try:
        run = defaults.operator("--all-namespaces", "--standalone", name="operator-no-secrets", allow_forbidden=True)
        with run as op:
            defaults.apply(document)
            degraded = eventually(
                "Degraded SecretsForbidden",
                lambda: (
                    (c := condition(defaults.get("m3d", "keyed", NAMESPACE), "Degraded")).get("reason")
                    == "SecretsForbidden"
                    and c
                ),
                90,
            )
            assert f"Secrets in namespace {NAMESPACE}" in degraded["message"]
            assert f"add {NAMESPACE} to the chart's rbac.secretNamespaces" in degraded["message"]
            assert defaults.list("leaderworkersets", NAMESPACE) == []
        refused = op.forbidden()
        assert refused, "the operator was never refused a Secret"
        assert all(r.startswith("get secrets/") for r in refused), refused
    finally:
        delete(defaults, "keyed", NAMESPACE)

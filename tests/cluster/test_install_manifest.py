"""The install without Helm: `kubectl apply -f manifests/install.yaml` (and `-k manifests/install`, the same objects)
on a control plane of its own. The session's cluster holds the chart's release in `m3fleet-system`, whose objects
the file would take over, so this module starts a second one (about 12 s).

Checked: the file applies in one pass as a user runs it (Namespace, CRDs, RBAC, the operator's Deployment); the
CRDs are Established; the operator's pod is admitted under the namespace's Pod Security `restricted` and Ready;
the kustomize directory describes exactly what the file created (`kubectl diff -k` finds nothing); and the
operator, run as the file's ServiceAccount, brings a sample fleet to Ready without one Forbidden request."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.cluster.cluster import REPO, Cluster, eventually, fresh_cluster
from tests.support.cluster.fleet import condition, delete, renamed, sample, wait_ready, weight_volumes

INSTALL_FILE = REPO / "manifests" / "install.yaml"
INSTALL_DIR = REPO / "manifests" / "install"
NAMESPACE = "plain"


@pytest.fixture(scope="module")
def bare() -> Iterator[Cluster]:
    """A fresh control plane: no chart, no CRDs."""
    with fresh_cluster("m3fleet-install-") as cluster:
        yield cluster


def test_kubectl_apply_of_install_yaml_runs_the_operator_and_a_fleet(bare: Cluster) -> None:
    assert bare.get("crd", "minimaxm3deployments.m3fleet.dev") is None
    applied = bare.kubectl("apply", "--server-side", "-f", str(INSTALL_FILE))
    assert "Warning" not in applied.stderr, applied.stderr
    for crd in ("minimaxm3deployments.m3fleet.dev", "minimaxm3modelcaches.m3fleet.dev"):
        bare.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    namespace = bare.get("namespace", "m3fleet-system")
    assert namespace is not None
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    eventually(
        "the operator's pod Ready",
        lambda: [d["status"].get("readyReplicas") for d in bare.list("deployments", "m3fleet-system")] == [1],
        90,
    )

    # The kustomize install is the same set of objects: applied over the file's, it would change nothing.
    diff = bare.kubectl("diff", "--server-side", "-k", str(INSTALL_DIR), check=False)
    assert diff.returncode == 0, f"kubectl diff -k manifests/install found changes:\n{diff.stdout}{diff.stderr}"

    bare.namespace(NAMESPACE)
    weight_volumes(bare, NAMESPACE)
    with bare.operator("--all-namespaces", "--standalone", name="operator-install-yaml") as running:
        bare.apply(renamed(sample("vllm-h200-tp8"), "plain", NAMESPACE))
        try:
            body = wait_ready(bare, "plain", NAMESPACE)
            assert condition(body, "Available")["status"] == "True"
        finally:
            delete(bare, "plain", NAMESPACE)
        assert running.requests(), "the audit log shows no request of the file's ServiceAccount"

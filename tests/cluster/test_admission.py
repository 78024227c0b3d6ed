"""What `kubectl apply` enforces, on a real apiserver: the CRD installs, explains itself, admits every
sample and rejects every invalid case of the CRD's unit tests with the field path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.cluster.cluster import REPO, SAMPLES, Cluster, eventually
from tests.support.crd_cases import (
    CEL_CASES,
    CEL_IDS,
    NODE_SELECTORS_ADMITTED,
    NODE_SELECTORS_REFUSED,
    PEERS_ADMITTED,
    PEERS_REFUSED,
    TOLERATIONS_ADMITTED,
    TOLERATIONS_REFUSED,
    with_spec,
)

from m3fleet.api.conditions import DEPLOYMENT

CRD_NAME = "minimaxm3deployments.m3fleet.dev"
NAMESPACE = "admission"


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> Cluster:
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    cluster.control_plane.wait_established(CRD_NAME)
    cluster.namespace(NAMESPACE)
    # discovery follows the Established condition by a moment
    eventually("m3d in discovery", lambda: cluster.kubectl("get", "m3d", "-A", check=False).returncode == 0, 30)
    return cluster


def _dry_run(cluster: Cluster, document: dict[str, Any]) -> tuple[int, str]:
    document = {**document, "metadata": {**document["metadata"], "namespace": NAMESPACE}}
    result = cluster.apply(document, "--dry-run=server", check=False)
    return result.returncode, result.stderr


def test_explain_shows_the_field_descriptions(crd: Cluster) -> None:
    # the CRD's OpenAPI document is published a moment after it is served
    explained = eventually(
        "kubectl explain m3d.spec.context", lambda: crd.kubectl("explain", "m3d.spec.context", check=False).stdout, 60
    )
    out = str(explained)
    assert "maxModelLen" in out and "kvCacheDtype" in out and "minSequencesAtMaxLen" in out
    # the description of the field, not only its name
    assert re.search(r"DESCRIPTION:\s+\S", out), out


def test_explain_shows_every_condition_reason(crd: Cluster) -> None:
    """`kubectl explain` lists each condition type and every reason of the catalogue (m3fleet.api.conditions)."""
    explained = eventually(
        "kubectl explain m3d.status.conditions",
        lambda: crd.kubectl("explain", "m3d.status.conditions", check=False).stdout,
        60,
    )
    out = " ".join(str(explained).split())  # kubectl wraps the description
    for entry in DEPLOYMENT.conditions:
        assert f"{entry.type} ({entry.at_rest} at rest)" in out, out
    for reason in DEPLOYMENT.reasons():
        assert reason in out, reason


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_sample_is_admitted(crd: Cluster, path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        code, stderr = _dry_run(crd, document)
        assert code == 0, stderr


@pytest.mark.parametrize(("resource", "expected", "field"), CEL_CASES, ids=CEL_IDS)
def test_every_invalid_case_is_rejected_with_its_field(
    crd: Cluster, resource: dict[str, Any], expected: str, field: str
) -> None:
    code, stderr = _dry_run(crd, resource)
    assert code != 0, f"admitted: {resource}"
    # the apiserver's message names the field the unit tier expects, then the rule's message
    assert field in stderr and expected in stderr, stderr


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"context__maxModelLen": 2_000_000}, "spec.context.maxModelLen"),
        ({"context__maxModelLen": 0}, "spec.context.maxModelLen"),
        ({"replicas": -1}, "spec.replicas"),
        ({"accelerator": "a100"}, "spec.accelerator"),
        ({"autoscaling__target": {"kvCacheUtilization": 0}}, "spec.autoscaling.target.kvCacheUtilization"),
    ],
)
def test_schema_violations_are_rejected_with_the_field_path(crd: Cluster, changes: dict[str, Any], field: str) -> None:
    code, stderr = _dry_run(crd, with_spec(**changes))
    assert code != 0 and field in stderr, stderr


def test_unknown_fields_are_rejected_by_kubectl(crd: Cluster) -> None:
    code, stderr = _dry_run(crd, with_spec(contxt={}))
    assert code != 0 and "contxt" in stderr, stderr


def _carrier(kind: str, api_version: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "carrier"}, "spec": spec}


# The CRD's rules are a copy of the apiserver's validation of the child: the child that carries a value is the
# reference, and the deployment must get its verdict.
CARRIED = [
    *[
        ({"nodePool": {"nodeSelector": labels}}, admitted)
        for labels, admitted in [
            *[(labels, False) for labels, _ in NODE_SELECTORS_REFUSED],
            *[(labels, True) for labels in NODE_SELECTORS_ADMITTED],
        ]
    ],
    *[
        ({"nodePool": {"tolerations": [toleration]}}, admitted)
        for toleration, admitted in [
            *[(toleration, False) for toleration, _, _ in TOLERATIONS_REFUSED],
            *[(toleration, True) for toleration in TOLERATIONS_ADMITTED],
        ]
    ],
    *[
        ({"network": {"allowFrom": [peer]}}, admitted)
        for peer, admitted in [
            *[(peer, False) for peer, _, _ in PEERS_REFUSED],
            *[(peer, True) for peer in PEERS_ADMITTED],
        ]
    ],
]


def _child_carrying(spec: dict[str, Any]) -> dict[str, Any]:
    if "network" in spec:
        peer_spec = {"podSelector": {}, "ingress": [{"from": spec["network"]["allowFrom"]}]}
        return _carrier("NetworkPolicy", "networking.k8s.io/v1", peer_spec)
    container = {"name": "engine", "image": "vllm/vllm-openai:v0.33.0"}
    return _carrier("Pod", "v1", {**spec["nodePool"], "containers": [container]})


@pytest.mark.parametrize(("spec", "admitted"), CARRIED)
def test_values_get_the_verdict_the_child_that_carries_them_gets(
    crd: Cluster, spec: dict[str, Any], admitted: bool
) -> None:
    child_code, child_err = _dry_run(crd, _child_carrying(spec))
    code, err = _dry_run(crd, with_spec(**spec))
    assert (child_code == 0) == admitted, child_err
    assert (code == 0) == admitted, err

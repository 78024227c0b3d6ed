"""What `kubectl apply` enforces, on a real apiserver: the CRD installs, explains itself, admits every
sample and rejects every invalid case of the CRD's unit tests with the field path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.cluster.cluster import REPO, SAMPLES, Cluster, eventually
from tests.unit.test_crd import (
    CEL_CASES,
    CEL_IDS,
    NODE_SELECTORS_ADMITTED,
    NODE_SELECTORS_REFUSED,
    TOLERATIONS_ADMITTED,
    TOLERATIONS_REFUSED,
    with_spec,
)

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
        ({"accelerator": "h100"}, "spec.accelerator"),
        ({"autoscaling__target": {"kvCacheUtilization": 0}}, "spec.autoscaling.target.kvCacheUtilization"),
    ],
)
def test_schema_violations_are_rejected_with_the_field_path(crd: Cluster, changes: dict[str, Any], field: str) -> None:
    code, stderr = _dry_run(crd, with_spec(**changes))
    assert code != 0 and field in stderr, stderr


def test_unknown_fields_are_rejected_by_kubectl(crd: Cluster) -> None:
    code, stderr = _dry_run(crd, with_spec(contxt={}))
    assert code != 0 and "contxt" in stderr, stderr


NODE_POOLS = [
    *[({"nodeSelector": labels}, False) for labels, _ in NODE_SELECTORS_REFUSED],
    *[({"tolerations": [toleration]}, False) for toleration, _, _ in TOLERATIONS_REFUSED],
    *[({"nodeSelector": labels}, True) for labels in NODE_SELECTORS_ADMITTED],
    *[({"tolerations": [toleration]}, True) for toleration in TOLERATIONS_ADMITTED],
]


@pytest.mark.parametrize(("node_pool", "admitted"), NODE_POOLS)
def test_node_pool_values_get_the_verdict_the_pod_that_carries_them_gets(
    crd: Cluster, node_pool: dict[str, Any], admitted: bool
) -> None:
    # The CRD's rules are a copy of the apiserver's Pod validation: the Pod they reach is the reference.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "carrier"},
        "spec": {**node_pool, "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.33.0"}]},
    }
    pod_code, pod_err = _dry_run(crd, pod)
    code, err = _dry_run(crd, with_spec(nodePool=node_pool))
    assert (pod_code == 0) == admitted, pod_err
    assert (code == 0) == admitted, err

"""The generated CRD: in sync with the models, structural, and its CEL rules do what they say."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from m3fleet.api.crd import crd_yaml
from tests.crdtools import CRD_PATH, admit, load_crd, openapi_schema, rules


def test_checked_in_crd_matches_the_models() -> None:
    assert CRD_PATH.read_text() == crd_yaml(), "crds/ drifted from the models: run `m3fleet crd > crds/...yaml`"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.get("properties", {}).items():
            found.extend(_walk(value, f"{path}.{key}"))
        if isinstance(node.get("items"), dict):
            found.extend(_walk(node["items"], f"{path}[]"))
        if isinstance(node.get("additionalProperties"), dict):
            found.extend(_walk(node["additionalProperties"], f"{path}{{}}"))
    return found


def test_schema_is_structural() -> None:
    text = CRD_PATH.read_text()
    assert "$ref" not in text and "$defs" not in text and "anyOf" not in text and "uniqueItems" not in text
    for path, node in _walk(openapi_schema()):
        assert "type" in node, f"{path} has no type"
        assert node.get("additionalProperties") is not False, f"{path} has additionalProperties: false"
        assert not ("additionalProperties" in node and "properties" in node), f"{path} mixes both"
        assert "title" not in node and node.get("default", 0) is not None, path
        if node["type"] == "string" and "enum" not in node:
            assert "maxLength" in node or not path.startswith(".spec") or path.endswith("{}"), f"{path} unbounded"
        if node["type"] == "array":
            assert "maxItems" in node, f"{path}: arrays need maxItems for CEL cost estimation"


def test_subresources_columns_and_names() -> None:
    crd = load_crd()
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert version["subresources"]["status"] == {}
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["m3d"] and names["categories"] == ["m3fleet"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    for expected in ("Engine", "Accelerator", "TP", "Nodes/Replica", "Replicas", "Ready", "Context", "Age"):
        assert expected in columns
    conditions = openapi_schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_every_field_has_a_description() -> None:
    for path, node in _walk(openapi_schema()["properties"]["spec"], ".spec"):
        if path != ".spec" and not path.endswith("[]") and not path.endswith("{}"):
            assert node.get("description"), f"{path} has no description"


def test_every_sample_is_admitted(sample: dict[str, Any]) -> None:
    assert admit(sample) == []


MINIMAL: dict[str, Any] = {
    "apiVersion": "m3fleet.dev/v1alpha1",
    "kind": "MiniMaxM3Deployment",
    "metadata": {"name": "x"},
    "spec": {"model": {"source": {"pvc": {"claimName": "w"}}}},
}


def with_spec(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(MINIMAL)
    for dotted, value in changes.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return doc


def test_minimal_resource_is_admitted_thanks_to_defaults() -> None:
    # CEL rules read spec.engine.name etc.; the apiserver's defaulting must supply them.
    assert admit(MINIMAL) == []


CEL_CASES = [
    ({"model__variant": "mxfp4", "accelerator": "h200"}, "mxfp4"),
    ({"model__variant": "mxfp4", "accelerator": "gb200"}, "mxfp4"),
    ({"engine__name": "trtllm", "accelerator": "mi355x"}, "NVIDIA"),
    ({"engine__name": "trtllm", "accelerator": "gb200", "model__variant": "mxfp8"}, "bf16 only"),
    ({"parallelism__tensorParallelSize": 3}, "tensorParallelSize"),
    ({"parallelism__tensorParallelSize": 12}, "tensorParallelSize"),
    ({"parallelism__dataParallelSize": 6}, "dataParallelSize"),
    ({"autoscaling__minReplicas": 5, "autoscaling__maxReplicas": 2}, "minReplicas"),
    ({"model__source": {"pvc": {"claimName": "w"}, "huggingFace": {"cacheClaimName": "c"}}}, "exactly one"),
    ({"model__source": {}}, "exactly one"),
]


@pytest.mark.parametrize(("changes", "expected"), CEL_CASES, ids=[e for _, e in CEL_CASES])
def test_cel_rule_rejects(changes: dict[str, Any], expected: str) -> None:
    messages = admit(with_spec(**changes))
    assert len(messages) == 1 and expected in messages[0], messages


VALID_CASES = [
    {"model__variant": "mxfp4", "accelerator": "mi355x"},
    {"engine__name": "trtllm", "accelerator": "gb200"},
    {"engine__name": "trtllm", "accelerator": "h200", "model__variant": "bf16"},
    {"parallelism__tensorParallelSize": 16, "parallelism__dataParallelSize": 2},
    {"autoscaling__minReplicas": 2, "autoscaling__maxReplicas": 2},
    {"model__source": {"huggingFace": {"cacheClaimName": "c", "tokenSecretRef": {"name": "hf"}}}},
]


@pytest.mark.parametrize("changes", VALID_CASES)
def test_cel_rule_admits(changes: dict[str, Any]) -> None:
    assert admit(with_spec(**changes)) == []


def test_every_cel_rule_is_exercised_by_a_rejection() -> None:
    messages = {r.message for r in rules(openapi_schema())}
    rejected = {m for changes, _ in CEL_CASES for m in admit(with_spec(**changes))}
    assert messages == rejected


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"context__maxModelLen": 2_000_000}, "maximum"),
        ({"context__maxModelLen": 0}, "minimum"),
        ({"replicas": -1}, "minimum"),
        ({"accelerator": "h100"}, "is not one of"),
        ({"contxt": {}}, "Additional properties"),
        ({"autoscaling__target": {"kvCacheUtilization": 0}}, "less than or equal to the minimum"),
    ],
)
def test_schema_rejects(changes: dict[str, Any], fragment: str) -> None:
    problems = admit(with_spec(**changes))
    assert problems and any(fragment in p for p in problems), problems

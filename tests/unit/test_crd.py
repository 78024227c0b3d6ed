"""The generated CRD: in sync with the models, structural, and its CEL rules do what they say."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from m3fleet.api import parse_resource
from m3fleet.api.crd import crd_yaml
from m3fleet.api.models import (
    MAX_NAME_LENGTH,
    MAX_REPLICAS,
    MAX_SURGE,
    NAME_PATTERN,
    STATEFULSET_NAME_MAX,
)
from m3fleet.cli import main
from m3fleet.errors import SpecError, SpecErrors
from tests.support.crd_cases import (
    CEL_CASES,
    CEL_IDS,
    LONGEST_NAME,
    MINIMAL,
    NODE_SELECTORS_ADMITTED,
    PEERS_ADMITTED,
    POD_TEMPLATES_ADMITTED,
    PROM_URL,
    TOLERATIONS_ADMITTED,
    with_name,
    with_spec,
)
from tests.support.crdtools import CRD_PATH, admit, failed_rules, load_crd, openapi_schema, rules, schema_at


def test_checked_in_crd_matches_the_models() -> None:
    assert CRD_PATH.read_text() == crd_yaml(), "crds/ drifted from the models: run `python3 hack/generate.py`"


@pytest.mark.parametrize("path", sorted((CRD_PATH.parent).glob("*.yaml")), ids=lambda p: p.stem)
def test_every_cel_rule_says_how_to_fix_what_it_refuses(path: Path) -> None:
    """kubectl apply prints the rule's message as it is: the reason alone would leave the user guessing."""
    crd = yaml.safe_load(path.read_text())
    for version in crd["spec"]["versions"]:
        for rule in rules(version["schema"]["openAPIV3Schema"]):
            assert "; fix: " in rule.message, f"{rule.path or '(root)'}: {rule.rule!r} says no fix: {rule.message!r}"


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


def test_minimal_resource_is_admitted_thanks_to_defaults() -> None:
    # CEL rules read spec.engine.name etc.; the apiserver's defaulting must supply them.
    assert admit(MINIMAL) == []


@pytest.mark.parametrize(("resource", "expected", "field"), CEL_CASES, ids=CEL_IDS)
def test_cel_rule_rejects_and_names_the_field(resource: dict[str, Any], expected: str, field: str) -> None:
    failed = failed_rules(resource)
    assert len(failed) == 1 and expected in failed[0].message, [r.message for r in failed]
    assert failed[0].field == field  # what `kubectl apply` prints before the message


VALID_CASES = [
    with_spec(model__variant="mxfp4", accelerator="mi355x"),
    with_spec(engine__name="trtllm", accelerator="gb200"),
    with_spec(engine__name="trtllm", accelerator="h200", model__variant="bf16"),
    with_spec(engine__name="vllm", engine__apiKeySecretRef={"name": "k", "key": "key"}),
    with_spec(engine__name="sglang", engine__apiKeySecretRef={"name": "k"}, engine__adminApiKeySecretRef={"name": "a"}),
    with_spec(parallelism__strategy="dp-ep", parallelism__tensorParallelSize=16, parallelism__dataParallelSize=2),
    with_spec(autoscaling__minReplicas=2, autoscaling__maxReplicas=2),
    with_spec(
        autoscaling__schedule=[
            {"name": "peak", "start": "22:00", "end": "02:00", "days": ["mon", "fri"], "minReplicas": 3},
            {"name": "cap", "start": "09:00", "end": "17:00", "maxReplicas": 2},
        ]
    ),
    with_spec(model__source={"huggingFace": {"cacheClaimName": "c", "tokenSecretRef": {"name": "hf"}}}),
    with_spec(model__source={"huggingFace": {"cacheClaimName": "c"}}, model__cacheRef={"name": "m3"}),
    with_spec(model__cacheRef={"name": "m3", "nodeAffinity": "Preferred"}),
    with_spec(rollout={"maxSurge": 1, "maxUnavailable": 0}),
    with_spec(rollout={"maxSurge": 0, "maxUnavailable": 1}),
    with_spec(rollout={"maxSurge": 2}),
    with_spec(autoscaling__prometheus={"url": "http://prometheus-operated.monitoring:9090"}),
    with_spec(autoscaling__prometheus={"url": "https://prom.example/prometheus/", "caSecretRef": {"name": "ca"}}),
    with_spec(autoscaling__prometheus={"url": "https://10.0.0.1:9090", "insecureSkipVerify": True}),
    *[with_spec(nodePool__nodeSelector=labels) for labels in NODE_SELECTORS_ADMITTED],
    with_spec(nodePool__tolerations=TOLERATIONS_ADMITTED),
    with_spec(network__allowFrom=PEERS_ADMITTED),
    *[with_spec(podTemplate=template) for template in POD_TEMPLATES_ADMITTED],
    with_name("a"),
    with_name("m3-chat-2"),
    with_name(LONGEST_NAME),
]


@pytest.mark.parametrize("resource", VALID_CASES)
def test_cel_rule_admits(resource: dict[str, Any]) -> None:
    assert admit(resource) == []


def test_every_cel_rule_is_exercised_by_a_rejection() -> None:
    messages = {r.message for r in rules(openapi_schema())}
    rejected = {r.message for resource, _, _ in CEL_CASES for r in failed_rules(resource)}
    assert messages == rejected


def test_every_field_path_names_a_declared_field() -> None:
    # The apiserver rejects the whole CRD when a rule's fieldPath does not resolve in the schema, or its
    # reason is not one of these.
    schema = openapi_schema()
    for rule in rules(schema):
        if rule.field_path:
            assert schema_at(schema, tuple(rule.field.split("."))) is not None, rule
        assert rule.reason in ("FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate")


def test_the_root_declares_only_what_a_structural_schema_may_in_metadata() -> None:
    # Only metadata.name and metadata.generateName may be restricted; both declared as strings keep the
    # declared bounds in the CEL type (the apiserver substitutes its own otherwise).
    metadata = openapi_schema()["properties"]["metadata"]
    assert metadata["type"] == "object" and set(metadata["properties"]) == {"name", "generateName"}
    assert all(p["type"] == "string" for p in metadata["properties"].values())
    assert set(metadata) <= {"type", "properties"}


# --- metadata.name: the limit, and the same verdict from the CLI ------------------------------


def test_the_name_limit_leaves_room_for_every_statefulset_the_lws_controller_names() -> None:
    # Worker StatefulSets are <name>-<group index>; groups go up to replicas + maxSurge - 1.
    largest_group = MAX_REPLICAS + MAX_SURGE - 1
    assert MAX_NAME_LENGTH + len(f"-{largest_group}") <= STATEFULSET_NAME_MAX == 52
    assert MAX_NAME_LENGTH + len("-api") <= 63  # the Service, a DNS-1035 label
    assert openapi_schema()["properties"]["spec"]["properties"]["replicas"]["maximum"] == MAX_REPLICAS
    autoscaling = openapi_schema()["properties"]["spec"]["properties"]["autoscaling"]["properties"]
    assert autoscaling["maxReplicas"]["maximum"] == MAX_REPLICAS
    rollout = openapi_schema()["properties"]["spec"]["properties"]["rollout"]["properties"]
    assert rollout["maxSurge"]["maximum"] == MAX_SURGE


def cli_plan(tmp_path: Path, resource: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump(resource))
    code = main(["plan", "-f", str(path), "-o", "json"])
    out, err = capsys.readouterr()
    assert (code == 0) == bool(out) and "Traceback" not in err
    return code, err


@pytest.mark.parametrize(("resource", "expected", "field"), CEL_CASES, ids=CEL_IDS)
def test_the_cli_rejects_what_admission_rejects(
    resource: dict[str, Any], expected: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = cli_plan(tmp_path, resource, capsys)
    assert code == 2 and err.startswith("error: ")


# The checks the model shares with the CRD word the verdict alike: the field, then the same reason and fix.
SHARED = [
    case
    for case in CEL_CASES
    if case[2]
    in (
        "metadata.name",
        "spec.rollout.maxUnavailable",
        "spec.autoscaling.schedule",
        PROM_URL,
        "spec.autoscaling.prometheus.insecureSkipVerify",
    )
    or "without spec.gateway" in case[1]
    or case[2].startswith("spec.podTemplate")  # m3fleet's own names, refused alike by plan, webhook and apiserver
]


@pytest.mark.parametrize(("resource", "expected", "field"), SHARED, ids=[f"{f}:{e}" for _, e, f in SHARED])
def test_the_cli_says_what_admission_says(
    resource: dict[str, Any], expected: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, err = cli_plan(tmp_path, resource, capsys)
    (rule,) = failed_rules(resource)
    reason, fix = rule.message.split(" ", 1)[1].split("; fix: ")
    assert f"{field}: " in err and reason in err and f"fix: {fix}" in err, err


@pytest.mark.parametrize("resource", VALID_CASES)
def test_the_cli_admits_what_admission_admits(
    resource: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = cli_plan(tmp_path, resource, capsys)
    assert code == 0, err


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.text(alphabet="abz09-.A_", min_size=1, max_size=MAX_NAME_LENGTH + 3),
        st.from_regex(NAME_PATTERN, fullmatch=True).filter(lambda n: len(n) <= MAX_NAME_LENGTH + 3),
    )
)
def test_a_name_is_admitted_exactly_when_it_is_a_short_dns_1035_label(name: str) -> None:
    # The CLI and the operator judge names with the CRD's own root CEL rules (m3fleet.api.contract).
    expected = re.fullmatch("[a-z]([-a-z0-9]*[a-z0-9])?", name) is not None and len(name) <= MAX_NAME_LENGTH
    assert (admit(with_name(name)) == []) == expected, admit(with_name(name))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(alphabet="htps:/@?#. \t\n\x0b\x0c\r\xa0fileabc019-_[]%", max_size=30),
        st.from_regex(r"https?://[a-z0-9.:\[\]\- \t\n@]{0,12}(/[a-z/ ?#\n]{0,8})?", fullmatch=True),
    )
)
def test_the_model_and_the_crd_agree_on_every_prometheus_url(url: str) -> None:
    resource = with_spec(autoscaling__prometheus={"url": url})
    assert (_model_accepts(resource)) == (admit(resource) == []), url


def _model_accepts(resource: dict[str, Any]) -> bool:
    try:
        parse_resource(copy.deepcopy(resource))
    except (SpecError, SpecErrors):
        return False
    return True


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (
            {"context__maxModelLen": 2_000_000},
            "spec.context.maxModelLen: 2000000 is too large; fix: use a value from 1 to",
        ),
        ({"context__maxModelLen": 0}, "spec.context.maxModelLen: 0 is too small"),
        ({"replicas": -1}, "spec.replicas: -1 is too small; fix: use a value from 0 to 1024"),
        ({"accelerator": "a100"}, 'spec.accelerator: the string "a100" is not supported; fix: use one of h200, gb200'),
        ({"contxt": {}}, "spec.contxt: is not a field of this object; fix: did you mean `context`?"),
        (
            {"context__max_model_len": 8192},
            "spec.context.max_model_len: is not a field of this object; fix: did you mean `maxModelLen`?",
        ),
        ({"replicas": "8"}, 'spec.replicas: must be an integer, not the string "8"'),
        ({"autoscaling__enabled": "yes"}, 'spec.autoscaling.enabled: must be true or false, not the string "yes"'),
        ({"autoscaling__target": {"kvCacheUtilization": 0}}, "use a value greater than 0.0 and at most 1.0"),
        ({"autoscaling__schedule": [{"name": "p", "start": "9:00", "end": "11:00", "minReplicas": 2}]}, "HH:MM"),
        ({"autoscaling__schedule": [{"name": "p", "start": "09:00", "end": "24:00", "minReplicas": 2}]}, "HH:MM"),
        (
            {"autoscaling__gateway": {"matchLabels": {}}},
            "spec.autoscaling.gateway.matchLabels: has 0 entries; fix: give at least 1",
        ),
        (
            {"autoscaling__gateway": {"matchLabels": {f"label_{i}": "x" for i in range(9)}}},
            "spec.autoscaling.gateway.matchLabels: has 9 entries; fix: give at most 8",
        ),
        ({"autoscaling__gateway": {"matchLabels": {"a": "b"}, "requestSizesMetric": "sizes-total"}}, "regular"),
    ],
)
def test_schema_rejects(changes: dict[str, Any], fragment: str) -> None:
    problems = admit(with_spec(**changes))
    assert problems and any(fragment in p for p in problems), problems

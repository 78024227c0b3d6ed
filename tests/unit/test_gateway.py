"""spec.gateway: the InferencePool, the endpoint picker and the HTTPRoute rendered for a fleet, its context tiers,
and what the CRD admits (scale from zero only behind a gateway)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from m3fleet.admission import review
from m3fleet.api import parse_resource
from m3fleet.api.conditions import DeploymentReason
from m3fleet.api.contract import judge
from m3fleet.catalog.engine_metrics import ENGINE_METRICS
from m3fleet.controller.decide import gateway_report, planned_gateway, serving_path_served
from m3fleet.controller.status import gateway_condition
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan
from m3fleet.render import render
from tests.support.samples import SAMPLES_DIR, load_sample

GATEWAY_SAMPLE = SAMPLES_DIR / "vllm-h200-gateway-tiers.yaml"
POOL_KINDS = {"InferencePool", "HTTPRoute", "ServiceAccount", "Role", "RoleBinding"}
MAX_CONTEXT_LABEL = "m3fleet.dev/max-context-tokens"  # the interface with the picker's context-tier filter


def _rendered(doc: dict[str, Any]) -> list[dict[str, Any]]:
    resource = parse_resource(doc)
    return render(resource, plan(resource.spec))


def _gatewayed(sample: str, **gateway: Any) -> dict[str, Any]:
    doc = load_sample(SAMPLES_DIR / f"{sample}.yaml")
    doc["spec"]["gateway"] = {"gatewayRef": {"name": "inference-gateway"}, **gateway}
    return doc


def _one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def _pod_templates(objs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], bool]]:
    """Every engine pod template, and whether it is one that answers requests: a Deployment's (a replica on one
    node), a LeaderWorkerSet's leader (a multi-node replica's entry point), not its workers."""
    templates = []
    for obj in objs:
        if obj["metadata"]["labels"].get("app.kubernetes.io/component") != "engine":
            continue
        if obj["kind"] == "Deployment":
            templates.append((obj["spec"]["template"], True))
        elif obj["kind"] == "LeaderWorkerSet":
            lwt = obj["spec"]["leaderWorkerTemplate"]
            templates += [(lwt["leaderTemplate"], True), (lwt["workerTemplate"], False)]
    return templates


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _picker_config(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(_one(objs, "ConfigMap", f"{name}-epp-config")["data"]["config.yaml"])
    return config


def _picker_flags(objs: list[dict[str, Any]], name: str) -> dict[str, str]:
    args = _one(objs, "Deployment", f"{name}-epp")["spec"]["template"]["spec"]["containers"][0]["args"]
    pairs = [a for a in args if not a.startswith("--") or "=" not in a]
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def test_without_the_field_nothing_of_the_serving_path_is_rendered() -> None:
    for path in sorted(SAMPLES_DIR.glob("*.yaml")):
        doc = load_sample(path)
        if "gateway" in doc["spec"]:
            continue
        objs = _rendered(doc)
        assert not POOL_KINDS & {o["kind"] for o in objs}, path.name
        assert plan(parse_resource(doc).spec).gateway is None
        for template, _ in _pod_templates(objs):
            assert MAX_CONTEXT_LABEL not in template["metadata"]["labels"]


@pytest.mark.parametrize("sample", ["vllm-h200-tp8", "sglang-gb200-mxfp8-2x4-tp8-ep8", "trtllm-gb200-2x4-tep"])
def test_the_pool_selects_exactly_the_serving_pods_on_the_engine_port(sample: str) -> None:
    doc = _gatewayed(sample)
    name = doc["metadata"]["name"]
    objs = _rendered(doc)
    pool = _one(objs, "InferencePool", name)
    selector = pool["spec"]["selector"]["matchLabels"]
    templates = _pod_templates(objs)
    assert any(entry for _, entry in templates)
    for template, entry in templates:
        assert _selects(selector, template["metadata"]["labels"]) is entry, template["metadata"]["labels"]
        if entry:
            ports = {p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            assert pool["spec"]["targetPorts"][0]["number"] in ports
            assert template["metadata"]["labels"][MAX_CONTEXT_LABEL] == str(
                plan(parse_resource(doc).spec).max_model_len
            )
    # The picker's own pods are never endpoints of the pool.
    picker = _one(objs, "Deployment", f"{name}-epp")["spec"]["template"]
    assert not _selects(selector, picker["metadata"]["labels"])
    assert pool["spec"]["endpointPickerRef"]["name"] == _one(objs, "Service", f"{name}-epp")["metadata"]["name"]


@pytest.mark.parametrize(
    ("sample", "prefix"),
    [("vllm-h200-tp8", True), ("sglang-h200-bf16-tp8", True), ("trtllm-gb200-2x4-tep", False)],
)
def test_the_pickers_scorers_and_metric_names_fit_the_engine(sample: str, prefix: bool) -> None:
    doc = _gatewayed(sample)
    name = doc["metadata"]["name"]
    objs = _rendered(doc)
    config = _picker_config(objs, name)
    types = [p["type"] for p in config["plugins"]]
    assert ("prefix-cache-scorer" in types) is prefix
    assert {"kv-cache-utilization-scorer", "queue-scorer"} <= set(types)
    assert "m3fleet-context-tier" not in types  # one tier: nothing to filter
    assert config["featureGates"] == ["flowControl"]  # requests are held while no endpoint can take them
    profile = {p["pluginRef"] for p in config["schedulingProfiles"][0]["plugins"]}
    assert profile == set(types)
    metrics = ENGINE_METRICS[doc["spec"]["engine"]["name"]]
    flags = _picker_flags(objs, name)
    assert flags["--total-queued-requests-metric"] == metrics.waiting[0]
    assert flags["--total-running-requests-metric"] == metrics.running[0]
    assert flags["--kv-cache-usage-percentage-metric"] == metrics.kv_usage[0]
    assert flags["--pool-name"] == name and flags["--pool-namespace"] == doc["metadata"]["namespace"]
    pod = next(t for t, _ in _pod_templates(objs) if "prometheus.io/path" in t["metadata"].get("annotations", {}))
    assert flags["--model-server-metrics-path"] == pod["metadata"]["annotations"]["prometheus.io/path"]


def test_the_route_goes_from_the_named_gateway_to_the_pool() -> None:
    doc = _gatewayed(
        "vllm-h200-tp8",
        gatewayRef={"name": "edge", "namespace": "gateways", "sectionName": "https"},
        hostnames=["m3.example.com"],
        requestTimeoutSeconds=300,
    )
    name = doc["metadata"]["name"]
    route = _one(_rendered(doc), "HTTPRoute", name)
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge", "namespace": "gateways",
         "sectionName": "https"}
    ]  # fmt: skip
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": name}]
    assert rule["timeouts"] == {"request": "300s"} and route["spec"]["hostnames"] == ["m3.example.com"]


def test_the_picker_may_read_only_its_pool_and_pods_in_its_namespace() -> None:
    doc = _gatewayed("vllm-h200-tp8")
    name = doc["metadata"]["name"]
    objs = _rendered(doc)
    role, binding = _one(objs, "Role", f"{name}-epp"), _one(objs, "RoleBinding", f"{name}-epp")
    assert all(rule["verbs"] == ["get", "list", "watch"] for rule in role["rules"])
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("", "pods") in granted and ("inference.networking.k8s.io", "inferencepools") in granted
    assert ("", "secrets") not in granted
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = _one(objs, "ServiceAccount", f"{name}-epp")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "llm"}]
    pod = _one(objs, "Deployment", f"{name}-epp")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account and pod["securityContext"]["runAsNonRoot"] is True


def test_each_context_tier_is_planned_and_rendered_as_its_own_workload() -> None:
    doc = load_sample(GATEWAY_SAMPLE)
    name = doc["metadata"]["name"]
    resource = parse_resource(doc)
    planned = plan(resource.spec)
    assert planned.gateway is not None
    (short,) = doc["spec"]["gateway"]["tiers"]
    # A tier's plan is the plan of the spec at the tier's context.
    alone = copy.deepcopy(doc)
    del alone["spec"]["gateway"]
    alone["spec"]["context"]["maxModelLen"] = short["maxModelLen"]
    expected = plan(parse_resource(alone).spec)
    tier = planned.gateway.tiers[0]
    assert (tier.name, tier.max_model_len) == ("short", short["maxModelLen"])
    assert tier.max_sequences_at_max_len == expected.max_sequences_at_max_len > planned.max_sequences_at_max_len
    assert [t.name for t in planned.gateway.tiers] == ["short", "main"]
    objs = render(resource, planned)
    main, tiered = _one(objs, "Deployment", name), _one(objs, "Deployment", f"{name}-short")
    assert tiered["spec"]["replicas"] == short["replicas"]
    args = tiered["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-model-len") + 1] == str(short["maxModelLen"])
    labels = tiered["spec"]["template"]["metadata"]["labels"]
    assert labels[MAX_CONTEXT_LABEL] == str(short["maxModelLen"])
    assert main["spec"]["template"]["metadata"]["labels"][MAX_CONTEXT_LABEL] == str(planned.max_model_len)
    # The tier's Deployment never claims the main tier's pods.
    assert not _selects(tiered["spec"]["selector"]["matchLabels"], main["spec"]["template"]["metadata"]["labels"])
    # Both tiers are behind the one pool, and the picker filters by context.
    selector = _one(objs, "InferencePool", name)["spec"]["selector"]["matchLabels"]
    assert _selects(selector, labels) and _selects(selector, main["spec"]["template"]["metadata"]["labels"])
    assert next(p["type"] for p in _picker_config(objs, name)["plugins"]) == "m3fleet-context-tier"
    # The autoscaler's per-tier decision overrides the tier's replicas.
    resized = render(resource, planned, tier_replicas={"short": 3})
    assert _one(resized, "Deployment", f"{name}-short")["spec"]["replicas"] == 3


def test_a_changed_picker_configuration_restarts_the_picker() -> None:
    one = _rendered(_gatewayed("vllm-h200-tp8"))
    two = _rendered(_gatewayed("vllm-h200-tp8", tiers=[{"name": "short", "maxModelLen": 32768}]))

    def digest(objs: list[dict[str, Any]]) -> str:
        name = "m3-vllm-h200-tp8-epp"
        annotations = _one(objs, "Deployment", name)["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["m3fleet.dev/endpoint-picker-config-digest"])

    assert digest(one) != digest(two)


def _problem(doc: dict[str, Any]) -> str:
    with pytest.raises((SpecError, SpecErrors)) as caught:
        plan(parse_resource(doc).spec)
    return str(caught.value)


def test_scale_from_zero_is_admitted_only_behind_a_gateway() -> None:
    doc = load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml")
    doc["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 0, "prometheus": {"url": "http://prom:9090"}}
    problem = _problem(doc)
    assert "spec.autoscaling.minReplicas" in problem and "fix:" in problem and "spec.gateway" in problem
    doc["spec"]["gateway"] = {"gatewayRef": {"name": "inference-gateway"}}
    assert plan(parse_resource(doc).spec).gateway is not None


@pytest.mark.parametrize(
    ("tiers", "field", "words"),
    [
        ([{"name": "long", "maxModelLen": 131072}], "spec.gateway.tiers", "shorter than spec.context.maxModelLen"),
        ([{"name": "main", "maxModelLen": 8192}], "spec.gateway.tiers[0].name", "spec's own context"),
        (
            [{"name": "a", "maxModelLen": 8192}, {"name": "a", "maxModelLen": 16384}],
            "spec.gateway.tiers",
            "two tiers with the same name",
        ),
        (
            [{"name": "tiny", "maxModelLen": 65536, "parallelism": {"tensorParallelSize": 1}}],
            "spec.gateway.tiers[0]",
            "cannot be planned",
        ),
    ],
)
def test_a_tier_that_cannot_work_is_refused_naming_the_field_and_the_fix(
    tiers: list[dict[str, Any]], field: str, words: str
) -> None:
    problem = _problem(_gatewayed("vllm-h200-tp8", tiers=tiers))
    assert field in problem and words in problem and "fix:" in problem


# --- the reconcile's decisions (controller/decide.py, pure) ---------------------------------


def _tiered() -> tuple[Any, list[dict[str, Any]]]:
    resource = parse_resource(load_sample(GATEWAY_SAMPLE))
    return resource, render(resource, plan(resource.spec))


def test_without_the_gateway_apis_the_engines_are_applied_and_the_path_is_not() -> None:
    _, objs = _tiered()
    engines = {"Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget"}
    kept, missing = serving_path_served(objs, frozenset(engines))
    assert missing is not None and "inferencepools" in missing
    assert not POOL_KINDS & {o["kind"] for o in kept}
    assert {o["metadata"]["name"] for o in kept if o["kind"] == "Deployment"} == {
        "m3-vllm-h200-gateway",
        "m3-vllm-h200-gateway-short",
    }  # both tiers; not the picker, which would have no pool to serve
    kept, missing = serving_path_served(objs, frozenset({*engines, "InferencePool", "ServiceAccount", "Role"}))
    assert missing is not None and "httproutes" in missing
    assert {o["kind"] for o in kept} >= {"InferencePool"} and "HTTPRoute" not in {o["kind"] for o in kept}
    everything = frozenset({o["kind"] for o in objs})
    assert serving_path_served(objs, everything) == (objs, None)


def _route_status(gateway: str, status: str, reason: str) -> dict[str, Any]:
    condition = {"type": "Accepted", "status": status, "reason": reason, "message": "m"}
    return {"status": {"parents": [{"parentRef": {"name": gateway}, "conditions": [condition]}]}}


def test_the_gateway_report_reads_the_routes_verdict_and_every_tiers_endpoints() -> None:
    resource, _ = _tiered()
    draft = planned_gateway(resource, None, True)
    assert draft is not None and draft.gateway == "llm/inference-gateway"
    name = resource.metadata.name
    live: dict[tuple[str, str, str], dict[str, Any]] = {
        ("gateway.networking.k8s.io/v1", "HTTPRoute", name): _route_status("inference-gateway", "True", "Accepted"),
        ("apps/v1", "Deployment", f"{name}-short"): {"spec": {"replicas": 2}, "status": {"readyReplicas": 1}},
    }
    report = gateway_report(draft, resource, live, main_ready=1)
    assert report.endpoints == 2 and [(t.name, t.desired, t.ready) for t in report.tiers] == [("short", 2, 1)]
    assert gateway_condition(report)[:2] == (True, DeploymentReason.ROUTE_ACCEPTED)
    # Another Gateway's verdict on the route is not this one's.
    live[("gateway.networking.k8s.io/v1", "HTTPRoute", name)] = _route_status("other", "False", "NotAllowedByListeners")
    assert gateway_condition(gateway_report(draft, resource, live, 1))[1] == DeploymentReason.ROUTE_PENDING
    live[("gateway.networking.k8s.io/v1", "HTTPRoute", name)] = _route_status(
        "inference-gateway", "False", "NotAllowedByListeners"
    )
    ok, reason, message = gateway_condition(gateway_report(draft, resource, live, 1))
    assert (ok, reason) == (False, DeploymentReason.ROUTE_NOT_ACCEPTED) and "NotAllowedByListeners" in message
    missing = planned_gateway(resource, None, False)
    assert missing is not None
    ok, reason, message = gateway_condition(gateway_report(missing, resource, live, 1))
    assert reason == DeploymentReason.GATEWAY_NOT_FOUND and "spec.gateway.gatewayRef" in message


def test_the_webhook_refuses_a_tier_the_planner_cannot_plan_and_admits_the_sample() -> None:
    """A tier that passes the CRD but cannot be planned is refused at admission, naming the tier and the fix."""
    assert review("CREATE", load_sample(GATEWAY_SAMPLE)).allowed
    bad = _gatewayed(
        "vllm-h200-tp8", tiers=[{"name": "tiny", "maxModelLen": 65536, "parallelism": {"tensorParallelSize": 1}}]
    )
    verdict = review("CREATE", bad)
    assert not verdict.allowed and "spec.gateway.tiers[0]" in verdict.message and "fix:" in verdict.message


@pytest.mark.parametrize("section", ["https\n", "0\n"])
def test_a_listener_name_with_a_trailing_newline_is_refused_as_the_apiserver_refuses_it(section: str) -> None:
    """The CRD's pattern `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$|^$` in RE2 (the apiserver's) anchors `$` at the very end;
    Python's `$` also matches before a final newline, which once let the admission contract pass what the apiserver
    refuses (tests/cluster/test_contract.py found it beside another error, where the models' own check never ran)."""
    doc = load_sample(GATEWAY_SAMPLE)
    doc["spec"]["gateway"]["gatewayRef"]["sectionName"] = section
    _, violations = judge(doc)
    assert [v.error.field for v in violations] == ["spec.gateway.gatewayRef.sectionName"], violations
    doc["spec"]["gateway"]["gatewayRef"]["sectionName"] = section.strip()
    assert judge(doc)[1] == []  # the same name without the newline is admitted

"""Each context tier of spec.gateway.tiers scales on its own demand: the groups the autoscaler sizes (their workload,
pods, engine series, plan and bounds), the bounds the spec admits, and the replica counts the reconcile renders."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from m3fleet.admission import review
from m3fleet.api import parse_resource
from m3fleet.autoscaling.forecast import DemandRecord
from m3fleet.autoscaling.groups import scaled_groups, tier_replicas_to_apply
from m3fleet.autoscaling.policy import Action, Decision, PolicyState
from m3fleet.autoscaling.prometheus import PrometheusAdapter, Tls
from m3fleet.controller.autoscaler import GroupDecision, group_source_spec, prometheus_adapter, status_patch
from m3fleet.controller.decide import Understood, want
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan
from tests.support.samples import SAMPLES_DIR, load_sample

TIERED = SAMPLES_DIR / "vllm-h200-gateway-tiers.yaml"  # a short tier (128k) and the spec's own (512k)
SCALING = {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "prometheus": {"url": "http://prom:9090"}}


def _tiered(**tier: Any) -> dict[str, Any]:
    doc = load_sample(TIERED)
    doc["spec"]["autoscaling"] = copy.deepcopy(SCALING)
    doc["spec"]["gateway"]["tiers"][0].update(tier)
    return doc


def _selects(selector: str, pod_labels: dict[str, str]) -> bool:
    """A label selector string (k=v, !k) against a pod's labels, as the apiserver reads it."""
    for term in selector.split(","):
        if term.startswith("!"):
            if term[1:] in pod_labels:
                return False
        else:
            key, value = term.split("=", 1)
            if pod_labels.get(key) != value:
                return False
    return True


def _workloads(doc: dict[str, Any], status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    resource = parse_resource(doc)
    wanted = want(Understood("uid", 1, resource, plan(resource.spec)), None, status)
    assert wanted.blocked is None, wanted.blocked
    return {
        o["metadata"]["name"]: o
        for o in wanted.objects
        if o["kind"] == "Deployment" and "epp" not in o["metadata"]["name"]
    }


def test_an_untiered_fleet_is_one_group_selected_as_before() -> None:
    doc = load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml")
    doc["spec"]["autoscaling"] = copy.deepcopy(SCALING)
    resource = parse_resource(doc)
    planned = plan(resource.spec)
    (group,) = scaled_groups(resource, planned)
    name, namespace = resource.metadata.name, resource.metadata.namespace
    assert (group.tier, group.label, group.workload_name, group.workload_kind) == ("", "main", name, "Deployment")
    assert group.plan == planned and group.spec == resource.spec
    assert group.pod_selector == f"m3fleet.dev/name={name},app.kubernetes.io/managed-by=m3fleet"
    assert group.metric_labels == (("namespace", namespace), ("m3fleet_dev_name", name))


def test_each_tier_is_a_group_of_its_own_workload_pods_series_plan_and_bounds() -> None:
    resource = parse_resource(_tiered(minReplicas=0, maxReplicas=6))
    planned = plan(resource.spec)
    main, short = scaled_groups(resource, planned)
    name = resource.metadata.name
    assert (main.tier, short.tier, short.label) == ("", "short", "short")
    assert (main.workload_name, short.workload_name) == (name, f"{name}-short")
    # The tier's own plan: its context, and more KV sequences per replica than the long tier's.
    assert (short.plan.max_model_len, main.plan.max_model_len) == (131072, 524288)
    assert short.plan.max_model_len == short.spec.context.max_model_len
    assert short.plan.kv_cache_tokens_per_replica == plan(short.spec).kv_cache_tokens_per_replica
    # Its bounds; the spec's own tier keeps spec.autoscaling's.
    assert (short.spec.autoscaling.min_replicas, short.spec.autoscaling.max_replicas) == (0, 6)
    assert (main.spec.autoscaling.min_replicas, main.spec.autoscaling.max_replicas) == (1, 4)
    # Its series: the tier label Prometheus's labelmap gives its pods; the spec's own tier's have it empty.
    assert dict(short.metric_labels)["m3fleet_dev_tier"] == "short"
    assert dict(main.metric_labels)["m3fleet_dev_tier"] == ""
    # Its pods: each group's selector takes its own workload's pods and no other's.
    rendered = _workloads(_tiered(), {})
    for group in (main, short):
        for workload_name, workload in rendered.items():
            pod_labels = workload["spec"]["template"]["metadata"]["labels"]
            assert _selects(group.pod_selector, pod_labels) == (workload_name == group.workload_name)


def test_absent_tier_bounds_are_the_specs_and_the_schedule_stays_with_the_specs_own_tier() -> None:
    doc = _tiered()
    doc["spec"]["autoscaling"].update(
        minReplicas=2, maxReplicas=5, schedule=[{"name": "peak", "start": "08:00", "end": "18:00", "minReplicas": 4}]
    )
    resource = parse_resource(doc)
    main, short = scaled_groups(resource, plan(resource.spec))
    assert (short.spec.autoscaling.min_replicas, short.spec.autoscaling.max_replicas) == (2, 5)
    assert short.spec.autoscaling.schedule == [] and len(main.spec.autoscaling.schedule) == 1


def test_a_tier_reads_its_own_series_and_its_own_workers() -> None:
    """The tier's adapter asks Prometheus for the tier's series only; a multi-node tier's workers are named after
    its own LeaderWorkerSet; the gateway's request sizes (the whole pool's) size the spec's own tier only."""
    doc = _tiered(parallelism={"tensorParallelSize": 16})  # 2 nodes a replica: a LeaderWorkerSet
    doc["spec"]["autoscaling"]["gateway"] = {"matchLabels": {"model_name": "MiniMaxAI/MiniMax-M3"}}
    resource = parse_resource(doc)
    main, short = scaled_groups(resource, plan(resource.spec))
    assert short.workload_kind == "LeaderWorkerSet" and main.workload_kind == "Deployment"
    tier_source = group_source_spec("llm", short, short.spec.autoscaling, Tls())
    assert (tier_source.workers_of, tier_source.gateway) == (short.workload_name, None)
    main_source = group_source_spec("llm", main, main.spec.autoscaling, Tls())
    assert main_source.workers_of is None and main_source.gateway is not None
    for group, source, tier in ((short, tier_source, "short"), (main, main_source, "")):
        assert source.selector == group.metric_labels and source.engine == "vllm"
        adapter = prometheus_adapter(source)
        assert isinstance(adapter, PrometheusAdapter)
        assert f'm3fleet_dev_tier="{tier}"' in adapter.queries().scalars["running"]


def test_each_tier_is_rendered_at_its_own_decision_within_its_bounds() -> None:
    doc = _tiered(replicas=1, minReplicas=1, maxReplicas=3)
    name = doc["metadata"]["name"]
    decided = {"autoscaling": {"desiredReplicas": 2, "tiers": {"short": {"desiredReplicas": 3}}}}
    counts = {n: w["spec"]["replicas"] for n, w in _workloads(doc, decided).items()}
    assert counts == {name: 2, f"{name}-short": 3}
    too_many = {"autoscaling": {"desiredReplicas": 2, "tiers": {"short": {"desiredReplicas": 9}}}}
    assert _workloads(doc, too_many)[f"{name}-short"]["spec"]["replicas"] == 3  # clamped to the tier's max
    undecided = {"autoscaling": {"desiredReplicas": 2}}
    assert _workloads(doc, undecided)[f"{name}-short"]["spec"]["replicas"] == 1  # its replicas until decided
    # Advisory, or autoscaling off: the tier's replicas, whatever was decided.
    doc["spec"]["autoscaling"]["mode"] = "advisory"
    assert tier_replicas_to_apply(parse_resource(doc).spec, decided) == {"short": 1}
    doc["spec"]["autoscaling"] = {"enabled": False}
    assert tier_replicas_to_apply(parse_resource(doc).spec, decided) == {"short": 1}


def _problem(doc: dict[str, Any]) -> str:
    with pytest.raises((SpecError, SpecErrors)) as caught:
        plan(parse_resource(doc).spec)
    return str(caught.value)


@pytest.mark.parametrize(
    ("tier", "scaling", "field", "words"),
    [
        ({"minReplicas": 3, "maxReplicas": 2}, {}, "spec.gateway.tiers", "exceeds its maxReplicas"),
        ({"minReplicas": 5}, {"maxReplicas": 4}, "spec.gateway.tiers", "spec.autoscaling's"),  # the spec's max
        ({"maxReplicas": 1}, {"minReplicas": 2}, "spec.gateway.tiers", "exceeds its maxReplicas"),  # the spec's min
        ({"maxReplicas": 0}, {}, "spec.gateway.tiers[0].maxReplicas", "0 is too small"),
        ({"minReplicas": -1}, {}, "spec.gateway.tiers[0].minReplicas", "-1 is too small"),
    ],
)
def test_tier_bounds_that_cannot_hold_are_refused_naming_the_field_and_the_fix(
    tier: dict[str, Any], scaling: dict[str, Any], field: str, words: str
) -> None:
    doc = _tiered(**tier)
    doc["spec"]["autoscaling"].update(scaling)
    problem = _problem(doc)
    assert field in problem and words in problem, problem
    if field == "spec.gateway.tiers":
        assert "fix: lower the tier's minReplicas, or raise its maxReplicas" in problem


def test_the_webhook_admits_a_tier_at_zero_and_the_operator_names_bounds_the_crd_would_refuse() -> None:
    """The CRD refuses bounds that cannot hold (its CEL; tests/cluster/test_admission.py on the real apiserver); the
    webhook admits what the CRD does, and says what the operator would report if the two ever disagreed."""
    at_zero = review("CREATE", _tiered(minReplicas=0, maxReplicas=2))
    assert at_zero.allowed and not at_zero.warnings, at_zero
    disagreed = review("CREATE", _tiered(minReplicas=3, maxReplicas=2))
    assert any("spec.gateway.tiers" in w and "fix: lower the tier's minReplicas" in w for w in disagreed.warnings)


def test_a_tier_may_scale_to_zero_behind_the_gateway() -> None:
    resource = parse_resource(_tiered(minReplicas=0, maxReplicas=2))
    _, short = scaled_groups(resource, plan(resource.spec))
    assert short.spec.autoscaling.min_replicas == 0 and short.spec.gateway is not None  # the zero rule applies


def test_the_status_patch_keeps_the_specs_own_tier_at_the_top_and_removes_tiers_gone() -> None:
    resource = parse_resource(_tiered())
    main, short = scaled_groups(resource, plan(resource.spec))

    def outcome(group: Any, desired: int) -> GroupDecision:
        decision = Decision(0.0, "act", Action.HOLD, desired, 1, desired, "r")
        return GroupDecision(group, decision, decision.to_status(), PolicyState(), DemandRecord(), {}, True)

    patch = status_patch([outcome(main, 2), outcome(short, 3)], stale={"old"})
    assert patch["desiredReplicas"] == 2 and patch["tiers"]["short"]["desiredReplicas"] == 3
    assert patch["tiers"]["old"] is None  # a merge patch deletes the removed tier's record
    assert {"state", "demand"} <= set(patch["tiers"]["short"])
    only_main = status_patch([outcome(main, 2)], stale=set())
    assert "tiers" not in only_main  # an untiered fleet's status.autoscaling keeps its shape

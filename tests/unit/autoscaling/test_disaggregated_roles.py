"""Each role of a disaggregated fleet on its own signal (autoscaling/policy/roles.py): prefill on prompt tokens and
TTFT, decode on KV demand and ITL, the ratio kept within the plan's bounds."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.api.models import RenderAs, SloSpec
from m3fleet.autoscaling.policy.hpa import Behavior
from m3fleet.autoscaling.policy.roles import (
    RoleDecision,
    RoleReading,
    RoleSignals,
    RoleTargets,
    Stabilizer,
    decide_roles,
    decide_tick,
    history_from,
    role_replicas_to_apply,
    role_signals,
    roles_record,
    targets_for,
)
from m3fleet.autoscaling.signals import Histogram, MetricsSnapshot, ReplicaSignals
from m3fleet.controller.autoscaler_roles import changed, running_counts, status_record
from m3fleet.disaggregation import ROLES
from m3fleet.planner import plan
from m3fleet.render import render
from tests.support.samples import SAMPLES_DIR, load_sample

PLAN = plan(parse_resource(load_sample(SAMPLES_DIR / "disaggregated" / "trtllm-gb200-disagg-32k.yaml")).spec)
D = PLAN.disaggregation
assert D is not None
TARGETS = RoleTargets.from_plan(D, kv_target=0.8, min_replicas=1, max_replicas=8, interval_seconds=15.0)
KV = D.decode.kv_cache_tokens_per_worker


def signals(**changes: float) -> RoleSignals:
    values = {"prompt_tokens_per_second": 0.0, "queued_prompt_tokens": 0.0, "decode_kv_tokens": 0.0, **changes}
    return RoleSignals(**values)  # type: ignore[arg-type]


def test_decode_follows_kv_demand_at_the_target() -> None:
    _, decode = decide_roles(TARGETS, signals(decode_kv_tokens=2.5 * KV * 0.8), (3, 1))
    assert decode.replicas == 3 and decode.need == pytest.approx(2.5)
    assert "KV demand" in decode.reason


def test_prefill_follows_prompt_tokens_and_its_queue() -> None:
    per_worker = D.prefill.tokens_per_second * TARGETS.prefill_utilization
    arriving = signals(prompt_tokens_per_second=4 * per_worker, decode_kv_tokens=2 * KV * 0.8)
    prefill, decode = decide_roles(TARGETS, arriving, (1, 1))
    assert prefill.replicas == 4 and decode.replicas == 2
    queued = signals(prompt_tokens_per_second=4 * per_worker, queued_prompt_tokens=15 * per_worker,
                     decode_kv_tokens=2 * KV * 0.8)  # fmt: skip
    assert decide_roles(TARGETS, queued, (4, 2))[0].replicas == 5  # the queue drains within a tick


def test_latency_above_its_objective_asks_one_more_of_that_role_only() -> None:
    targets = RoleTargets.from_plan(D, 0.8, 1, 8, 15.0, ttft_objective_seconds=2.0, itl_objective_seconds=0.05)
    load = {"prompt_tokens_per_second": 1.0, "decode_kv_tokens": KV * 0.8 * 0.5}
    prefill, decode = decide_roles(targets, signals(**load, ttft_seconds=5.0), (3, 1))
    assert prefill.replicas == 4 and "TTFT" in prefill.reason and decode.replicas == 1
    prefill, decode = decide_roles(targets, signals(**load, itl_seconds=0.2), (3, 1))
    assert decode.replicas == 2 and "ITL" in decode.reason


def test_ratio_bounds_keep_prefill_from_starving_or_idling() -> None:
    # No prompt traffic right now, but two decode workers still need prefill capacity for what they complete.
    prefill, decode = decide_roles(TARGETS, signals(decode_kv_tokens=2 * KV * 0.8), (6, 2))
    assert decode.replicas == 2
    assert prefill.replicas == math.ceil(2 * TARGETS.min_ratio) and "ratio's bounds" in prefill.reason
    # A flood of prompts is capped at twice the derived ratio.
    flood = signals(prompt_tokens_per_second=1e9, decode_kv_tokens=KV * 0.8)
    assert decide_roles(TARGETS, flood, (1, 1))[0].replicas == math.ceil(TARGETS.max_ratio)


def test_decode_is_held_to_the_bounds_and_the_record_says_why() -> None:
    prefill, decode = decide_roles(TARGETS, signals(decode_kv_tokens=100 * KV), (1, 1))
    assert decode.replicas == 8 and "held to [1, 8]" in decode.reason
    record = roles_record(prefill, decode)
    assert record["decode"]["replicas"] == 8 and record["ratio"] == f"{prefill.replicas}:8"


# --- the wiring's pure parts: signals from each role's snapshot, holding, pins, stabilization, what is rendered -----

NOW = 1_000_000.0


def replica(name: str, **values: Any) -> ReplicaSignals:
    gauges = {"running": 0.0, "waiting": 0.0, "kv_used_tokens": 0.0, "sample_time": NOW - 1, **values}
    return ReplicaSignals(replica=name, **gauges)


def snapshot(*replicas: ReplicaSignals, error: str | None = None) -> MetricsSnapshot:
    return MetricsSnapshot(engine="trtllm", time=NOW, replicas=replicas, error=error)


def read(prefill: MetricsSnapshot, decode: MetricsSnapshot, running: tuple[int, int] = (1, 1)) -> RoleReading | str:
    return role_signals({"prefill": prefill, "decode": decode}, dict(zip(ROLES, running, strict=True)), D, SLO, 60.0)


SLO = SloSpec()


def test_signals_come_from_each_roles_own_replicas() -> None:
    histogram = Histogram(bounds=(1.0, 5.0, math.inf), cumulative=(90.0, 100.0, 100.0), total=150.0, count=100.0)
    prefill = snapshot(
        replica("p-0", waiting=3.0, prompt_tokens_rate=20000.0, ttft_seconds=histogram,
                prompt_tokens=Histogram(bounds=(math.inf,), cumulative=(10.0,), total=160000.0, count=10.0)),
        replica("p-1", prompt_tokens_rate=10000.0),
    )  # fmt: skip
    decode = snapshot(replica("d-0", running=8.0, kv_used_tokens=50000.0))
    reading = read(prefill, decode, (2, 1))
    assert isinstance(reading, RoleReading) and not reading.partial
    s = reading.signals
    assert s.prompt_tokens_per_second == 30000.0
    assert s.queued_prompt_tokens == 3 * 16000.0  # the waiting requests x the window's mean prompt
    assert s.decode_kv_tokens == 50000.0 + 8 * D.output_tokens / 2  # resident + the running sequences' growth
    assert s.ttft_seconds == 5.0  # p95 of the prefill workers' TTFT, as the histogram's bucket bound
    assert reading.ttft_objective_seconds == pytest.approx(
        SLO.ttft_seconds(16000.0, 16000.0 / D.prefill.tokens_per_second)
    )
    assert reading.itl_objective_seconds is None  # relative to an idle decode step: not judged (status's SLO agrees)


def test_before_any_prompt_finished_the_plans_input_length_sizes_the_queue() -> None:
    reading = read(snapshot(replica("p-0", waiting=2.0)), snapshot(replica("d-0")))
    assert isinstance(reading, RoleReading) and reading.signals.queued_prompt_tokens == 2 * D.input_tokens


def test_missing_metrics_hold_both_roles_and_say_why() -> None:
    for reading in (
        read(snapshot(error="prometheus at http://p: cannot connect"), snapshot(replica("d-0"))),
        read(snapshot(), snapshot(replica("d-0"))),  # a prefill worker runs, none of them reports
        read(snapshot(replica("p-0", sample_time=NOW - 600)), snapshot(replica("d-0"))),  # stale
    ):
        assert isinstance(reading, str) and "prefill" in reading
        prefill, decode = decide_tick(TARGETS, reading, {"prefill": 3, "decode": 2})
        assert (prefill.replicas, decode.replicas) == (3, 2)
        assert prefill.decided_by == decode.decided_by == "metricsUnavailable" and reading in decode.reason


def test_partial_metrics_scale_up_but_never_down() -> None:
    quiet = read(snapshot(replica("p-0")), snapshot(replica("d-0")), (2, 3))  # 1 of 2 prefill, 1 of 3 decode report
    assert isinstance(quiet, RoleReading) and quiet.partial == {"prefill", "decode"}
    prefill, decode = decide_tick(TARGETS, quiet, {"prefill": 2, "decode": 3})
    assert decode.replicas == 3 and decode.decided_by == "metricsUnavailable" and prefill.replicas >= 2
    busy = read(snapshot(replica("p-0")), snapshot(replica("d-0", kv_used_tokens=5 * KV)), (1, 3))
    assert isinstance(busy, RoleReading)
    assert decide_tick(TARGETS, busy, {"prefill": 1, "decode": 3})[1].replicas == math.ceil(5 / 0.8)


def test_pinned_prefill_count_or_ratio_is_kept_while_decode_scales() -> None:
    load = signals(prompt_tokens_per_second=1e9, decode_kv_tokens=3 * KV * 0.8)
    pinned = replace(TARGETS, pinned_prefill=2)
    prefill, decode = decide_roles(pinned, load, (2, 1))
    assert (prefill.replicas, prefill.decided_by, decode.replicas) == (2, "pinnedReplicas", 3)
    prefill, _ = decide_roles(replace(TARGETS, pinned_ratio=(3, 2)), load, (2, 1))
    assert (prefill.replicas, prefill.decided_by) == (5, "pinnedRatio")  # 3 decode x 3/2, rounded up


def test_targets_take_the_pins_and_bounds_from_the_spec() -> None:
    doc = load_sample(SAMPLES_DIR / "disaggregated" / "trtllm-gb200-disagg-32k.yaml")
    doc["spec"]["autoscaling"] = {
        "enabled": True,
        "minReplicas": 2,
        "maxReplicas": 6,
        "target": {"kvCacheUtilization": 0.7},
    }
    doc["spec"]["disaggregation"]["ratio"] = "3:1"
    spec = parse_resource(doc).spec
    targets = targets_for(spec, plan(spec).disaggregation)
    assert (targets.min_replicas, targets.max_replicas, targets.kv_target) == (2, 6, 0.7)
    assert (targets.pinned_ratio, targets.pinned_prefill) == ((3, 1), 0)


def test_a_scale_down_waits_out_each_roles_window() -> None:
    behavior = Behavior(scale_down_window_seconds=60.0, limit_scale_up=False)
    running = {"prefill": 4, "decode": 3}
    window = Stabilizer({}, running, NOW, behavior)
    assert window("prefill", RoleDecision(4, 3.5, "busy", "promptTokens")).replicas == 4
    later = Stabilizer(window.history, running, NOW + 30, behavior)
    prefill = later("prefill", RoleDecision(1, 0.5, "quiet", "promptTokens"))
    assert (prefill.replicas, prefill.decided_by) == (4, "scaleDownWindow")
    assert "kept within the 60s scale-down window" in prefill.reason
    after = Stabilizer(later.history, running, NOW + 61, behavior)
    assert after("prefill", RoleDecision(1, 0.5, "quiet", "promptTokens")).replicas == 1
    # Kept in status as plain lists and read back the same (a restarted operator keeps its window).
    assert history_from({role: [list(e) for e in later.history.get(role, ())] for role in ROLES}) == {
        "prefill": later.history["prefill"],
        "decode": (),
    }


def test_decode_held_by_its_window_keeps_the_prefill_workers_its_ratio_needs() -> None:
    # Decode wants 1 but its window keeps 3: prefill is bounded against the 3 kept, not the 1 wanted.
    running = {"prefill": 2, "decode": 3}
    behavior = Behavior(scale_down_window_seconds=60.0, limit_scale_up=False)
    window = Stabilizer({"decode": ((NOW - 10, 3),)}, running, NOW, behavior)
    quiet = read(snapshot(replica("p-0"), replica("p-1")), snapshot(*(replica(f"d-{i}") for i in range(3))), (2, 3))
    prefill, decode = decide_tick(TARGETS, quiet, running, window)
    assert (decode.replicas, decode.decided_by) == (3, "scaleDownWindow")
    assert prefill.replicas >= math.ceil(3 * TARGETS.min_ratio - 1e-9)


def autoscaled(mode: str = "act", **status_roles: Any) -> tuple[Any, dict[str, Any]]:
    doc = load_sample(SAMPLES_DIR / "disaggregated" / "trtllm-gb200-disagg-32k.yaml")
    doc["spec"]["autoscaling"] = {"enabled": True, "mode": mode, "minReplicas": 1, "maxReplicas": 4}
    return parse_resource(doc), {"autoscaling": {"roles": status_roles}}


def test_act_mode_renders_each_roles_decided_count() -> None:
    resource, status = autoscaled(prefill={"replicas": 5}, decode={"replicas": 2})
    counts = role_replicas_to_apply(resource.spec, status)
    assert counts == {"prefill": 5, "decode": 2}
    p = plan(resource.spec)
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(resource, p, 1, role_replicas=counts)}
    name = resource.metadata.name
    assert objects[("LeaderWorkerSet", f"{name}-prefill")]["spec"]["replicas"] == 5
    assert objects[("LeaderWorkerSet", f"{name}-decode")]["spec"]["replicas"] == 2
    graph_doc = resource.model_copy(deep=True)
    graph_doc.spec.disaggregation.render_as = RenderAs.DYNAMO_GRAPH_DEPLOYMENT  # type: ignore[union-attr]
    graph = next(
        o
        for o in render(graph_doc, plan(graph_doc.spec), 1, role_replicas=counts)
        if o["kind"] == "DynamoGraphDeployment"
    )
    assert {c["type"]: c["replicas"] for c in graph["spec"]["components"]} == {"frontend": 1, "prefill": 5, "decode": 2}


def test_advisory_mode_or_no_decision_renders_the_plans_counts() -> None:
    resource, status = autoscaled("advisory", prefill={"replicas": 5}, decode={"replicas": 2})
    assert role_replicas_to_apply(resource.spec, status) is None
    resource, _ = autoscaled()
    assert role_replicas_to_apply(resource.spec, {}) is None
    assert role_replicas_to_apply(resource.spec, {"autoscaling": {"roles": {"prefill": {"replicas": "x"}}}}) is None
    # The decode count is held to the spec's bounds even if status says otherwise (someone edited it).
    resource, status = autoscaled(prefill={"replicas": 1}, decode={"replicas": 40})
    assert role_replicas_to_apply(resource.spec, status) == {"prefill": 1, "decode": 4}


def test_the_shell_reads_running_counts_and_records_only_what_changed() -> None:
    workloads = {"prefill": {"spec": {"replicas": 3}}, "decode": {"spec": {"replicas": 2}}}
    assert running_counts(workloads, None) == {"prefill": 3, "decode": 2}
    graph = {"spec": {"components": [{"type": "frontend", "replicas": 1}, {"type": "prefill", "replicas": 4},
                                     {"type": "decode", "replicas": 2}]}}  # fmt: skip
    assert running_counts({}, graph) == {"prefill": 4, "decode": 2}
    decisions = (RoleDecision(4, 3.2, "prompts", "promptTokens"), RoleDecision(2, 1.5, "kv", "kvDemand"))
    running = {"prefill": 3, "decode": 2}
    record = status_record("act", decisions, running, {"prefill": (), "decode": ()}, NOW)
    assert (record["applied"], record["action"], record["desiredReplicas"]) == (True, "scale", 2)
    assert record["reason"].startswith("prefill 3 -> 4; decode holds 2")
    assert record["roles"]["prefill"]["decidedBy"] == "promptTokens" and record["roles"]["ratio"] == "4:2"
    assert status_record("advisory", decisions, running, {"prefill": (), "decode": ()}, NOW)["applied"] is False
    assert not changed(
        record, status_record("act", decisions, running, {"prefill": (), "decode": ()}, NOW + 10), NOW + 10
    )
    moved = (decisions[0], RoleDecision(3, 2.5, "kv", "kvDemand"))
    assert changed(record, status_record("act", moved, running, {"prefill": (), "decode": ()}, NOW + 10), NOW + 10)
    assert changed(record, record, NOW + 301)  # the heartbeat: the numbers in the reasons stay current

"""Each role of a disaggregated fleet on its own signal (autoscaling/policy/roles.py): prefill on prompt tokens and
TTFT, decode on KV demand and ITL, the ratio kept within the plan's bounds."""

from __future__ import annotations

import math

import pytest

from m3fleet.api import parse_resource
from m3fleet.autoscaling.policy.roles import RoleSignals, RoleTargets, decide_roles, roles_record
from m3fleet.planner import plan
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

"""The zero rule (autoscaling/policy/zero.py): from zero on held requests, to zero only after the idle window."""

from __future__ import annotations

from m3fleet.autoscaling.policy.zero import FROM_ZERO, IDLE_WAIT, TO_ZERO, zero_rule
from m3fleet.autoscaling.promql import held_requests_query

WINDOW = 600.0
NOW = 10_000.0


def test_held_requests_at_zero_scale_from_zero() -> None:
    verdict = zero_rule(0, 0, held=3, busy=False, last_busy=NOW - 5000, now=NOW, idle_after_seconds=WINDOW)
    assert (verdict.replicas, verdict.rule, verdict.last_busy) == (1, FROM_ZERO, NOW)
    assert verdict.reason is not None and "3 request(s) held" in verdict.reason
    # The policy's own larger count (a forecast floor, a schedule) is kept.
    assert zero_rule(0, 0, held=3, busy=False, last_busy=None, now=NOW, idle_after_seconds=WINDOW).replicas == 1
    assert zero_rule(4, 0, held=1, busy=False, last_busy=None, now=NOW, idle_after_seconds=WINDOW).replicas == 4


def test_nothing_held_at_zero_stays_at_zero() -> None:
    for held in (0.0, None):
        verdict = zero_rule(0, 0, held=held, busy=False, last_busy=NOW - 50, now=NOW, idle_after_seconds=WINDOW)
        assert verdict.replicas == 0


def test_to_zero_only_once_idle_for_the_whole_window() -> None:
    early = zero_rule(0, 2, held=0, busy=False, last_busy=NOW - WINDOW + 1, now=NOW, idle_after_seconds=WINDOW)
    assert (early.replicas, early.rule) == (1, IDLE_WAIT)
    late = zero_rule(1, 2, held=0, busy=False, last_busy=NOW - WINDOW, now=NOW, idle_after_seconds=WINDOW)
    assert (late.replicas, late.rule) == (0, TO_ZERO)
    assert late.reason is not None and "scaleToZeroAfterSeconds 600" in late.reason


def test_any_activity_restarts_the_idle_window() -> None:
    running = zero_rule(1, 1, held=0, busy=True, last_busy=NOW - 5000, now=NOW, idle_after_seconds=WINDOW)
    assert (running.replicas, running.last_busy) == (1, NOW)
    held = zero_rule(1, 1, held=2, busy=False, last_busy=NOW - 5000, now=NOW, idle_after_seconds=WINDOW)
    assert (held.replicas, held.last_busy) == (1, NOW)


def test_an_unreadable_held_count_never_takes_a_fleet_to_zero() -> None:
    verdict = zero_rule(0, 1, held=None, busy=False, last_busy=NOW - 5000, now=NOW, idle_after_seconds=WINDOW)
    assert verdict.replicas == 1
    # A first tick (nothing recorded) starts the window now rather than going to zero at once.
    first = zero_rule(0, 1, held=0, busy=False, last_busy=None, now=NOW, idle_after_seconds=WINDOW)
    assert (first.replicas, first.last_busy) == (1, NOW)


def test_the_policy_above_one_replica_is_left_alone() -> None:
    verdict = zero_rule(3, 2, held=0, busy=False, last_busy=NOW - 5000, now=NOW, idle_after_seconds=WINDOW)
    assert (verdict.replicas, verdict.rule) == (3, None)


def test_the_held_requests_query_selects_the_fleets_pool() -> None:
    query = held_requests_query("llm", "chat", "inference_extension_flow_control_queue_size")
    assert query == 'sum(inference_extension_flow_control_queue_size{inference_pool="chat",namespace="llm"})'

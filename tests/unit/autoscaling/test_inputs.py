"""The policy's measured inputs and foresight: capacity checked against the plan, prefill throughput
learned from the engines' counters, time-to-ready from the pods, the forecast floor, scheduled bounds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from m3fleet.api.parse import parse_resource
from m3fleet.autoscaling.forecast import (
    DemandRecord,
    ScheduleWindow,
    bounds_at,
    forecast_floor,
    record_demand,
    sustained,
)
from m3fleet.autoscaling.policy import Decision, PolicyConfig, PolicyState, decide
from m3fleet.autoscaling.signals import DemandHistory, Histogram, MetricsSnapshot
from m3fleet.autoscaling.time_to_ready import Record, record, starting
from tests.support.autoscaling.plans import sample_plan
from tests.support.autoscaling.snapshots import MILLION, NOW, ROUND, SETTLED, fleet, replica, replicas, snapshot

# 2027-01-15 08:00 UTC is a Friday.
FRIDAY_8AM = NOW


def test_capacity_far_from_the_plan_is_reported_and_not_trusted() -> None:
    # An adapter summing eight TP ranks' copies of one pool would report 8x the plan.
    load = snapshot(replica(running=4, kv_usage=0.5, capacity=8 * MILLION, prompt_tokens=4000, request_rate=1.0))
    decision, _ = decide(ROUND, SETTLED, load, fleet(2))
    assert decision.capacity["mismatch"] is True and decision.capacity["reportedTokensPerReplica"] == 8 * MILLION
    assert decision.terms["kvTokensPerReplica"] == MILLION  # the smaller of plan and report
    ((reason, message),) = decision.warnings
    assert reason == "KVCapacityMismatch" and "8.00x the plan" in message
    assert decision.to_status()["warnings"][0]["reason"] == "KVCapacityMismatch"


def test_capacity_within_the_margin_is_the_engines() -> None:
    load = snapshot(replica(running=4, kv_usage=0.5, capacity=0.95 * MILLION, prompt_tokens=4000, request_rate=1.0))
    decision, _ = decide(ROUND, SETTLED, load, fleet(2))
    assert decision.capacity["mismatch"] is False and decision.warnings == ()
    assert decision.terms["kvTokensPerReplica"] == pytest.approx(0.95 * MILLION)


def long_prompts(
    at: float, *, rate: float, ttft: float, queued: float = 0.0, prompt: float = 50_000, waiting: float = 0.0
) -> MetricsSnapshot:
    """One replica serving `prompt`-token requests: it prefilled `rate` prompt tokens/s, its requests took
    `ttft` s to their first token, `queued` s of it waiting to be scheduled."""
    n = 30.0
    base = replica(
        running=3, waiting=waiting, kv_usage=0.4, prompt_tokens=prompt, request_rate=rate / prompt, sample_time=at
    )
    r = replace(
        base,
        ttft_seconds=Histogram(bounds=(float("inf"),), cumulative=(n,), total=n * ttft, count=n),
        queue_seconds=Histogram(bounds=(float("inf"),), cumulative=(n,), total=n * queued, count=n),
    )
    return snapshot(r, time=at)


def learn(snapshots: list[MetricsSnapshot], config: PolicyConfig = ROUND) -> list[Decision]:
    state, out = SETTLED, []
    for snap in snapshots:
        decision, state = decide(config, state, snap, fleet(1, now=snap.time))
        state = PolicyState.from_dict(state.to_dict())
        out.append(decision)
    return out


@pytest.mark.parametrize(
    ("busy", "planned"),
    [
        (20_000, 25_000),  # lightly loaded: the idle bound
        (40_000, 40_000),  # loaded: the busy bound
    ],
)
def test_an_optimistic_prefill_prior_is_replaced_by_what_the_engines_show(busy: float, planned: float) -> None:
    # The prior says 100k tokens/s; a request's prefill (TTFT less its queue wait) takes 2 s for 50k tokens:
    # an idle bound of 25k/s. A prior over max(busy bound, 1.25 x idle bound) is discredited: plan with the
    # measurement, the learned max(busy, idle), as a prior under it would be lifted to.
    decisions = learn([long_prompts(NOW + 15 * i, rate=busy, ttft=2.5, queued=0.5) for i in range(5)])
    assert [d.prefill["source"] for d in decisions[:2]] == ["prior", "prior"]  # not before 3 observations
    assert decisions[-1].prefill["source"] == "learned"
    assert decisions[-1].terms["prefillTokensPerSecondPerReplica"] == pytest.approx(planned)
    assert decisions[-1].prefill["learnedTokensPerSecond"] == max(busy, 25_000)
    assert decisions[-1].prefill["discreditedBy"] == "long prompts' TTFT"


def test_a_prior_within_the_slack_of_the_measurement_stands() -> None:
    # 50k tokens in 0.55 s: an idle bound of ~91k/s, a ceiling of ~114k over the prior's 100k: the prior stands.
    decision = learn([long_prompts(NOW + 15 * i, rate=20_000, ttft=0.55) for i in range(4)])[-1]
    assert decision.terms["prefillTokensPerSecondPerReplica"] == 100_000 and "discreditedBy" not in decision.prefill


def test_a_pessimistic_prefill_prior_is_lifted_to_the_bound() -> None:
    # A request's prefill takes 0.2 s for 50k tokens: the replica does at least 250k/s, the prior says 100k.
    ticks = [long_prompts(NOW + 15 * i, rate=20_000, ttft=0.3, queued=0.1) for i in range(4)]
    assert learn(ticks)[-1].terms["prefillTokensPerSecondPerReplica"] == pytest.approx(250_000)
    off = learn(ticks, replace(ROUND, learn_prefill=False))
    assert off[-1].terms["prefillTokensPerSecondPerReplica"] == ROUND.prefill_tokens_per_second


def test_a_learned_prefill_bound_is_forgotten_as_time_passes_seen_or_not() -> None:
    # Learned at 250k/s (the prior says 100k); then only chat arrives, which teaches nothing.
    learned = [long_prompts(NOW + 15 * i, rate=20_000, ttft=0.3, queued=0.1) for i in range(4)]
    chat = {"rate": 4_000, "ttft": 0.5, "prompt": 3_000}
    soon = learn([*learned, long_prompts(NOW + 60, **chat)])[-1]
    assert soon.prefill["source"] == "learned"
    assert soon.terms["prefillTokensPerSecondPerReplica"] == pytest.approx(250_000 * (1 - 15 / 3600))
    # The state kept in status overnight: yesterday's bound does not plan today's first burst.
    next_day = learn([*learned, long_prompts(NOW + 45 + 86_400, **chat)])[-1]
    assert next_day.prefill["source"] == "prior" and next_day.prefill["learnedTokensPerSecond"] is None
    assert next_day.prefill["samples"] == 0  # the prior stands until LEARNED_AFTER new observations


def test_a_bursts_long_requests_finishing_after_it_teach_nothing() -> None:
    # After a burst: the prompt histogram (observed as requests finish) still holds its 50k-token requests while
    # the first tokens, and so the TTFTs, are chat's (3k tokens in 0.2 s). 50k / 0.2 s would claim 250k/s.
    after = [long_prompts(NOW + 15 * i, rate=20_000, ttft=0.2) for i in range(4)]
    skewed = [snapshot(replace(s.replicas[0], prompt_tokens_rate=3_000.0), time=s.time) for s in after]
    decisions = learn(skewed)
    assert decisions[-1].prefill["samples"] == 0 and decisions[-1].prefill["learnedTokensPerSecond"] is None
    assert decisions[-1].terms["prefillTokensPerSecondPerReplica"] == ROUND.prefill_tokens_per_second
    # The same histograms with first tokens as long as the finished requests do teach (the control).
    assert learn(after)[-1].prefill["learnedTokensPerSecond"] == pytest.approx(250_000)


def test_chat_prompts_and_unexplained_waits_teach_nothing() -> None:
    chat = learn([long_prompts(NOW + 15 * i, rate=4_000, ttft=0.5, prompt=3_000) for i in range(4)])
    assert chat[-1].prefill["samples"] == 0 and chat[-1].prefill["source"] == "prior"
    busy = long_prompts(NOW, rate=40_000, ttft=9.0, waiting=4).replicas[0]
    _, state = decide(ROUND, SETTLED, snapshot(replace(busy, queue_seconds=None)), fleet(1))
    assert state.prefill_samples == 0  # a queue now and no queue-time histogram: the TTFTs hold its waits


def chat(at: float, *, prefill: float, prompt: float = 6_000, rate: float = 10_000) -> MetricsSnapshot:
    """One replica serving `prompt`-token chat requests that the engine prefilled in `prefill` s each by its own
    clock (vLLM's request_prefill_time_seconds), with 0.3 s of API-server time in their TTFTs on top."""
    base = long_prompts(at, rate=rate, ttft=prefill + 0.3, prompt=prompt).replicas[0]
    n = 30.0
    timed = Histogram(bounds=(float("inf"),), cumulative=(n,), total=n * prefill, count=n)
    return snapshot(replace(base, prefill_seconds=timed), time=at)


def test_chat_prefill_times_cap_an_optimistic_prior_from_the_third_tick() -> None:
    # The prior says 100k tokens/s; the engine prefills 6k-token prompts in 0.12 s: 50k/s, a ceiling of 62.5k. A
    # fleet serving only chat plans with the 50k once LEARNED_AFTER ticks showed it, and keeps no floor from it.
    decisions = learn([chat(NOW + 15 * i, prefill=0.12) for i in range(4)])
    planned = [d.terms["prefillTokensPerSecondPerReplica"] for d in decisions]
    assert planned[:2] == [100_000, 100_000]
    assert planned[2:] == [pytest.approx(50_000)] * 2
    assert decisions[-1].prefill["discreditedBy"] == "chat requests' prefill time"
    assert decisions[-1].prefill["learnedTokensPerSecond"] is None
    # A tick without finished chat requests starts the count again.
    quiet = snapshot(replica(running=0, sample_time=NOW + 60), time=NOW + 60)
    again = learn([*(chat(NOW + 15 * i, prefill=0.12) for i in range(3)), quiet, chat(NOW + 75, prefill=0.12)])
    assert again[-1].terms["prefillTokensPerSecondPerReplica"] == 100_000


def test_chat_prefill_times_leave_a_right_prior_and_short_prompts_alone() -> None:
    # 6k tokens in 0.05 s: 120k/s, a ceiling of 150k over a prior of 100k: the prior stands.
    right = learn([chat(NOW + 15 * i, prefill=0.05) for i in range(4)])[-1]
    assert right.terms["prefillTokensPerSecondPerReplica"] == 100_000 and "discreditedBy" not in right.prefill
    # 1k-token prompts take a forward pass whatever their length (below prior x step = 2.5k tokens): 0.05 s says
    # nothing of the throughput.
    short = learn([chat(NOW + 15 * i, prefill=0.05, prompt=1_000) for i in range(4)])[-1]
    assert short.terms["prefillTokensPerSecondPerReplica"] == 100_000


def test_time_to_ready_from_the_pods_phases() -> None:
    def pod(name: str, created: int, scheduled: int | None, started: int | None, ready: int | None) -> dict:
        def ts(offset: int) -> str:
            import time

            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW + offset))

        conditions = []
        if scheduled is not None:
            conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(scheduled)})
        if ready is not None:
            conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": ts(ready)})
        statuses = [{"state": {"running": {"startedAt": ts(started)}}}] if started is not None else []
        return {
            "metadata": {"name": name, "creationTimestamp": ts(created)},
            "status": {"conditions": conditions, "containerStatuses": statuses},
        }

    pods = [
        pod("a", -1000, -990, -900, -700),  # 10 s to schedule, 90 s to pull, 200 s to load
        pod("b", -800, -780, -700, -500),  # 20, 80, 200
        pod("loading", -150, -140, -60, None),  # started 60 s ago: ~140 s of loading left
        pod("pulling", -30, -25, None, None),  # scheduled: pull + load left
        pod("pending", -10, None, None, None),
    ]
    measured = record(Record(), pods).record
    assert len(measured.recent) == 2 and measured.p90_seconds == 300
    assert {k: measured.quantile(0.9, k) for k in ("schedule", "start", "load")} == {
        "schedule": 20,
        "start": 90,  # no Pulled events here: the pull counts in start
        "load": 200,
    }
    ages, remaining = starting(pods, measured, NOW, default_seconds=600)
    assert ages == (10, 30, 150)  # youngest first, as FleetState.starting_ages
    assert remaining == (300 - 10, 90 + 200 - 25, 140)
    assert starting(pods[2:], Record(), NOW, default_seconds=600)[1][-1] == 600 - 150  # nothing measured yet


def test_forecast_floor_needs_the_same_demand_in_each_of_the_last_two_periods() -> None:
    # One-minute samples: 5.4 two days ago and 6.2 yesterday inside the next 10 minutes' window; 9.0 three days
    # ago in the minute just before it.
    samples = ((NOW - 3 * 86400 - 60, 9.0), (NOW - 2 * 86400 + 180, 5.4), (NOW - 86400 + 300, 6.2))
    history = DemandRecord(60, samples).history(NOW, 86400, look_ahead=600, periods=3)
    assert history.windows == (6.2, 5.4, None)
    floor = forecast_floor(history)
    assert floor.replicas == 5 and "each of the last 2 recorded days" in floor.reason
    assert forecast_floor(DemandHistory(86400, 600, (6.2, None))).replicas == 0  # one day is no pattern
    assert forecast_floor(None).replicas == 0


def test_forecast_floor_raises_the_decision_and_says_why() -> None:
    quiet = replica(running=1, kv_usage=0.05, prompt_tokens=3000, request_rate=0.2)
    history = DemandHistory(86400, 600, (6.0, 7.0))
    decision, _ = decide(ROUND, SETTLED, replace(snapshot(quiet), demand_history=history), fleet(2))
    assert decision.desired_replicas == 6 and "forecast floor 6" in decision.reason
    assert decision.to_status()["forecast"]["replicas"] == 6
    off = replace(ROUND, forecast=False)
    assert decide(off, SETTLED, replace(snapshot(quiet), demand_history=history), fleet(1))[0].desired_replicas == 1


@pytest.mark.parametrize(("ended", "expected"), [(True, 5), (False, 6)], ids=["burst-ended", "no-burst-end"])
def test_a_falling_forecast_floor_is_held_again_only_until_todays_burst_ended(ended: bool, expected: int) -> None:
    # The floor held 6 replicas for the earlier days' burst; a tick later it falls. Once today's burst has ended
    # (long prompts stopped arriving) the scale-down window does not hold the floor a second time; before that it
    # does, a margin for a measured need that may be wrong.
    state = PolicyState(found=SETTLED.found, history=((NOW - 400, 1),), burst_ended=NOW - 120 if ended else None)

    def quiet(now: float, days: tuple[float, float]) -> MetricsSnapshot:
        load = replicas(6, running=1, kv_usage=0.05, prompt_tokens=3000, request_rate=0.2, sample_time=now)
        return replace(snapshot(*load, time=now), demand_history=DemandHistory(86400, 600, days))

    held, state = decide(ROUND, state, quiet(NOW, (6.0, 7.0)), fleet(6))
    assert held.desired_replicas == 6 and "forecast floor 6" in held.reason
    assert state.burst_ended == (NOW - 120 if ended else None)  # kept until the next burst
    later = NOW + 15
    fell, _ = decide(ROUND, state, quiet(later, (0.5, 0.5)), fleet(6, now=later))
    assert fell.desired_replicas == expected
    assert ("stabilization window" in fell.reason) == (not ended), fell.reason


def test_schedule_windows_set_the_bounds_while_active() -> None:
    peak = ScheduleWindow("peak", start_minute=7 * 60 + 30, end_minute=9 * 60, min_replicas=4, days=(4,))
    night = ScheduleWindow("night", start_minute=23 * 60, end_minute=6 * 60, max_replicas=2)
    assert bounds_at(FRIDAY_8AM, 1, 8, (peak, night)).min_replicas == 4
    assert bounds_at(FRIDAY_8AM + 86400, 1, 8, (peak,)).windows == ()  # Saturday
    assert bounds_at(FRIDAY_8AM - 3 * 3600, 1, 8, (peak, night)).max_replicas == 2  # 05:00, started the day before
    config = replace(ROUND, schedule=(peak,))
    quiet = snapshot(replica(running=1, kv_usage=0.05, prompt_tokens=3000, request_rate=0.2))
    decision, _ = decide(config, SETTLED, quiet, fleet(1))
    assert decision.desired_replicas == 4 and "schedule peak in force" in decision.reason
    assert decision.to_status()["bounds"] == {"minReplicas": 4, "maxReplicas": 16, "schedule": ["peak"]}


def test_from_spec_maps_schedule_and_forecast() -> None:
    body = {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "model": {"source": {"pvc": {"claimName": "w"}}},
            "autoscaling": {
                "schedule": [{"name": "peak", "start": "22:30", "end": "01:00", "days": ["fri"], "minReplicas": 3}],
                "forecast": {"enabled": False},
            },
        },
    }
    config = PolicyConfig.from_spec(parse_resource(body).spec.autoscaling, sample_plan())
    assert config.schedule == (ScheduleWindow("peak", 22 * 60 + 30, 60, 3, None, (4,)),)
    assert config.forecast is False
    assert (config.forecast_period_seconds, config.forecast_margin_seconds) == (86400, 300)
    assert config.forecast_look_ahead(240) == 240 + 15 + 300


def test_min_replicas_zero_is_rejected_with_the_reason() -> None:
    from m3fleet.errors import SpecError, SpecErrors

    body = {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "x"},
        "spec": {"model": {"source": {"pvc": {"claimName": "w"}}}},
    }
    body["spec"]["autoscaling"] = {"minReplicas": 0}
    with pytest.raises((SpecError, SpecErrors)) as caught:
        parse_resource(body)
    assert "spec.autoscaling.minReplicas" in str(caught.value) and "spec.gateway" in str(caught.value)


def test_a_need_that_did_not_hold_is_not_forecast() -> None:
    # A 30 s onset spike to 12 inside a burst that held at 5: the floor is the held level.
    day = NOW - 86400
    records = [(day + t, 12.0 if 60 <= t < 90 else 5.0 if t >= 0 else 1.0) for t in range(-300, 600, 15)]
    assert [n for _, n in sustained(records, 120)][-1] == 5.0 and max(n for _, n in sustained(records, 120)) == 5.0
    recorded = DemandRecord()
    for t, need in records:
        recorded = record_demand(recorded, t, need, 86400, 600)
    assert recorded.history(NOW, 86400, look_ahead=600, periods=1).windows == (5.0,)


def test_backlog_replicas_are_not_held_for_a_whole_scale_down_window() -> None:
    # One replica with a deep queue: the backlog keeps it busy (need > demand); the stabilization window
    # remembers only what the arrivals need, so the extra replicas go once the backlog is gone.
    backlog = snapshot(*replicas(4, running=2, waiting=1500, kv_usage=0.5, prompt_tokens=50_000, request_rate=2.0))
    decision, state = decide(ROUND, SETTLED, backlog, fleet(4))
    assert decision.terms["needReplicas"] > decision.terms["demandReplicas"]
    assert state.history[-1][1] < decision.recommended_replicas
    _, held = decide(replace(ROUND, transient_release=False), SETTLED, backlog, fleet(4))
    assert held.history[-1][1] == decision.recommended_replicas

"""The operator's own demand history (`status.autoscaling.demand`): each tick's need folded into one sample
per bucket, bounded, round-tripped through status, and read back as the forecast floor's input; and the
tick's inputs as the operator builds them from the resource (schedule windows and forecast applied)."""

from __future__ import annotations

import json
from dataclasses import replace

from m3fleet.api.parse import parse_resource
from m3fleet.autoscaling.forecast import (
    DAY,
    MAX_SAMPLES,
    DemandRecord,
    bucket_seconds,
    forecast_floor,
    record_demand,
)
from m3fleet.autoscaling.policy import PolicyConfig, PolicyState, decide
from m3fleet.planner import plan as make_plan
from tests.support.autoscaling.snapshots import NOW, fleet, replica, snapshot

LOOK_AHEAD = 900.0
START = 1_799_999_700.0  # a 5-minute (so also 1-minute) boundary: NOW is 300 s into the day's bucket of 5
assert START % 300 == 0


def ticks(record: DemandRecord, start: float, needs: list[float], step: float = 15.0) -> DemandRecord:
    for i, need in enumerate(needs):
        record = record_demand(record, start + i * step, need, DAY, LOOK_AHEAD)
    return record


def test_bucket_size_follows_the_period_in_whole_minutes() -> None:
    assert bucket_seconds(DAY) == 60
    assert bucket_seconds(3600) == 60
    assert bucket_seconds(7 * DAY) == 420 and bucket_seconds(7 * DAY) % 60 == 0


def test_a_bucket_becomes_one_sample_of_the_need_that_held_once_it_is_sustain_seconds_past() -> None:
    # 3 for three minutes (12 ticks of 15 s), a 30 s spike to 9, then 2.
    needs = [3.0] * 12 + [9.0, 9.0] + [2.0] * 10
    record = ticks(DemandRecord(), START, needs[:11])
    assert record.samples == () and len(record.open) == 11  # 90 s past the first bucket: not closed yet
    record = ticks(record, START + 11 * 15, needs[11:])
    assert record.samples[0] == (START, 3.0)  # held two minutes from the bucket's start
    assert all(n < 9.0 for _, n in record.samples)  # the spike did not hold: never recorded
    assert all(t >= record.samples[-1][0] + 60 for t, _ in record.open)


def test_a_need_that_held_is_recorded_and_a_tick_without_a_need_records_nothing() -> None:
    record = ticks(DemandRecord(), START, [1.0] * 2 + [6.5] * 20)
    assert record.samples[0] == (START, 6.5)  # held two minutes from its second half on
    same = record_demand(record, START + 21 * 15 + 1, None, DAY, LOOK_AHEAD)
    assert same.samples == record.samples and same.open == record.open


def test_a_rise_is_stamped_with_its_own_minute_not_a_coarser_bucket() -> None:
    """A need that rose at minute 4 of a 5-minute span is read back from minute 4: the floor orders replicas one
    look-ahead before that minute, not up to five minutes before it."""
    record = ticks(DemandRecord(), START, [1.0] * 16 + [6.0] * 40)
    assert next(t for t, n in record.samples if n == 6.0) == START + 240
    assert record.history(START + DAY - LOOK_AHEAD + 230, DAY, LOOK_AHEAD, periods=1).windows == (1.0,)
    assert record.history(START + DAY - LOOK_AHEAD + 240, DAY, LOOK_AHEAD, periods=1).windows == (6.0,)


def test_status_round_trip_is_exact_and_dense() -> None:
    record = ticks(DemandRecord(), START, [2.345678] * 50)
    status = json.loads(json.dumps(record.to_status()))
    back = DemandRecord.from_status(status, 60)
    assert back.samples == record.samples and len(back.open) == len(record.open)
    assert status["start"] == int(START // 60) and status["needs"][0] == 2.35
    assert DemandRecord.from_status(status, 420) == DemandRecord(420)  # another bucket size: afresh
    assert DemandRecord.from_status({"bucketSeconds": 60, "needs": ["x"], "start": 1}, 60) == DemandRecord(60)
    assert DemandRecord.from_status({"bucketSeconds": 60.5}, 60) == DemandRecord(60)
    gap = DemandRecord(60, ((START, 1.0), (START + 180, 4.0)))
    assert gap.to_status()["needs"] == [1.0, None, None, 4.0]  # nothing recorded in between: null
    assert DemandRecord.from_status(gap.to_status(), 60).samples == gap.samples


def test_an_older_operators_five_minute_samples_are_read_minute_by_minute() -> None:
    legacy = {"bucketSeconds": 300, "samples": [[int(START // 60), 6.0]], "open": [[START + 400, 2.0]]}
    record = DemandRecord.from_status(legacy, 60)
    assert record.samples == tuple((START + 60 * i, 6.0) for i in range(5))
    assert record.open == ()  # ticks of a 5-minute bucket do not fold into 1-minute ones
    # The operator's first write merge-patches today's form over it: the old `samples` key goes (null).
    written = {**legacy, **record.to_status()}
    merged = {key: value for key, value in written.items() if value is not None}
    assert "samples" not in merged and DemandRecord.from_status(merged, 60).samples == record.samples
    emptied = {**merged, **DemandRecord(60).to_status()}  # and a record that emptied leaves nothing stale
    assert DemandRecord.from_status({k: v for k, v in emptied.items() if v is not None}, 60) == DemandRecord(60)


def test_new_samples_are_saved_five_minutes_at_a_time() -> None:
    record = DemandRecord(60, tuple((START + 60 * i, 1.0) for i in range(12)))
    saved = DemandRecord(60, record.samples[:8]).to_status()
    assert not record.worth_saving(saved)  # four unsaved minutes
    assert DemandRecord(60, (*record.samples, (START + 720, 1.0))).worth_saving(saved)  # five
    assert record.worth_saving(None) and not DemandRecord(60).worth_saving(None)


def test_only_what_the_floor_can_read_is_kept_and_never_more_than_max_samples() -> None:
    record = DemandRecord()
    for minute in range(0, 3 * 24 * 60, 1):  # three days, a tick a minute
        record = record_demand(record, START + 60 * minute, 1.0 + (minute % 7), DAY, LOOK_AHEAD)
    now = START + 3 * DAY
    assert len(record.samples) <= MAX_SAMPLES
    assert min(t for t, _ in record.samples) >= now - 2 * DAY - LOOK_AHEAD - 2 * 60
    assert len(json.dumps(record.to_status(), separators=(",", ":"))) < 16_000  # as the apiserver stores it


def test_two_days_of_the_same_peak_set_a_floor_one_day_does_not() -> None:
    quiet, peak = [1.0] * 8, [6.0] * 40  # 2 min quiet, then 10 min at 6
    record = DemandRecord()
    for day in (2, 1):
        record = ticks(record, START - day * DAY, quiet + peak + [1.0] * 320)  # then 80 min quiet
    history = record.history(START, DAY, LOOK_AHEAD)
    assert history.windows == (6.0, 6.0)
    floor = forecast_floor(history)
    assert floor.replicas == 6 and "each of the last 2 recorded days" in floor.reason
    one_day = DemandRecord(60, tuple((t, n) for t, n in record.samples if t > START - 1.5 * DAY))
    assert forecast_floor(one_day.history(START, DAY, LOOK_AHEAD)).replicas == 0
    later = record.history(START + 3600, DAY, LOOK_AHEAD)  # an hour later the peak is behind
    assert later.windows == (1.0, 1.0)


def resource(autoscaling: dict[str, object]) -> dict[str, object]:
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "x", "namespace": "n"},
        "spec": {
            "model": {"source": {"pvc": {"claimName": "w"}}},
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 8, **autoscaling},
        },
    }


def tick_inputs(body: dict[str, object]) -> PolicyConfig:
    """The config as `Autoscaler.tick` builds it from the resource the watch delivered."""
    parsed = parse_resource(body)
    return PolicyConfig.from_spec(parsed.spec.autoscaling, make_plan(parsed.spec))


def test_the_operators_inputs_apply_schedule_windows_and_the_recorded_forecast() -> None:
    hhmm = f"{int(NOW % DAY) // 3600:02d}:{int(NOW % 3600) // 60:02d}"
    end = f"{(int(NOW % DAY) // 3600 + 1) % 24:02d}:00"
    config = tick_inputs(resource({"schedule": [{"name": "peak", "start": hhmm, "end": end, "minReplicas": 3}]}))
    quiet = snapshot(replica(running=1, kv_usage=0.01, prompt_tokens=1000, request_rate=0.05))
    decision, _ = decide(config, PolicyState(), quiet, fleet(1))
    assert decision.desired_replicas == 3 and "schedule peak in force: 3-8" in decision.reason
    assert decision.to_status()["bounds"]["schedule"] == ["peak"]
    outside, _ = decide(config, PolicyState(), replace(quiet, time=NOW + 2 * 3600), fleet(1, now=NOW + 2 * 3600))
    assert outside.to_status()["bounds"]["schedule"] == []

    # The forecast, from a record as the operator stores it in status.
    config = tick_inputs(resource({}))
    record = DemandRecord()
    for day in (2, 1):
        record = ticks(record, NOW - day * DAY - 120, [5.0] * 60)
    stored = DemandRecord.from_status(json.loads(json.dumps(record.to_status())), 60)
    history = stored.history(NOW, config.forecast_period_seconds, config.forecast_look_ahead(None))
    decision, _ = decide(config, PolicyState(), replace(quiet, demand_history=history), fleet(1))
    assert decision.desired_replicas == 5 and "forecast floor 5" in decision.reason
    assert decision.to_status()["forecast"]["replicas"] == 5
    assert config.forecast_period_seconds == DAY

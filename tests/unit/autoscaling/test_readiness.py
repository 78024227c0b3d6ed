"""Time-to-ready from pods and events (pure): phases, restarts, images already present, pods never ready,
LeaderWorkerSet groups, each replica counted once (also by a restarted operator), the horizon."""

from __future__ import annotations

from m3fleet.api.models import TimeToReadyStatus
from m3fleet.autoscaling.time_to_ready import (
    WINDOW,
    Record,
    go_duration,
    record,
    replicas,
    starting,
    unmeasured,
)
from tests.support.autoscaling.pods import T0, pod, pulled, ts

PULL_MESSAGE = (
    'Successfully pulled image "vllm/vllm-openai:v0.33.0" in 1m31.5s (1m31.5s including waiting). '
    "Image size: 9876543210 bytes."
)
PRESENT_MESSAGE = 'Container image "vllm/vllm-openai:v0.33.0" already present on machine'


def test_phases_from_conditions_container_status_and_the_pull_event() -> None:
    p = pod("chat-a", created=0, scheduled=4, started=100, ready=400)
    measured = record(Record(), [p], [pulled("chat-a", 97, PULL_MESSAGE)])
    (sample,) = measured.new
    assert sample.phases == {"schedule": 4.0, "image": 93.0, "start": 3.0, "load": 300.0}
    assert sample.seconds == 400.0 == sum(v for v in sample.phases.values() if v is not None)
    assert sample.image_present is False
    assert sample.pull_seconds == 91.5
    status = measured.record.to_status()
    assert status["samples"] == 1 and status["replicasMeasured"] == 1
    assert status["lastSeconds"] == 400.0 and status["p50Seconds"] == 400.0
    assert status["phases"]["load"] == {"p50Seconds": 300.0, "p90Seconds": 300.0, "lastSeconds": 300.0, "samples": 1}
    assert status["recent"][0]["readyAt"] == ts(400)
    TimeToReadyStatus.model_validate(status)  # the CRD's schema holds it


def test_image_already_present_is_a_zero_pull() -> None:
    p = pod("chat-b", created=0, scheduled=2, started=4, ready=95)
    (sample,) = record(Record(), [p], [pulled("chat-b", 3, PRESENT_MESSAGE)]).new
    assert sample.image_present is True and sample.pull_seconds == 0.0
    assert sample.phases["image"] == 1.0 and sample.phases["load"] == 91.0


def test_without_events_the_image_phase_is_unknown_and_counts_in_start() -> None:
    p = pod("chat-c", created=0, scheduled=5, started=65, ready=300)
    (sample,) = record(Record(), [p]).new
    assert sample.phases == {"schedule": 5.0, "image": None, "start": 60.0, "load": 235.0}
    assert sample.image_present is None and sample.pull_seconds is None
    status = record(Record(), [p]).record.to_status()
    assert status["phases"]["image"]["samples"] == 0 and status["phases"]["image"]["p50Seconds"] is None
    assert "image" not in status["recent"][0]["phases"]
    assert Record.from_status(status).recent[0].phases["image"] is None


def test_a_crash_before_ready_counts_from_the_first_start() -> None:
    # Started at 50, crashed (OOM while loading), restarted at 200, ready at 500.
    p = pod("chat-d", created=0, scheduled=3, first_start=50, started=200, ready=500, restarts=1)
    (sample,) = record(Record(), [p]).new
    assert sample.phases["start"] == 47.0 and sample.phases["load"] == 450.0
    assert sample.restarts == 1 and sample.seconds == 500.0


def test_pods_never_ready_are_not_measured_but_are_starting() -> None:
    pending = pod("chat-e", created=0, unschedulable=True)
    loading = pod("chat-f", created=10, scheduled=12, started=40)
    assert record(Record(), [pending, loading]).new == ()
    assert unmeasured([pending, loading], Record()) == []
    # Nothing measured: each still needs the prior less its age.
    ages, remaining = starting([pending, loading], Record(), T0 + 100, default_seconds=600)
    assert ages == (90.0, 100.0) and remaining == (510.0, 500.0)


def test_starting_replicas_need_only_the_phases_ahead_of_them() -> None:
    done = record(Record(), [pod(f"r{i}", created=0, scheduled=10, started=70, ready=370) for i in range(3)]).record
    loading = pod("chat-g", created=1000, scheduled=1010, started=1070)  # containers up: only load left
    waiting = pod("chat-h", created=1050)  # not scheduled: the whole time-to-ready
    ages, remaining = starting([loading, waiting], done, T0 + 1100, default_seconds=600)
    assert ages == (50.0, 100.0)
    assert remaining == (370.0 - 50.0, 300.0 - 30.0)


def test_each_replica_is_counted_once_also_after_an_operator_restart() -> None:
    first = pod("chat-a", created=0, scheduled=1, started=2, ready=100)
    measured = record(Record(), [first])
    assert len(measured.new) == 1
    # The same pods again (a second event, or a new operator process reading status back): nothing new.
    restored = Record.from_status(measured.record.to_status())
    assert record(restored, [first]).new == ()
    assert restored.knows("uid-chat-a")
    second = pod("chat-b", created=200, scheduled=201, started=202, ready=260)
    again = record(restored, [first, second])
    assert [s.replica for s in again.new] == ["chat-b"]
    assert again.record.measured == 2


def test_the_window_is_bounded_and_older_replicas_are_not_counted_late() -> None:
    pods = [
        pod(f"p{i}", created=100 * i, scheduled=100 * i + 1, started=100 * i + 2, ready=100 * i + 50)
        for i in range(WINDOW + 3)
    ]
    full = record(Record(), pods).record
    assert len(full.recent) == WINDOW and full.measured == WINDOW + 3
    assert [s.replica for s in full.recent] == [f"p{i}" for i in range(3, WINDOW + 3)]
    restored = Record.from_status(full.to_status())
    # p0-p2 fell out of the window; a restarted operator must not count them again.
    assert record(restored, pods).new == ()


def test_a_leaderworkerset_group_is_ready_when_its_last_pod_is() -> None:
    leader = pod("chat-0", created=0, scheduled=2, started=60, ready=300, group="g0", role="leader")
    worker = pod("chat-0-1", created=3, scheduled=20, started=90, ready=420, group="g0", role="worker")
    (sample,) = record(Record(), [leader, worker], group_size=2).new
    assert sample.id == "uid-chat-0" and sample.replica == "chat-0"
    assert sample.uids == ("uid-chat-0", "uid-chat-0-1")
    assert sample.phases == {"schedule": 20.0, "image": None, "start": 70.0, "load": 330.0}
    # Only the leader exists (the worker not yet created): not a ready replica.
    assert record(Record(), [leader], group_size=2).new == ()
    (group,) = replicas([leader], group_size=2)
    assert not group.complete


def test_the_horizon_is_the_p90_of_the_window_and_the_prior_until_measured() -> None:
    assert Record().horizon_seconds(600.0) == (
        600.0,
        "prior: spec.autoscaling.coldStartSeconds (no replica measured yet)",
    )
    pods = [pod(f"p{i}", created=0, scheduled=1, started=2, ready=100 + 10 * i) for i in range(10)]
    seconds, source = record(Record(), pods).record.horizon_seconds(600.0)
    assert seconds == 180.0  # nearest rank: the 9th of 100..190
    assert source.startswith("measured: p90 of the last 10")


def test_go_durations() -> None:
    assert go_duration("1m31.5s") == 91.5
    assert go_duration("850ms") == 0.85
    assert go_duration("1h2m3s") == 3723.0
    assert go_duration("no duration") is None
    assert go_duration("1m31.5s (1m31.5s including waiting)") == 91.5

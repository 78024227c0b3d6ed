"""Foresight where traffic repeats: a forecast floor from the resource's own history, and scheduled
bounds. Pure: no clock (time is an input), no I/O.

* **Forecast floor** — `forecast_floor(history)`: when the next look-ahead window needed at least N
  replicas at this time in *each* of the last two recorded periods (days, by default), hold N now,
  so replicas ordered one time-to-ready ahead are ready when the demand comes back. One period is
  no pattern: a single recorded burst sets no floor. It is a floor under the reactive need, never
  the only input, and bounded by min/max like everything else.
* **Scheduled bounds** — `ScheduleWindow`: a daily (or weekday) UTC time window that raises
  minReplicas and/or sets maxReplicas while it is active (AIBrix's scheduled bounds, KEDA's cron
  trigger), for peaks the user knows about.

The operator keeps the resource's own history in `status.autoscaling.demand` (so it survives restarts):
`record_demand` folds each tick's `demandReplicas` (the need without backlogs) into a `DemandRecord` of
one sample per bucket (`bucket_seconds(period)`: 1 minute for a daily period, period/1440 for longer
ones, a whole number of minutes) — the largest need that held SUSTAIN_SECONDS inside the bucket — kept
for the FORECAST_PERIODS periods the floor reads plus its look-ahead, at most MAX_SAMPLES of them. In
status they are dense: `start` (the first bucket, minutes since the epoch: absolute, not minute-of-period,
so the floor can tell one period ago from two) and `needs`, one number (or null) per bucket, about 15 KB
for two days; new samples are written once SAVE_EVERY_SECONDS of them have gathered. The ticks of the bucket
being filled are kept too (`open`, at most MAX_OPEN) until SUSTAIN_SECONDS past its end, so a need that
rose in its last seconds is judged on whether it then held. `DemandRecord.history` reads it back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from m3fleet.autoscaling.signals import DemandHistory

DAY = 86400.0
FORECAST_PERIODS = 2  # the pattern must hold in each of the last two recorded periods


SUSTAIN_SECONDS = 120.0  # a need counts once it held this long (a burst's onset spikes do not)


def sustained(records: Sequence[tuple[float, float]], seconds: float = SUSTAIN_SECONDS) -> list[tuple[float, float]]:
    """Each record's need replaced by the smallest need recorded in the `seconds` from it on (inclusive):
    the level that then held that long. `records` are (time, need) sorted by time."""
    out: list[tuple[float, float]] = []
    end = 0
    for i, (t, _) in enumerate(records):
        end = max(end, i)
        while end + 1 < len(records) and records[end + 1][0] <= t + seconds:
            end += 1
        out.append((t, min(n for _, n in records[i : end + 1])))
    return out


MAX_SAMPLES = 3000  # closed buckets kept: two daily periods of 1-minute buckets plus a look-ahead
MAX_OPEN = 128  # ticks of the bucket being filled (interval >= 5 s: (60 + 120) / 5 = 36)
BUCKETS_PER_PERIOD = 1440  # 1-minute buckets in a day
# New samples are written to status once this much of them has gathered (a restart loses at most this much):
# one demand write per five minutes whatever the bucket.
SAVE_EVERY_SECONDS = 300.0


def bucket_seconds(period: float) -> float:
    """The sample spacing for a period: 60 s for a day, period/1440 (whole minutes) for longer periods. Finer
    than the look-ahead by far: a coarser bucket moves a recorded rise to its bucket's start, and the floor
    then orders replicas up to a bucket early every day."""
    return 60.0 * max(1, math.ceil(period / BUCKETS_PER_PERIOD / 60.0))


@dataclass(frozen=True)
class DemandRecord:
    """The resource's own demand, compact enough for its status (see the module's docstring)."""

    bucket: float = 60.0  # seconds per sample
    samples: tuple[tuple[float, float], ...] = ()  # (bucket start, need that held in it), oldest first
    open: tuple[tuple[float, float], ...] = ()  # (time, need) of the ticks not yet folded into a sample

    def to_status(self) -> dict[str, Any]:
        """Dense: `needs[i]` is the bucket starting `start` + i buckets (minutes since the epoch), null where
        nothing was recorded; about 5 bytes a sample. Every key is always written (`samples`, an older
        operator's form, as null): status is merge-patched, and a key left out would keep its old value."""
        start: int | None = None
        needs: list[float | None] = []
        if self.samples:
            first = self.samples[0][0]
            start = int(first // 60)
            needs = [None] * (round((self.samples[-1][0] - first) / self.bucket) + 1)
            for t, n in self.samples:
                needs[round((t - first) / self.bucket)] = round(n, 2)
        return {
            "bucketSeconds": int(self.bucket),
            "start": start,
            "needs": needs,
            "open": [[round(t, 1), round(n, 2)] for t, n in self.open],
            "samples": None,
        }

    @classmethod
    def from_status(cls, data: Any, bucket: float) -> DemandRecord:
        """Tolerant: anything malformed, or recorded with a bucket size it cannot be read at, starts afresh.
        The sparse form of older operators (`samples`: [minute, need] per 5-minute bucket, no `needs`) is read
        as that need in each minute of its bucket."""
        if not isinstance(data, Mapping) or not isinstance(data.get("bucketSeconds"), int):
            return cls(bucket)
        recorded = float(data["bucketSeconds"])
        try:
            if "needs" in data or data.get("samples") is None:
                if recorded != bucket:
                    return cls(bucket)
                first = float(data.get("start") or 0) * 60.0
                needs = data.get("needs") or ()
                dense = tuple((first + i * bucket, float(n)) for i, n in enumerate(needs) if n is not None)
                return cls(bucket, dense, tuple((float(t), float(n)) for t, n in data.get("open") or ()))
            if recorded % bucket == 0:
                parts = int(recorded // bucket)
                legacy = ((float(m) * 60.0, float(n)) for m, n in data["samples"])
                return cls(bucket, tuple((t + i * bucket, n) for t, n in legacy for i in range(parts)))
        except (TypeError, ValueError):
            pass
        return cls(bucket)

    def worth_saving(self, recorded: Any) -> bool:
        """Whether the samples the recorded `status.autoscaling.demand` lacks cover SAVE_EVERY_SECONDS (then
        they are worth a status write; the open ticks alone never are)."""
        newest = _newest_saved(recorded, self.bucket)
        unsaved = sum(1 for t, _ in self.samples if t > newest)
        return unsaved * self.bucket >= SAVE_EVERY_SECONDS

    def history(self, now: float, period: float, look_ahead: float, periods: int = FORECAST_PERIODS) -> DemandHistory:
        """The forecast input: for k = 1..periods, the largest sample whose bucket overlaps
        [now - k x period, now - k x period + look_ahead] (None when none was recorded there)."""
        windows: list[float | None] = []
        for k in range(1, periods + 1):
            lo, hi = now - k * period, now - k * period + look_ahead
            inside = [n for t, n in self.samples if t + self.bucket > lo and t <= hi]
            windows.append(max(inside) if inside else None)
        return DemandHistory(period_seconds=period, look_ahead_seconds=look_ahead, windows=tuple(windows))


def _newest_saved(recorded: Any, bucket: float) -> float:
    """The newest sample's bucket in a stored record, without decoding the rest (asked every tick): today's
    dense form ends with its newest sample; anything else is decoded."""
    if isinstance(recorded, Mapping) and recorded.get("bucketSeconds") == int(bucket) and recorded.get("needs"):
        try:
            return float(recorded["start"]) * 60.0 + (len(recorded["needs"]) - 1) * bucket
        except (TypeError, ValueError):
            return -math.inf
    saved = DemandRecord.from_status(recorded, bucket).samples
    return saved[-1][0] if saved else -math.inf


def record_demand(
    record: DemandRecord, now: float, need: float | None, period: float, look_ahead: float
) -> DemandRecord:
    """`record` with this tick's need (None: nothing measured, nothing recorded) folded in: a bucket whose
    end is SUSTAIN_SECONDS past becomes one sample (the largest need that held SUSTAIN_SECONDS in it);
    samples too old for the floor to read are dropped, and at most MAX_SAMPLES kept."""
    bucket = bucket_seconds(period)
    if record.bucket != bucket:
        record = DemandRecord(bucket)
    ticks = [*((t, n) for t, n in record.open if t < now), *(() if need is None else ((now, need),))]
    samples = list(record.samples)
    while ticks:
        start = math.floor(ticks[0][0] / bucket) * bucket
        end = start + bucket
        if now < end + SUSTAIN_SECONDS:
            break
        held = [n for t, n in sustained(ticks, SUSTAIN_SECONDS) if t < end]
        samples.append((start, round(max(held), 2)))  # as status keeps it
        ticks = [(t, n) for t, n in ticks if t >= end]
    oldest = now - FORECAST_PERIODS * period - look_ahead - bucket
    kept = tuple((t, n) for t, n in samples if t >= oldest)[-MAX_SAMPLES:]
    return DemandRecord(bucket, kept, tuple(ticks[-MAX_OPEN:]))


@dataclass(frozen=True)
class Forecast:
    replicas: int
    reason: str


def forecast_floor(history: DemandHistory | None, tolerance: float = 0.1) -> Forecast:
    """The floor the last FORECAST_PERIODS recorded periods agree on (0 with the reason when none)."""
    if history is None:
        return Forecast(0, "no recorded history")
    recorded = [(k + 1, w) for k, w in enumerate(history.windows) if w is not None]
    if len(recorded) < FORECAST_PERIODS:
        return Forecast(0, f"{len(recorded)} of the last periods recorded; a floor needs {FORECAST_PERIODS}")
    last = recorded[:FORECAST_PERIODS]
    need = min(w for _, w in last)
    replicas = max(0, math.ceil(need * (1.0 - tolerance) - 1e-9))
    period = _period_name(history.period_seconds)
    seen = ", ".join(f"{w:.1f} {k} {period}{'s' if k > 1 else ''} ago" for k, w in last)
    return Forecast(
        replicas,
        f"the next {history.look_ahead_seconds:.0f}s needed up to {need:.1f} replicas at this time in each of the "
        f"last {FORECAST_PERIODS} recorded {period}s ({seen})",
    )


def _period_name(seconds: float) -> str:
    if seconds == DAY:
        return "day"
    if seconds == 7 * DAY:
        return "week"
    return f"{seconds:.0f}s-period"


@dataclass(frozen=True)
class ScheduleWindow:
    """Bounds in force every day (or on `days`, 0 = Monday) from `start_minute` to `end_minute` UTC
    (minutes after midnight; an end before the start runs past midnight)."""

    name: str
    start_minute: int
    end_minute: int
    min_replicas: int | None = None
    max_replicas: int | None = None
    days: tuple[int, ...] = ()

    def active(self, now: float) -> bool:
        moment = datetime.fromtimestamp(now, tz=UTC)
        minute = moment.hour * 60 + moment.minute
        weekday = moment.weekday()
        if self.start_minute <= self.end_minute:
            inside, day = self.start_minute <= minute < self.end_minute, weekday
        elif minute >= self.start_minute:
            inside, day = True, weekday
        else:  # after midnight: the window started the day before
            inside, day = minute < self.end_minute, (weekday - 1) % 7
        return inside and (not self.days or day in self.days)


@dataclass(frozen=True)
class Bounds:
    min_replicas: int
    max_replicas: int
    windows: tuple[str, ...]  # the schedule windows in force


def bounds_at(now: float, min_replicas: int, max_replicas: int, schedule: Sequence[ScheduleWindow]) -> Bounds:
    """The spec's bounds with the active windows applied: the largest active minReplicas raises the
    floor, the largest active maxReplicas replaces the ceiling; min never exceeds max."""
    active = [w for w in schedule if w.active(now)]
    lo = max([min_replicas, *(w.min_replicas for w in active if w.min_replicas is not None)])
    maxima = [w.max_replicas for w in active if w.max_replicas is not None]
    hi = max(maxima) if maxima else max_replicas
    return Bounds(min(lo, hi), hi, tuple(w.name for w in active))


def parse_hhmm(text: str) -> int:
    """'HH:MM' (24 h) -> minutes after midnight; ValueError otherwise."""
    hours, _, minutes = text.partition(":")
    h, m = int(hours), int(minutes)
    if not (0 <= h <= 23 and 0 <= m <= 59) or len(minutes) != 2:
        raise ValueError(f"{text!r} is not HH:MM")
    return h * 60 + m

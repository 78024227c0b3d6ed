"""The context-length-aware scaling policy. Pure: no I/O, no clock (time is `FleetState.now`).

One call per tick: `decide(config, state, snapshot, fleet) -> (Decision, PolicyState)`. The need,
in (fractional) replicas, is the largest of three terms:

* **kv** — KV-token demand over KV-token supply: resident tokens + queued prompt tokens + the
  expected decode growth of running requests, against `kvCacheUtilization` x the per-replica
  capacity (the plan's, corrected by the capacity the engines report). Queued tokens count by how
  often the KV turns over within the cold-start horizon (Little's law: a backlog drains in waves,
  it never has to be resident all at once).
* **bin** — long requests: a request needing more than half a rank's usable KV cannot share it
  with another such request; two between a third and a half can share one. Sizes come from the
  engines' prompt-length histograms (finished requests, so they lag) or, when a gateway exports
  them, from the queued requests themselves. A request larger than any rank can hold is reported
  and never scaled on: more replicas of the same shape cannot serve it.
* **prefill** — arriving prompt tokens against the replicas' prefill throughput at a utilisation
  derived from the TTFT objective (processor-sharing prefill: TTFT ~ t/(1-u)), plus the replicas
  kept busy by backlogs. A request queued in an engine waits for that engine (routers dispatch at
  arrival and never move it), so each engine's queue — and the pile-up it gathers until replicas
  ordered now or already starting are ready, the cold-start look-ahead — occupies at most its own
  replica; new replicas only serve what arrives after they are ready. Only a gateway that holds
  requests (`gateway_holds_requests`, or its exported queue) has a backlog any replica can drain.
  Arrivals come from conservation (requests finishing + growth of those in flight over the rate
  window) times the arrival-side prompt length: prompt tokens per first token on replicas without
  a queue (the router sends new requests there; a queued replica prefills the past), smoothed over
  two minutes. A doubling of the rate (once a whole rate window has been seen: a new fleet's rate
  climbs from near zero as its first finishes lag), or resident requests suddenly far longer than
  anything seen recently, is a burst, taken at once; long prompts no longer arriving are taken at
  once too, so the estimate adds no lag of its own to a scale-down. With a gateway in front
  (spec.autoscaling.gateway), arrivals are what it recorded as requests arrived, their bytes over the
  bytes per prompt token measured against what the engines prefilled: a burst of long prompts is sized
  from its first scrape, while the engines have prefilled none of it (they count a prompt at its first
  token).

Then HPA semantics: a tolerance band, stabilization windows (highest recommendation in the
scale-down window wins; the window forgets a burst once its long prompts stopped arriving, and until
the next burst does not hold the forecast floor a second time), at most `maxReplicasPerStep` removed per
step (unset: one, and no limit once a burst has ended and nothing waits), scale-up limited to max(+4,
+100%) per step except in panic (need >= panicThreshold x ready: jump, and no scale-down until the panic
has been quiet for `panic_hold_seconds`). Replicas still starting count as supply, so a tick never
re-orders what is already on its way; while long prompts arrive, and once they stopped arriving, those
the need has not wanted for a minute are released (the windows keep ready replicas, not a first
estimate's order).
Missing, stale or unreachable metrics hold; partial metrics can scale up but never down. A
cold-start-aware hold (`burst_hold`) keeps the capacity of bursts that recur within max(scale-down
window, 3 x time-to-ready) of each other, from a rate window after each one's start, and of a burst of
chat from the first: shorter than a cold start, such bursts are served only by replicas already there.
A scale-down prices each measured replica by its resident KV (`removal_costs`), so the operator can
have the replicas holding the least work removed first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from m3fleet.api.models import AutoscalingMode, AutoscalingSpec, MiniMaxM3DeploymentSpec, Plan
from m3fleet.autoscaling.forecast import Bounds, Forecast, ScheduleWindow, bounds_at, forecast_floor, parse_hhmm
from m3fleet.autoscaling.readiness import epoch
from m3fleet.autoscaling.signals import FleetState, Histogram, MetricsSnapshot, ReplicaSignals
from m3fleet.text import tokens as format_tokens

# Prefill throughput prior, prompt tokens per second per GPU at long context (a stand-in for a
# measured profile; UNVERIFIED). Multi-node replicas lose some of it to inter-node traffic.
PREFILL_TOKENS_PER_GPU_SECOND: Final[Mapping[str, float]] = {"h200": 5000.0, "gb200": 11000.0, "mi355x": 9000.0}
MULTI_NODE_EFFICIENCY: Final = 0.85
HPA_SCALE_UP_PODS: Final = 4  # HPA default scale-up policy: max(+4 pods, +100%) per period
SMOOTHING_SECONDS: Final = 120.0  # EWMA time constant of the arrival estimates
LEVEL_JUMP: Final = 2.0  # a rate this many times the estimate is a burst, a prompt length this many times less its end
SHIFT: Final = 4.0  # resident tokens per request this many times the prompt estimate: long prompts arrived
SHIFT_EVIDENCE: Final = 3  # running requests needed before their resident tokens can signal a shift
# Prefills within the rate window needed before a rise in the prompt estimate is taken at once just after a
# burst: the mean of fewer heavy-tailed long prompts is noise (one 1M-token prompt among three doubles it), and
# taking every noisy rise at once ratchets the estimate up to its largest sample.
RISE_EVIDENCE: Final = 5
DEFAULT_SCALE_DOWN_PER_STEP: Final = 1  # replicas a tick removes when the spec sets no limit (but see _scale_down_step)
RISE_WINDOWS: Final = 4  # rate windows after a burst's start in which rises are taken at once, queue or not
LEARNING_SECONDS: Final = 3600.0  # each tick forgets elapsed/this of the learned bound; a longer gap all of it
LEARNED_AFTER: Final = 3  # saturated observations before the learned throughput replaces the prior
LEARN_CLAMP: Final = 4.0  # the learned throughput stays within [prior / 4, prior x 4]
# The engines observe a request's prompt length when it finishes, its TTFT at its first token: once a burst of long
# prompts ends, the prompt histogram still fills with its long requests finishing while the TTFTs are chat's.
# A finished mean this many times the mean prompt of the requests that reached a first token (the prompt-token
# and first-token counters) says the two histograms saw different requests: the replica teaches nothing then.
FINISHED_PROMPT_SKEW: Final = 2.0
# A replica still starting is released only below the highest need the window recorded this long ago: tick to tick
# the estimates are noisy, and a replica released and ordered again a tick later starts its cold start over.
RELEASE_STARTING_AFTER_SECONDS: Final = 60.0
WEEKDAYS: Final = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
# A gateway records request sizes in bytes (spec.autoscaling.gateway). Until the fleet has measured its own ratio
# (gateway bytes over the prompt tokens the engines prefilled, while nothing queues), about 4 bytes of request per
# prompt token: English text and the request's JSON (UNVERIFIED prior; code and CJK text run lower).
BYTES_PER_TOKEN_PRIOR: Final = 4.0
BYTES_PER_TOKEN_BOUNDS: Final = (1.0, 16.0)
BYTES_PER_TOKEN_SECONDS: Final = 600.0  # EWMA time constant of the measured ratio
# The gateway's arrivals over the last two samples this many times those over the rate window: a burst is starting,
# and the last samples, not the window that still averages in the minute before it, say how large it is.
GATEWAY_JUMP: Final = 2.0
GATEWAY_WARMING_UP: Final = "not yet used"  # status while a gateway's series cover less than a rate window
# The reason's note on a tick whose scale-down window forgot a burst (so it may scale down inside the window).
WINDOW_RELEASED: Final = "long prompts stopped arriving: the scale-down window forgets the burst"


# A recorded burst: (start, replicas the need recommended for it, whether its prompts stayed chat-sized).
BurstRecord = tuple[float, int, bool]


class Shift(StrEnum):
    """How the arriving prompt mix changed this tick (see `_prompt_estimate`)."""

    NONE = "none"
    BURST = "burst"  # long prompts started arriving
    ENDED = "ended"  # far shorter prompts arrive and no long request is resident: long prompts stopped


class Action(StrEnum):
    SCALE_UP = "scale-up"
    SCALE_DOWN = "scale-down"
    HOLD = "hold"


@dataclass(frozen=True)
class PolicyConfig:
    """Everything the policy needs from the spec and the plan, as plain numbers."""

    kv_tokens_per_replica: float
    kv_tokens_per_rank: float
    ranks_per_replica: int
    max_model_len: int
    prefill_tokens_per_second: float  # per replica
    min_replicas: int = 1
    max_replicas: int = 4
    mode: str = AutoscalingMode.ACT.value
    interval_seconds: float = 15.0
    kv_target: float = 0.8
    # Prefill utilisation to plan for. None derives it from the TTFT objective (slack + factor x the
    # unloaded prefill time t): prompts queueing for one prefill at a time (as the engines run them) wait
    # on average about t/(1-u) in all (M/M/1; less if they are all one length), so u <= 1 - t/(slack +
    # factor t), times a safety margin for the tail, capped. Long prompts land near 1/3, chat near the cap.
    prefill_target: float | None = None
    ttft_slack_seconds: float = 2.0
    ttft_factor: float = 1.5
    prefill_safety: float = 0.85
    prefill_target_cap: float = 0.6
    tolerance: float = 0.1
    scale_up_window_seconds: float = 0.0
    scale_down_window_seconds: float = 300.0
    # None: DEFAULT_SCALE_DOWN_PER_STEP, and no limit once a burst has ended and nothing waits (`_scale_down_step`).
    max_scale_down_per_step: int | None = None
    panic_threshold: float = 2.0
    panic_hold_seconds: float = 120.0
    cold_start_seconds: float = 600.0
    stale_after_seconds: float = 60.0
    default_prompt_tokens: float = 2048.0
    default_output_tokens: float = 256.0
    # Whether a gateway in front of the engines holds requests until a replica has room (then any
    # replica, a new one included, can take a backlog). Without one, requests are dispatched at
    # arrival and wait in the engine they were sent to. spec.autoscaling.gateway says what a gateway
    # records, not that it holds requests (the Inference Extension's picker dispatches at arrival): off.
    gateway_holds_requests: bool = False
    # Cold-start-aware hold: once demand has come back at once (a burst) within the hold window of an
    # earlier one, keep the capacity the smaller of the two bursts needed until a hold window passes
    # without another; a burst of chat (more requests, not longer ones) is held from the first. Window =
    # max(scale-down window, burst_hold_cold_starts x time-to-ready): a replica removed and needed again
    # within it costs a whole cold start of misses.
    burst_hold: bool = True
    burst_hold_cold_starts: float = 3.0
    # An engine-reported KV capacity further than this share from the plan's is reported (status and an
    # Event) and not trusted: the smaller of the two is used.
    capacity_margin: float = 0.2
    # Learn each replica's prefill throughput from its own counters (prompt tokens per second while it
    # has a queue, i.e. while prefill is the bottleneck); the prior stands until LEARNED_AFTER samples.
    learn_prefill: bool = True
    fast_rise: bool = True  # just after a burst's start, rises in the estimates are taken at once
    transient_release: bool = True  # the scale-down window remembers the need without backlogs
    release_ended_bursts: bool = True  # the window forgets a burst once its long prompts stopped arriving
    # A long prompt: its TTFT is mostly prefill (shorter ones teach the throughput nothing), a queue of them
    # outlasts a chat prompt's TTFT objective, and while they arrive a burst's size is still being measured.
    long_prompt_tokens: float = 20_000.0
    # An optimistic prior is capped at this multiple of the idle-replica bound (or at the busy bound). The
    # idle bound understates a replica sharing its prefill by about 1 - utilisation; the busy bound is
    # tight when it is loaded, and the best bound seen (the learned floor) keeps a right prior from being
    # cut. At 2.0 a prior 2x too fast still planned at ~1.7x the truth and lost up to 6 points.
    learn_slack: float = 1.25
    forecast: bool = True
    # The forecast looks this much further than time-to-ready + one tick: a daily peak does not come back
    # at the same second, and replicas ready a little early cost less than a cold start of misses.
    forecast_margin_seconds: float = 300.0
    forecast_period_seconds: float = 86400.0  # the period `demand_history` reads back (spec forecast.periodSeconds)
    schedule: tuple[ScheduleWindow, ...] = ()

    @classmethod
    def from_spec(cls, autoscaling: AutoscalingSpec, plan: Plan, **overrides: Any) -> PolicyConfig:
        gpus = plan.gpus_per_replica
        per_gpu = PREFILL_TOKENS_PER_GPU_SECOND.get(str(plan.accelerator), PREFILL_TOKENS_PER_GPU_SECOND["h200"])
        efficiency = MULTI_NODE_EFFICIENCY if plan.nodes_per_replica > 1 else 1.0
        values: dict[str, Any] = {
            "kv_tokens_per_replica": float(plan.kv_cache_tokens_per_replica),
            "kv_tokens_per_rank": float(plan.kv_cache_tokens_per_rank),
            "ranks_per_replica": max(1, plan.data_parallel_size),
            "max_model_len": plan.max_model_len,
            "prefill_tokens_per_second": per_gpu * gpus * efficiency,
            "min_replicas": autoscaling.min_replicas,
            "max_replicas": autoscaling.max_replicas,
            "mode": str(autoscaling.mode),
            "interval_seconds": float(autoscaling.interval_seconds),
            "kv_target": autoscaling.target.kv_cache_utilization,
            "tolerance": autoscaling.tolerance,
            "scale_up_window_seconds": float(autoscaling.behavior.scale_up.stabilization_window_seconds),
            "scale_down_window_seconds": float(autoscaling.behavior.scale_down.stabilization_window_seconds),
            "max_scale_down_per_step": autoscaling.behavior.scale_down.max_replicas_per_step,
            "panic_threshold": autoscaling.panic_threshold,
            "cold_start_seconds": float(autoscaling.cold_start_seconds),
            "stale_after_seconds": max(60.0, 4.0 * autoscaling.interval_seconds),
            "forecast": autoscaling.forecast.enabled,
            "forecast_margin_seconds": float(autoscaling.forecast.margin_seconds),
            "forecast_period_seconds": float(autoscaling.forecast.period_seconds),
            "schedule": tuple(
                ScheduleWindow(
                    name=w.name,
                    start_minute=parse_hhmm(w.start),
                    end_minute=parse_hhmm(w.end),
                    min_replicas=w.min_replicas or None,
                    max_replicas=w.max_replicas or None,
                    days=tuple(WEEKDAYS.index(str(d)) for d in w.days),
                )
                for w in autoscaling.schedule
            ),
        }
        values.update(overrides)
        return cls(**values)

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))

    def forecast_look_ahead(self, time_to_ready: float | None) -> float:
        """How far ahead the forecast reads the earlier periods (give it to `demand_history`)."""
        return (time_to_ready or self.cold_start_seconds) + self.interval_seconds + self.forecast_margin_seconds

    def bounds(self, now: float) -> Bounds:
        """min/max at `now`, with the scheduled windows in force."""
        return bounds_at(now, self.min_replicas, self.max_replicas, self.schedule)

    def prefill_utilisation(self, prompt_tokens: float, per_replica: float | None = None) -> float:
        """Target prefill utilisation for prompts of this length (see `prefill_target`), at a replica
        throughput of `per_replica` prompt tokens/s (the prior when None)."""
        if self.prefill_target is not None:
            return self.prefill_target
        t = prompt_tokens / (per_replica or self.prefill_tokens_per_second)
        allowed = 1.0 - t / self.ttft_objective_seconds(t)
        return max(0.05, min(self.prefill_target_cap, self.prefill_safety * allowed))

    def ttft_objective_seconds(self, unloaded_prefill_seconds: float) -> float:
        """The TTFT a prompt is planned to meet: slack + factor x its unloaded prefill time."""
        return self.ttft_slack_seconds + self.ttft_factor * unloaded_prefill_seconds


# --- state that survives between ticks --------------------------------------------------------


@dataclass(frozen=True)
class PolicyState:
    """Stabilization history, panic deadline, the arrival estimates, recent bursts; small and JSON-serializable."""

    history: tuple[tuple[float, int], ...] = ()  # (time, recommendation), only entries a window can use
    panic_until: float | None = None
    last_time: float | None = None
    in_flight: tuple[tuple[float, float], ...] = ()  # (time, running + waiting) over the last rate window
    request_rate: float | None = None  # arriving requests/s, smoothed
    prompt_tokens: float | None = None  # mean prompt length of arriving requests, smoothed
    bursts: tuple[BurstRecord, ...] = ()  # the last two bursts (see `_record_burst`)
    prefill_rate: float | None = None  # learned prompt tokens/s one replica prefills (saturated)
    prefill_samples: int = 0  # saturated observations behind it
    burst_ended: float | None = None  # when long prompts last stopped arriving (None once a burst came since)
    bytes_per_token: float | None = None  # measured gateway request bytes per prompt token (spec.autoscaling.gateway)
    gateway_jump: float | None = None  # when the gateway's arrivals last jumped (a burst's start)
    gateway_since: float | None = None  # since when the gateway's series have answered (None: they do not)

    def to_dict(self) -> dict[str, Any]:
        return {
            "history": [[t, n] for t, n in self.history],
            "panicUntil": self.panic_until,
            "lastTime": self.last_time,
            "inFlight": [[t, n] for t, n in self.in_flight],
            "requestRate": self.request_rate,
            "promptTokens": self.prompt_tokens,
            "bursts": [[t, n, chat] for t, n, chat in self.bursts],
            "prefillRate": self.prefill_rate,
            "prefillSamples": self.prefill_samples,
            "burstEnded": self.burst_ended,
            "bytesPerToken": self.bytes_per_token,
            "gatewayJump": self.gateway_jump,
            "gatewaySince": self.gateway_since,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PolicyState:
        """Tolerant: anything malformed (a hand-edited annotation, an old format) starts afresh."""
        if not isinstance(data, Mapping):
            return cls()
        try:
            history = tuple((float(t), int(n)) for t, n in data.get("history") or ())
            bursts = tuple(_burst_record(b) for b in data.get("bursts") or ())
            return cls(
                history=history,
                panic_until=_opt_float(data.get("panicUntil")),
                last_time=_opt_float(data.get("lastTime")),
                in_flight=tuple((float(t), float(n)) for t, n in data.get("inFlight") or ()),
                request_rate=_opt_float(data.get("requestRate")),
                prompt_tokens=_opt_float(data.get("promptTokens")),
                bursts=bursts,
                prefill_rate=_opt_float(data.get("prefillRate")),
                prefill_samples=int(data.get("prefillSamples") or 0),
                burst_ended=_opt_float(data.get("burstEnded")),
                bytes_per_token=_opt_float(data.get("bytesPerToken")),
                gateway_jump=_opt_float(data.get("gatewayJump")),
                gateway_since=_opt_float(data.get("gatewaySince")),
            )
        except (TypeError, ValueError):
            return cls()


def _burst_record(data: Sequence[Any]) -> BurstRecord:
    """[start, replicas, chat]; a record from before the chat flag ([start, replicas]) is no chat burst."""
    start, replicas, *chat = data
    return float(start), int(replicas), bool(chat and chat[0] is True)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


# --- the decision ----------------------------------------------------------------------------

MEASURED = "measured: p90 of the last replicas to become ready"
PRIOR = "prior: spec.autoscaling.coldStartSeconds (no replica measured yet)"


@dataclass(frozen=True)
class Decision:
    time: float
    mode: str
    action: Action
    desired_replicas: int
    current_replicas: int
    recommended_replicas: int  # before stabilization and step limits
    reason: str
    terms: dict[str, float] = field(default_factory=dict)
    panic: bool = False
    unservable_requests: int = 0
    bounds: Bounds | None = None  # min/max in force (the schedule applied)
    forecast: tuple[int, str] | None = None  # (floor, why) from the resource's own history
    capacity: dict[str, Any] = field(default_factory=dict)  # KV capacity: plan, reported, used, mismatch
    prefill: dict[str, Any] = field(default_factory=dict)  # prefill throughput: prior, learned, used
    # The time-to-ready the horizon is built on, and where it came from ("measured" or "prior").
    time_to_ready: tuple[float, str] | None = None
    # Warnings for Events: (reason, message), e.g. ("KVCapacityMismatch", ...). The operator emits each
    # when it first appears (compare with the previous status's `warnings`).
    warnings: tuple[tuple[str, str], ...] = ()
    # On a scale-down: each measured replica's cost of removal (its resident KV tokens), so the replicas holding
    # the least work go first; the operator hands it to a Deployment's ReplicaSet as POD_DELETION_COST.
    removal_costs: dict[str, int] = field(default_factory=dict)

    @property
    def applied(self) -> bool:
        """True when the operator should write `desired_replicas` (act mode and a change)."""
        return self.mode == AutoscalingMode.ACT.value and self.desired_replicas != self.current_replicas

    def to_status(self) -> dict[str, Any]:
        """`status.autoscaling`: the last decision, every term, the reason, the time."""
        return {
            "mode": self.mode,
            "action": self.action.value,
            "desiredReplicas": self.desired_replicas,
            "currentReplicas": self.current_replicas,
            "recommendedReplicas": self.recommended_replicas,
            "applied": self.applied,
            "panic": self.panic,
            "unservableRequests": self.unservable_requests,
            "reason": self.reason,
            "time": datetime.fromtimestamp(self.time, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "terms": {k: _round(v) for k, v in self.terms.items()},
            **(
                {
                    "bounds": {
                        "minReplicas": self.bounds.min_replicas,
                        "maxReplicas": self.bounds.max_replicas,
                        "schedule": list(self.bounds.windows),
                    }
                }
                if self.bounds is not None
                else {}
            ),
            **({"forecast": {"replicas": self.forecast[0], "reason": self.forecast[1]}} if self.forecast else {}),
            **({"capacity": self.capacity} if self.capacity else {}),
            **({"prefillThroughput": self.prefill} if self.prefill else {}),
            **(
                {"timeToReady": {"seconds": _round(self.time_to_ready[0]), "source": self.time_to_ready[1]}}
                if self.time_to_ready
                else {}
            ),
            "warnings": [{"reason": r, "message": m} for r, m in self.warnings],
        }


def _round(value: float) -> float:
    return round(value, 3) if math.isfinite(value) else 0.0


# --- HPA behaviour, shared with the baselines --------------------------------------------------


@dataclass(frozen=True)
class Behavior:
    """HPA `behavior`: stabilization windows and per-step limits (None = unlimited, HPA's 100%)."""

    scale_up_window_seconds: float = 0.0
    scale_down_window_seconds: float = 300.0
    max_scale_down_per_step: int | None = None
    limit_scale_up: bool = True  # max(+4, +100%) per step


def recommend(need: float, current: int, tolerance: float) -> int:
    """HPA's tolerance band: no change while need/current is within `tolerance` of 1."""
    if current > 0 and abs(need / current - 1.0) <= tolerance:
        return current
    return max(0, math.ceil(need - 1e-9))


def prune_history(
    history: Sequence[tuple[float, int]], now: float, up_window: float, down_window: float
) -> tuple[tuple[float, int], ...]:
    """Keep only entries a window can still use: a newer, higher (lower) one supersedes for max (min)."""
    kept: list[tuple[float, int]] = []
    later_max, later_min = -math.inf, math.inf
    for t, n in reversed(history):
        age = now - t
        if (age <= down_window and n > later_max) or (age <= up_window and n < later_min):
            kept.append((t, n))
        later_max, later_min = max(later_max, n), min(later_min, n)
    return tuple(reversed(kept))


def stabilize(
    history: Sequence[tuple[float, int]],
    now: float,
    recommendation: int,
    current: int,
    behavior: Behavior,
    hold_down: bool = False,
) -> tuple[int, tuple[tuple[float, int], ...]]:
    """HPA's normalizeDesiredReplicasWithBehaviors: (desired, new history)."""
    up_w, down_w = behavior.scale_up_window_seconds, behavior.scale_down_window_seconds
    entries = [*history, (now, recommendation)]
    up_rec = min(n for t, n in entries if now - t <= up_w)
    down_rec = max(n for t, n in entries if now - t <= down_w)
    desired = current
    if up_rec > current:
        desired = up_rec
        if behavior.limit_scale_up:
            desired = min(desired, max(current + HPA_SCALE_UP_PODS, 2 * current))
    elif down_rec < current and not hold_down:
        desired = down_rec
        if behavior.max_scale_down_per_step is not None:
            desired = max(desired, current - behavior.max_scale_down_per_step)
    return desired, prune_history(entries, now, up_w, down_w)


# --- the policy ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Health:
    fresh: tuple[ReplicaSignals, ...]
    missing: int  # ready replicas without fresh metrics
    hold: str | None  # reason to hold, when nothing can be decided


def _health(config: PolicyConfig, snapshot: MetricsSnapshot, fleet: FleetState) -> _Health:
    if snapshot.error:
        return _Health((), fleet.ready_replicas, f"metrics unavailable ({snapshot.error})")
    if fleet.now - snapshot.time > config.stale_after_seconds:
        age = fleet.now - snapshot.time
        return _Health((), fleet.ready_replicas, f"metrics snapshot is {age:.0f}s old")
    fresh = tuple(
        r
        for r in snapshot.replicas
        if r.up
        and r.has_load_gauges()
        and r.sample_time is not None
        and snapshot.time - r.sample_time <= config.stale_after_seconds
    )
    missing = max(0, fleet.ready_replicas - len(fresh))
    if fleet.ready_replicas > 0 and not fresh:
        return _Health(fresh, missing, f"no fresh metrics from any of the {fleet.ready_replicas} ready replicas")
    if fleet.ready_replicas == 0:
        starting = fleet.starting_replicas
        return _Health(fresh, 0, f"no ready replica to measure ({starting} starting)")
    return _Health(fresh, missing, None)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _sum(values: Sequence[float | None]) -> float:
    return sum(v for v in values if v is not None)


@dataclass(frozen=True)
class _Terms:
    values: dict[str, float]
    need: float
    dominant: str
    request_rate: float
    prompt_tokens: float
    in_flight: tuple[tuple[float, float], ...]
    unservable: int
    burst: bool  # demand arrived at a new level at once this tick (see _rate_estimate, _prompt_estimate)
    long_prompts_ended: bool  # long prompts stopped arriving this tick (see _prompt_estimate)
    capacity: _Capacity
    prefill_rate: float | None  # the learned prefill throughput to keep
    prefill_samples: int
    prefill: dict[str, Any]
    bytes_per_token: float | None  # the measured gateway ratio to keep
    gateway_jump: float | None
    gateway_since: float | None


@dataclass(frozen=True)
class _Capacity:
    replica: float  # KV tokens per replica the policy plans with
    rank: float  # KV tokens per KV pool (DP rank, or the TP group)
    status: dict[str, Any]
    warning: str | None


def _capacity(config: PolicyConfig, fresh: Sequence[ReplicaSignals]) -> _Capacity:
    """The engines' reported capacity where it agrees with the plan within `capacity_margin`; otherwise the
    smaller of the two, and a warning (a mis-combined per-rank series or an engine configured unlike the
    plan must not silently size the fleet)."""
    plan_cap, plan_rank = config.kv_tokens_per_replica, config.kv_tokens_per_rank
    status: dict[str, Any] = {"planTokensPerReplica": round(plan_cap), "planTokensPerRank": round(plan_rank)}
    reported = [r.kv_capacity_tokens for r in fresh if r.kv_capacity_tokens]
    if not reported:
        return _Capacity(plan_cap, plan_rank, {**status, "source": "plan"}, None)
    seen = _median(reported)
    ranks = [r.kv_capacity_tokens_per_rank for r in fresh if r.kv_capacity_tokens_per_rank]
    seen_rank = _median(ranks) if ranks else plan_rank * seen / plan_cap
    ratio, rank_ratio = seen / plan_cap, seen_rank / plan_rank
    status.update(reportedTokensPerReplica=round(seen), reportedTokensPerRank=round(seen_rank), ratio=round(ratio, 3))
    margin = config.capacity_margin
    if abs(ratio - 1.0) <= margin and abs(rank_ratio - 1.0) <= margin:
        return _Capacity(seen, seen_rank, {**status, "source": "engines", "mismatch": False}, None)
    message = (
        f"engines report {format_tokens(seen)} KV tokens per replica ({format_tokens(seen_rank)} per rank), "
        f"{ratio:.2f}x the plan's {format_tokens(plan_cap)} ({format_tokens(plan_rank)} per rank), "
        f"more than {margin:.0%} apart: planning with the smaller; "
        "check the engine's memory and KV-dtype flags against the plan, and the metrics' labels"
    )
    return _Capacity(
        min(seen, plan_cap),
        min(seen_rank, plan_rank),
        {**status, "source": "smaller of plan and engines", "mismatch": True, "message": message},
        message,
    )


def _learned_prefill(
    config: PolicyConfig, state: PolicyState, fresh: Sequence[ReplicaSignals], elapsed: float | None
) -> tuple[float, float | None, int, dict[str, Any]]:
    """(throughput to plan with, learned value to keep, samples, status).

    Learned from the engines' own counters and histograms, on replicas serving long prompts (for chat, the first
    decode step and scheduling dominate TTFT). Two lower bounds of a replica's prefill throughput: the prompt tokens
    it prefilled per second (it cannot go faster; tight when it is busy), and mean prompt / mean (TTFT - queue time)
    (a request's prefill alone is at least its prompt over the throughput; the engines prefill one prompt at a time,
    after its queue time, so only decode steps sharing its iterations slow it; a replica whose finished requests are
    far longer than those reaching a first token is skipped, FINISHED_PROMPT_SKEW). Their best over replicas is kept
    and lifts a pessimistic prior. It is forgotten as time passes, whether or not long prompts arrive (a new image
    or shape may be slower): each tick keeps 1 - elapsed/LEARNING_SECONDS of it, so yesterday's bound, kept in
    status overnight, is gone at today's first tick and the prior stands again until LEARNED_AFTER new observations.
    It also caps an optimistic prior: that is used at most up to the busy bound, or `learn_slack` x the idle bound
    (a loaded replica's TTFT understates its speed). Clamped to [prior / LEARN_CLAMP, prior x LEARN_CLAMP]; nothing
    changes before LEARNED_AFTER observations."""
    prior = config.prefill_tokens_per_second
    learned, samples = state.prefill_rate, state.prefill_samples
    cap: float | None = None

    def clamp(value: float) -> float:
        return min(LEARN_CLAMP * prior, max(prior / LEARN_CLAMP, value))

    if learned is not None and elapsed is not None:
        learned *= 1.0 - min(1.0, elapsed / LEARNING_SECONDS)
        if learned <= 0.0:
            learned, samples = None, 0
    if config.learn_prefill:
        floors, caps = [], []
        for r in fresh:
            p, t, q = r.prompt_tokens, r.ttft_seconds, r.queue_seconds
            if p is None or t is None or p.count < 3 or t.count < 3:
                continue
            mean_prompt = p.total / p.count
            if mean_prompt < config.long_prompt_tokens:
                continue
            first_token_prompt = _ratio(r.prompt_tokens_rate or 0.0, r.first_token_rate or 0.0)
            if first_token_prompt is not None and mean_prompt > FINISHED_PROMPT_SKEW * first_token_prompt:
                continue  # long requests finishing after a burst, divided by chat's TTFTs, would overstate the speed
            if q is None and (r.waiting or 0.0) > 0:
                continue  # no queue-time histogram and a queue now: the window holds the backlog's waits
            waited = q.total / q.count if q is not None and q.count > 0 else 0.0
            prefill = t.total / t.count - waited
            if prefill <= 0:
                continue
            idle, busy = mean_prompt / prefill, r.prompt_tokens_rate or 0.0
            floors.append(max(idle, busy))
            caps.append(max(config.learn_slack * idle, busy))
        if floors:
            observed = clamp(max(floors))
            learned = observed if learned is None else max(observed, learned)
            cap = clamp(max(caps))
            samples += 1
    used = prior
    if learned is not None and samples >= LEARNED_AFTER:
        used = max(min(prior, cap if cap is not None else prior), learned)
    status = {
        "priorTokensPerSecond": round(prior),
        "learnedTokensPerSecond": None if learned is None else round(learned),
        "samples": samples,
        "source": "prior" if used == prior else "learned",
    }
    return used, learned, samples, status


def _pairing_bins(items: Sequence[float], bin_size: float) -> float:
    """Bins the long items need: > 1/2 bin each alone, (1/3, 1/2] two per bin; monotone in sizes."""
    large = sum(1 for s in items if s > bin_size / 2)
    medium = sum(1 for s in items if bin_size / 3 < s <= bin_size / 2)
    return large + math.ceil(medium / 2)


@dataclass(frozen=True)
class _Load:
    """What the fresh replicas report, summed over them."""

    resident: float  # KV tokens held
    running: float
    waiting: float
    prompt_rate: float  # prompt tokens prefilled per second
    generation_rate: float
    finished_rate: float
    histogram: Histogram | None  # prompt lengths of finished requests

    @classmethod
    def of(cls, fresh: Sequence[ReplicaSignals], plan_capacity: float) -> _Load:
        return cls(
            resident=_sum([r.used_tokens(plan_capacity) for r in fresh]),
            running=_sum([r.running for r in fresh]),
            waiting=_sum([r.waiting for r in fresh]),
            prompt_rate=_sum([r.prompt_tokens_rate for r in fresh]),
            generation_rate=_sum([r.generation_tokens_rate for r in fresh]),
            finished_rate=_sum([r.finished_rate for r in fresh]),
            histogram=Histogram.merge(r.prompt_tokens for r in fresh),
        )


@dataclass(frozen=True)
class _Arrivals:
    """What a gateway saw arrive (spec.autoscaling.gateway), in prompt tokens; the fields to keep in the state."""

    requests: float | None = None  # requests/s (None: no gateway, or its series answered nothing)
    prompt_tokens: float | None = None  # prompt tokens/s
    recent_prompt: float | None = None  # mean prompt tokens of the requests in the last two samples
    jumped: bool = False  # the last two samples are a new level (see _gateway_arrivals): a burst is starting
    rising: bool = False  # within RISE_WINDOWS rate windows of a jump: rises are taken at once
    bytes_per_token: float | None = None  # measured, to keep
    jump_time: float | None = None  # when the arrivals last jumped, to keep
    since: float | None = None  # since when the gateway's series have answered, to keep
    status: dict[str, Any] | None = None


def _gateway_arrivals(
    state: PolicyState,
    snapshot: MetricsSnapshot,
    fleet: FleetState,
    fresh: Sequence[ReplicaSignals],
    load: _Load,
    elapsed: float | None,
) -> _Arrivals:
    """The gateway's arrivals in prompt tokens: its request bytes over the measured bytes per token. The ratio is
    measured while every ready replica is fresh and nothing queues (then what arrived in the rate window is what
    the engines prefilled in it), smoothed over BYTES_PER_TOKEN_SECONDS; the prior stands until then. The last
    two samples replace the rate window when they are GATEWAY_JUMP times above it and SHIFT times what the estimate
    says arrives: a burst's start."""
    g = snapshot.gateway
    measured = state.bytes_per_token
    if g is None or g.request_rate is None or g.bytes_rate is None:
        return _Arrivals(bytes_per_token=measured, jump_time=state.gateway_jump)
    # Series that began less than a rate window ago under-read over it (Prometheus scales the increase it covers
    # to the whole window) while their last two samples do not: a gateway just started would read as a jump, and
    # its bytes per token as a fraction of what they are. The engines decide until the window is covered.
    since = state.gateway_since if state.gateway_since is not None else fleet.now
    if fleet.now - since < snapshot.window_seconds:
        window = (
            f"{GATEWAY_WARMING_UP}: its series have answered for {fleet.now - since:.0f}s of the "
            f"{snapshot.window_seconds:.0f}s rate window"
        )
        status = _gateway_status(measured, window=window)
        return _Arrivals(bytes_per_token=measured, jump_time=state.gateway_jump, since=since, status=status)
    # Per request on each side (bytes per arriving request over prompt tokens per first token), not rate over rate:
    # a counter that covers only part of the window (a replica or a gateway just started) under-reads its requests
    # as much as its bytes or tokens, so the ratio of means stays right where the ratio of rates would not.
    # Nor while the last two samples are GATEWAY_JUMP times off the rate window either way: what arrives is changing,
    # and the engines are still prefilling what arrived before (a burst's first tick would teach its bytes per chat
    # token).
    first_tokens = [r.first_token_rate for r in fresh]
    prefilled = None if None in first_tokens else _ratio(load.prompt_rate, _sum(first_tokens))
    arriving = _ratio(g.bytes_rate, g.request_rate)
    recent = g.recent_bytes_rate
    settled = recent is None or g.bytes_rate / GATEWAY_JUMP < recent < GATEWAY_JUMP * g.bytes_rate
    if len(fresh) >= fleet.ready_replicas and load.waiting == 0 and settled and prefilled and arriving:
        low, high = BYTES_PER_TOKEN_BOUNDS
        sample = min(high, max(low, arriving / prefilled))
        weight = 1.0 if measured is None or elapsed is None else min(1.0, elapsed / BYTES_PER_TOKEN_SECONDS)
        measured = sample if measured is None else measured + weight * (sample - measured)
    ratio = measured if measured is not None else BYTES_PER_TOKEN_PRIOR
    recent_requests, recent_bytes = g.recent_request_rate, g.recent_bytes_rate
    # A jump is a new level, not a busy quarter-minute of one already there (heavy-tailed prompts arrive in
    # clumps): SHIFT times what the estimate says arrives, as well as GATEWAY_JUMP times the rate window.
    estimate = (state.request_rate or 0.0) * (state.prompt_tokens or 0.0) * ratio
    jumped = (
        recent_bytes is not None
        and recent_bytes > 0
        and recent_bytes >= GATEWAY_JUMP * g.bytes_rate
        and recent_bytes >= SHIFT * estimate
    )
    requests, size = (recent_requests or 0.0, recent_bytes or 0.0) if jumped else (g.request_rate, g.bytes_rate)
    jump_time = fleet.now if jumped else state.gateway_jump
    return _Arrivals(
        requests=requests,
        prompt_tokens=size / ratio,
        recent_prompt=recent_bytes / ratio / recent_requests if recent_bytes is not None and recent_requests else None,
        jumped=jumped,
        rising=jump_time is not None and fleet.now - jump_time < RISE_WINDOWS * snapshot.window_seconds,
        bytes_per_token=measured,
        jump_time=jump_time,
        since=since,
        status=_gateway_status(
            measured,
            arrivingPromptTokensPerSecond=round(size / ratio),
            window="last two samples (a jump)" if jumped else "rate window",
        ),
    )


def _gateway_status(measured: float | None, **rest: Any) -> dict[str, Any]:
    """`status.autoscaling.prefillThroughput.gateway`: the bytes per token planned with and where they came from."""
    ratio = measured if measured is not None else BYTES_PER_TOKEN_PRIOR
    return {"bytesPerToken": round(ratio, 2), "source": "measured" if measured is not None else "prior", **rest}


def _arriving_prompt_length(
    config: PolicyConfig,
    state: PolicyState,
    load: _Load,
    fresh: Sequence[ReplicaSignals],
    since_burst: float | None,
    window: float,
    elapsed: float | None,
    rising: bool,
    arrivals: _Arrivals,
) -> tuple[float, Shift]:
    """(mean prompt tokens of arriving requests, how their mix changed). With a gateway, what it saw arrive: a
    burst when SHIFT times the estimate, else smoothed as below (rises taken at once just after a jump). Without,
    prompt tokens per first token of recent prefills. The router sends new requests to replicas without a queue, so
    theirs describe what arrives now; a replica with a queue prefills what arrived before (its ratio describes its
    own queue, see `_queued_prompt_tokens`). Within a rate window of a burst the ratio still mixes in the old
    regime. See `_prompt_estimate`."""
    per_running = _ratio(load.resident, load.running)
    recent = load.histogram.quantile(0.9) if load.histogram else None
    if arrivals.requests and arrivals.prompt_tokens is not None:
        seen, previous = arrivals.prompt_tokens / arrivals.requests, state.prompt_tokens
        if previous is not None and seen >= SHIFT * previous:
            return seen, Shift.BURST
        # A fall is the long prompts' end only when the last two samples show it too: just after a burst starts,
        # the rate window still averages in the minute before it.
        ended = arrivals.recent_prompt is not None and (
            previous is None or LEVEL_JUMP * arrivals.recent_prompt <= previous
        )
        return _prompt_estimate(
            previous,
            seen,
            ended,
            per_running,
            load.running,
            recent,
            elapsed,
            arrivals.jumped or ((rising or arrivals.rising) and config.fast_rise),
        )
    unqueued = [r for r in fresh if not r.waiting and r.first_token_rate]
    side = unqueued or fresh
    observed = (
        _ratio(_sum([r.prompt_tokens_rate for r in side]), _sum([r.first_token_rate for r in side]))
        or per_running
        or (load.histogram.mean() if load.histogram else None)
        or config.default_prompt_tokens
    )
    settled = since_burst is None or since_burst >= window
    prefills = _sum([r.first_token_rate for r in side]) * window
    return _prompt_estimate(
        state.prompt_tokens,
        observed,
        bool(unqueued) and settled,
        per_running,
        load.running,
        recent,
        elapsed,
        rising and config.fast_rise and prefills >= RISE_EVIDENCE,
    )


def _queued_prompt_tokens(fresh: Sequence[ReplicaSignals], prompt_tokens: float) -> list[float]:
    """Prompt tokens waiting in each engine's queue. An engine's queue (FCFS) holds requests from the era it
    is prefilling now, or newer ones."""
    return [
        (r.waiting or 0.0) * max(prompt_tokens, _ratio(r.prompt_tokens_rate or 0.0, r.first_token_rate or 0.0) or 0.0)
        for r in fresh
    ]


@dataclass(frozen=True)
class _KvTerm:
    replicas: float
    demand: float  # KV tokens wanted within the horizon
    weight: float  # share of the queue that turns over into the KV within the horizon
    growth: float  # tokens the running requests still decode


def _kv_term(
    config: PolicyConfig, load: _Load, queued: float, output: float, capacity: float, horizon: float
) -> _KvTerm:
    """Resident tokens, plus queued tokens weighted by KV turnover within the horizon (Little's law), plus
    the running requests' decode growth, at the KV target."""
    growth = load.running * output / 2.0
    turnover = load.resident / load.prompt_rate if load.prompt_rate > 0 else horizon
    weight = min(1.0, turnover / horizon)
    demand = load.resident + weight * queued + growth
    return _KvTerm(demand / (config.kv_target * capacity), demand, weight, growth)


def _bin_term(
    config: PolicyConfig, load: _Load, local: Sequence[float], gateway: Sequence[float], weight: float, bin_size: float
) -> tuple[float, int]:
    """(replicas, long requests): long requests resident at once (running, plus the queue weighted as in
    the KV term), their sizes from the prompt-length mix (a bucket's geometric middle), plus the gateway's
    own requests. The mix is of finished requests (it lags by their lifetime): it can say which sizes run,
    not that more long requests run than the resident and weighted queued tokens can hold."""
    items = list(gateway)
    hist = load.histogram
    if hist is not None and hist.observations() > 0:
        concurrent = load.running + weight * load.waiting
        mix: list[float] = []
        for lower, upper, n in hist.buckets():
            top = min(upper, float(config.max_model_len))
            size = math.sqrt(lower * top) if lower > 0 else top
            if n > 0 and size > bin_size / 3:
                mix.extend([size] * math.floor(concurrent * n / hist.observations() + 0.5))
        fits = math.floor((load.resident + weight * sum(local)) / (bin_size / 3))
        items.extend(sorted(mix, reverse=True)[:fits])
    large = sum(1 for s in items if s > bin_size / 3)
    return _pairing_bins(items, bin_size) / config.ranks_per_replica, large


@dataclass(frozen=True)
class _PrefillTerm:
    replicas: float
    arrival_replicas: float  # what the arriving load itself needs
    backlog_replicas: float  # replicas kept busy by queues
    arrivals: float  # prompt tokens arriving per second
    request_rate: float
    burst: bool
    per_replica: float
    utilisation: float
    in_flight: tuple[tuple[float, float], ...]


def _blocks_new_arrivals(config: PolicyConfig, queued_tokens: float, waiting: float, objective_tokens: float) -> bool:
    """Whether an engine's queue is of long prompts (at least `long_prompt_tokens` each on average)
    and holds more prompt tokens than it prefills within the arriving prompt's TTFT objective."""
    long_prompts = waiting > 0 and queued_tokens / waiting >= config.long_prompt_tokens
    return long_prompts and queued_tokens > objective_tokens


def _prefill_term(
    config: PolicyConfig,
    state: PolicyState,
    fresh: Sequence[ReplicaSignals],
    fleet: FleetState,
    load: _Load,
    local: Sequence[float],
    at_gateway: float,
    prompt_tokens: float,
    per_replica: float,
    window: float,
    elapsed: float | None,
    rising: bool,
    horizon: float,
    gateway: _Arrivals,
) -> _PrefillTerm:
    """Arriving prompt tokens at the target utilisation, plus the replicas kept busy by backlogs.
    Arrivals: requests finishing plus the growth of those in flight (conservation) times the prompt
    length, smoothed over two minutes (one tick's delta is noise). Not the prefilled rate: a backlog
    drains faster than requests arrive. With a gateway, the requests it saw arrive."""
    in_flight = _window(state.in_flight, fleet.now, load.running + load.waiting, window)
    leaving = [r.finished_rate if r.finished_rate is not None else r.first_token_rate for r in fresh]
    if gateway.requests is not None:  # measured as requests arrive: a rise just after a jump is taken at once
        rising_now = gateway.jumped or ((rising or gateway.rising) and config.fast_rise)
        rate, burst = _rate_estimate(state.request_rate, gateway.requests, elapsed, rising_now)
    elif any(v is not None for v in leaving):
        observed = _request_rate(_sum(leaving), in_flight)
        if _warming_up(state.in_flight, fleet.now, window):
            rate, burst = observed, False  # a rate window not yet seen: rising from nothing is no burst
        else:
            rate, burst = _rate_estimate(state.request_rate, observed, elapsed, rising and config.fast_rise)
    else:  # no rate yet (a replica's first scrape): keep what we had, do not learn "zero"
        rate, burst = state.request_rate or 0.0, False
    arrivals = rate * prompt_tokens
    # Until the replicas already starting are ready (they count as supply), arrivals beyond what the
    # ready ones prefill pile up: at the gateway when it holds requests (any replica drains it), else
    # in the ready engines' queues. A request queued in an engine waits for that engine (no router
    # moves it), so a queue keeps its replica busy for up to the horizon and never needs more than
    # that one replica: new replicas only help with what arrives after they are ready.
    pileup = horizon
    if fleet.starting_remaining:
        pileup = min(horizon, max(0.0, min(fleet.starting_remaining)))
    elif fleet.starting_ages:
        pileup = min(horizon, max(0.0, horizon - config.interval_seconds - min(fleet.starting_ages)))
    excess = max(0.0, arrivals - fleet.ready_replicas * per_replica) * pileup
    drain = per_replica * horizon  # prompt tokens one replica prefills within the horizon
    if config.gateway_holds_requests:
        at_gateway += excess
        excess = 0.0
    # With one prefill at a time, a new request sent to an engine waits behind its whole queue. A queue of
    # long prompts that takes longer than the arriving prompt's TTFT objective to prefill makes its replica
    # useless to new arrivals, whatever share of the horizon it takes: it counts as a whole replica. A
    # queue of chat requests turns over in seconds and counts by its share, as before.
    objective_tokens = config.ttft_objective_seconds(prompt_tokens / per_replica) * per_replica
    busy = sum(
        1.0
        if _blocks_new_arrivals(config, tokens, replica.waiting or 0.0, objective_tokens)
        else min(1.0, (tokens + excess / len(fresh)) / drain)
        for tokens, replica in zip(local, fresh, strict=True)
    )
    utilisation = config.prefill_utilisation(prompt_tokens, per_replica)
    arrival_replicas = arrivals / (utilisation * per_replica)
    return _PrefillTerm(
        arrival_replicas + busy + at_gateway / drain,
        arrival_replicas,
        busy + at_gateway / drain,
        arrivals,
        rate,
        burst,
        per_replica,
        utilisation,
        in_flight,
    )


def _terms(
    config: PolicyConfig,
    state: PolicyState,
    health: _Health,
    snapshot: MetricsSnapshot,
    fleet: FleetState,
    horizon: float,
) -> _Terms:
    """The three needs (KV, long-request bins, prefill) and the numbers behind them; the largest wins."""
    now, fresh = fleet.now, health.fresh
    checked = _capacity(config, fresh)
    capacity, rank_capacity = checked.replica, checked.rank
    bin_size = config.kv_target * rank_capacity
    load = _Load.of(fresh, config.kv_tokens_per_replica)

    elapsed = now - state.last_time if state.last_time is not None and now > state.last_time else None
    since_burst = now - state.bursts[-1][0] if state.bursts else None
    # Within one horizon of a burst's start the new level is still being measured: rises are taken at
    # once (the replicas ordered now arrive one time-to-ready later, too late for a slow estimate). After
    # RISE_WINDOWS rate windows, only while requests queue: the fleet is still behind the burst and what
    # its replicas report still lags it. Without a queue the windows have seen only the new level, and a
    # rise taken at once is the noise of a steady one, ratcheted up and then held by the scale-down window.
    window = snapshot.window_seconds
    rising = (
        since_burst is not None and since_burst < horizon and (since_burst < RISE_WINDOWS * window or load.waiting > 0)
    )
    arrivals = _gateway_arrivals(state, snapshot, fleet, fresh, load, elapsed)
    isl, prompt_shift = _arriving_prompt_length(
        config, state, load, fresh, since_burst, window, elapsed, rising, arrivals
    )
    output = _ratio(load.generation_rate, load.finished_rate) or config.default_output_tokens

    gateway = [float(t) for t in snapshot.queued_request_tokens]
    unservable = sum(1 for t in gateway if t > rank_capacity)
    servable_gateway = [t for t in gateway if t <= rank_capacity]
    local = _queued_prompt_tokens(fresh, isl)
    queued = sum(local) + sum(servable_gateway)

    kv = _kv_term(config, load, queued, output, capacity, horizon)
    bin_replicas, large = _bin_term(config, load, local, servable_gateway, kv.weight, bin_size)
    per_replica, learned, samples, prefill_status = _learned_prefill(config, state, fresh, elapsed)
    prefill = _prefill_term(
        config,
        state,
        fresh,
        fleet,
        load,
        local,
        sum(servable_gateway),
        isl,
        per_replica,
        window,
        elapsed,
        rising,
        horizon,
        arrivals,
    )
    if arrivals.status is not None:
        prefill_status = {**prefill_status, "gateway": arrivals.status}

    candidates = {"kv": kv.replicas, "bin": bin_replicas, "prefill": prefill.replicas}
    dominant = max(candidates, key=lambda k: candidates[k])
    values = {
        "kvReplicas": kv.replicas,
        "binReplicas": bin_replicas,
        "prefillReplicas": prefill.replicas,
        "needReplicas": candidates[dominant],
        # The need without the replicas kept busy by backlogs: what the arriving load itself needs. The
        # forecast records this (a backlog is a symptom of the last cold start, not demand to pre-provision).
        "demandReplicas": max(
            (load.resident + kv.growth) / (config.kv_target * capacity), bin_replicas, prefill.arrival_replicas
        ),
        "kvDemandTokens": kv.demand,
        "residentTokens": load.resident,
        "queuedPromptTokens": queued,
        "queueWeight": kv.weight,
        "decodeGrowthTokens": kv.growth,
        "kvTokensPerReplica": capacity,
        "binTokens": bin_size,
        "longRequests": float(large),
        "promptTokensPerRequest": isl,
        "outputTokensPerRequest": output,
        "arrivingPromptTokensPerSecond": prefill.arrivals,
        "prefillTokensPerSecondPerReplica": per_replica,
        "prefillUtilisationTarget": prefill.utilisation,
        "prefillArrivalReplicas": prefill.arrival_replicas,
        "prefillBacklogReplicas": prefill.backlog_replicas,
        "runningRequests": load.running,
        "waitingRequests": load.waiting,
        "horizonSeconds": horizon,
        "freshReplicas": float(len(fresh)),
    }
    return _Terms(
        values=values,
        need=candidates[dominant],
        dominant=dominant,
        request_rate=prefill.request_rate,
        prompt_tokens=isl,
        in_flight=prefill.in_flight,
        unservable=unservable,
        burst=prefill.burst or prompt_shift == Shift.BURST,
        long_prompts_ended=prompt_shift == Shift.ENDED,
        capacity=checked,
        prefill_rate=learned,
        prefill_samples=samples,
        prefill=prefill_status,
        bytes_per_token=arrivals.bytes_per_token,
        gateway_jump=arrivals.jump_time,
        gateway_since=arrivals.since,
    )


def _smooth(previous: float | None, observed: float, elapsed: float | None) -> float:
    """EWMA over SMOOTHING_SECONDS (the first observation is taken as it is)."""
    if previous is None or elapsed is None:
        return observed
    return previous + min(1.0, elapsed / SMOOTHING_SECONDS) * (observed - previous)


def _rate_estimate(
    previous: float | None, observed: float, elapsed: float | None, rising: bool = False
) -> tuple[float, bool]:
    """(requests/s, burst): smoothed, but a rise by LEVEL_JUMP or more is a burst, taken at once (and any
    rise while `rising`: just after a burst)."""
    if previous is not None and elapsed is not None and observed >= LEVEL_JUMP * previous:
        return observed, True
    if rising and previous is not None and observed > previous:
        return observed, False
    return _smooth(previous, observed, elapsed), False


def _prompt_estimate(
    previous: float | None,
    observed: float,
    arrival_side: bool,
    per_running: float | None,
    running: float,
    recent: float | None,
    elapsed: float | None,
    rising: bool = False,
) -> tuple[float, Shift]:
    """(mean prompt tokens of arriving requests, how the prompt mix changed this tick).

    `observed` is prompt tokens per first token, measured on replicas without a queue when
    `arrival_side`; `per_running` is resident tokens per running request; `recent` is a high
    quantile of the prompts finished in the histogram window. Smoothed, except:

    * a fall by LEVEL_JUMP or more is taken at once when measured on the arrival side and no
      long requests are resident any more: long prompts stopped arriving (ENDED; the stabilization
      window then forgets what they needed, see `_stabilized`);
    * resident tokens per running request SHIFT times above both the estimate and what finished
      recently means long prompts started arriving: taken at once (a burst). It is length-biased and,
      with a full KV cache, one or two requests decide it, so it needs SHIFT_EVIDENCE of them.
    """
    if previous is None or elapsed is None:
        return observed, Shift.NONE
    long_resident = per_running is not None and per_running > SHIFT * observed
    shift = Shift.NONE
    if LEVEL_JUMP * observed <= previous and arrival_side and not long_resident:
        estimate, shift = observed, Shift.ENDED
    elif rising and observed > previous:
        estimate = observed
    else:
        estimate = _smooth(previous, observed, elapsed)
    if (
        per_running is not None
        and running >= SHIFT_EVIDENCE
        and per_running > SHIFT * max(previous, recent or 0.0)
        and per_running > estimate
    ):
        return per_running, Shift.BURST
    return estimate, shift


def _window(
    history: tuple[tuple[float, float], ...], now: float, value: float, window: float
) -> tuple[tuple[float, float], ...]:
    """Append (now, value) and keep what covers the last `window` seconds (plus the entry before it)."""
    entries = [*((t, v) for t, v in history if t < now), (now, value)]
    while len(entries) > 2 and now - entries[1][0] >= window:
        entries.pop(0)
    return tuple(entries)


def _warming_up(in_flight: tuple[tuple[float, float], ...], now: float, window: float) -> bool:
    """Whether there is no current estimate to jump from: a new fleet has seen less than a rate window (its
    rates are partial and the finishes lag the arrivals, so the first full window looks like a jump), and
    after a gap longer than a window (the operator down, say) the estimate is of another time."""
    return not in_flight or now - in_flight[0][0] < window or now - in_flight[-1][0] > window


def _request_rate(leaving: float, in_flight: tuple[tuple[float, float], ...]) -> float:
    """Requests/s arriving = leaving + growth of those in flight over the window (conservation)."""
    (t0, n0), (t1, n1) = in_flight[0], in_flight[-1]
    return max(0.0, leaving + (n1 - n0) / (t1 - t0)) if t1 > t0 else leaving


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 and numerator > 0 else None


def _explain(terms: _Terms) -> str:
    v = terms.values
    if terms.dominant == "prefill":
        detail = (
            f"prefill needs {v['prefillReplicas']:.2f} replicas ({format_tokens(v['arrivingPromptTokensPerSecond'])}/s "
            f"prompt tokens arriving, {format_tokens(v['queuedPromptTokens'])} queued, "
            f"{format_tokens(v['prefillTokensPerSecondPerReplica'])}/s per replica)"
        )
    elif terms.dominant == "bin":
        detail = (
            f"{v['longRequests']:.0f} long requests need {v['binReplicas']:.2f} replicas "
            f"(each over a third of a {format_tokens(v['binTokens'])}-token rank)"
        )
    else:
        detail = (
            f"KV demand {format_tokens(v['kvDemandTokens'])} tokens needs {v['kvReplicas']:.2f} replicas "
            f"of {format_tokens(v['kvTokensPerReplica'])}"
        )
    if terms.unservable:
        detail += f"; {terms.unservable} queued requests exceed any replica's KV and are not scaled on"
    return detail


def decide(
    config: PolicyConfig, state: PolicyState, snapshot: MetricsSnapshot, fleet: FleetState
) -> tuple[Decision, PolicyState]:
    """One tick: the decision and the state to keep for the next tick."""
    now, current = fleet.now, fleet.current_replicas
    # The horizon: the measured time-to-ready (the operator's p90 of the last replicas to become ready),
    # and the spec's coldStartSeconds only until a replica has been measured.
    measured = fleet.time_to_ready_seconds is not None
    time_to_ready = (
        fleet.time_to_ready_seconds if fleet.time_to_ready_seconds is not None else config.cold_start_seconds
    )
    horizon = time_to_ready + config.interval_seconds
    ttr = (time_to_ready, MEASURED if measured else PRIOR)
    panic_active = state.panic_until is not None and now < state.panic_until
    health = _health(config, snapshot, fleet)
    bounds = config.bounds(now)

    def clamp(n: int) -> int:
        return max(bounds.min_replicas, min(bounds.max_replicas, n))

    if health.hold is not None:
        desired = clamp(current)
        reason = f"hold: {health.hold}; never scale down without metrics"
        if desired != current:
            reason = f"{health.hold}; only the min/max bounds apply ({current} -> {desired})"
        hold_terms = {"horizonSeconds": horizon, "freshReplicas": float(len(health.fresh))}
        decision = _decision(
            config, fleet, desired, desired, reason, bounds, panic_active, terms=hold_terms, time_to_ready=ttr
        )
        return decision, replace(state, last_time=None, in_flight=())

    terms = _terms(config, state, health, snapshot, fleet, horizon)
    notes: list[str] = []
    if bounds.windows:
        notes.append(f"schedule {', '.join(bounds.windows)} in force: {bounds.min_replicas}-{bounds.max_replicas}")
    floors = _floors(config, state, snapshot, terms, bounds, current, (now, horizon, time_to_ready), notes)
    recommendation = floors.recommendation
    if health.missing:
        # Held, not recommended: a replica that just became ready has no scrape yet, and recording
        # `current` would keep the whole scale-down window at today's count.
        notes.append(f"{health.missing} ready replicas have no fresh metrics: no scale-down")
    if terms.capacity.warning:
        notes.append("KV capacity reported unlike the plan (see capacity)")
    sparse = sum(1 for r in health.fresh if r.scrapes_in_window is not None and r.scrapes_in_window < 2)
    if sparse:
        window = snapshot.window_seconds
        notes.append(
            f"{sparse} replicas have fewer than two scrapes in the {window:.0f}s rate window, so their token and "
            f"request rates are unknown: scrape engine pods every {window / 2:.0f}s or less, or raise "
            "spec.autoscaling.prometheus.rateWindowSeconds to 4x the scrape interval"
        )

    if _forgets_burst(config, terms) and state.history:
        notes.append(WINDOW_RELEASED)
    panic_until = state.panic_until if panic_active else None
    if terms.need >= config.panic_threshold * max(1, fleet.ready_replicas):
        panic_until = now + config.panic_hold_seconds
    panic = panic_until is not None
    burst_ended = _burst_ended(config, state, terms, now)
    desired, history = _stabilized(
        config, state, fleet, floors, terms, burst_ended, panic or health.missing > 0, not panic
    )
    released, why = _unneeded_starting(config, state, fleet, terms, desired, recommendation, health.missing)
    if released:
        desired -= released
        notes.append(f"{released} starting replicas released: {why}")
    desired = clamp(desired)  # the bounds are hard, whatever the step limits say

    if panic:
        notes.append(f"panic (need >= {config.panic_threshold}x ready) until t={panic_until:.0f}")
    held_by = "panic" if panic else "missing metrics" if health.missing else None
    verb = _verb(config, current, desired, recommendation, round(terms.need), held_by)
    reason = f"{verb}: {_explain(terms)}" + "".join(f"; {n}" for n in notes)

    warnings = (("KVCapacityMismatch", terms.capacity.warning),) if terms.capacity.warning else ()
    decision = _decision(
        config,
        fleet,
        desired,
        recommendation,
        reason,
        bounds,
        panic,
        terms=terms.values,
        unservable_requests=terms.unservable,
        forecast=None if floors.forecast is None else (floors.forecast.replicas, floors.forecast.reason),
        capacity=terms.capacity.status,
        prefill=terms.prefill,
        time_to_ready=ttr,
        warnings=warnings,
        removal_costs=removal_costs(health.fresh, terms.capacity.replica) if desired < current else {},
    )
    new_state = PolicyState(
        history=history,
        panic_until=panic_until,
        last_time=now,
        in_flight=terms.in_flight,
        request_rate=terms.request_rate,
        prompt_tokens=terms.prompt_tokens,
        bursts=floors.bursts,
        prefill_rate=terms.prefill_rate,
        prefill_samples=terms.prefill_samples,
        burst_ended=burst_ended,
        bytes_per_token=terms.bytes_per_token,
        gateway_jump=terms.gateway_jump,
        gateway_since=terms.gateway_since,
    )
    return decision, new_state


@dataclass(frozen=True)
class _Floors:
    """The recommendation after the floors under it: the forecast from the resource's own history and the
    cold-start hold for bursts that recur."""

    recommendation: int
    forecast: Forecast | None
    bursts: tuple[BurstRecord, ...]
    burst_floor: int
    bounds: Bounds


def _floors(
    config: PolicyConfig,
    state: PolicyState,
    snapshot: MetricsSnapshot,
    terms: _Terms,
    bounds: Bounds,
    current: int,
    when: tuple[float, float, float],
    notes: list[str],
) -> _Floors:
    """`when`: now, the horizon and the time-to-ready. Says in `notes` which floor raised the recommendation."""
    now, horizon, time_to_ready = when

    def clamp(n: int) -> int:
        return max(bounds.min_replicas, min(bounds.max_replicas, n))

    recommendation = clamp(recommend(terms.need, current, config.tolerance))
    # A burst is recorded with what it needed, not with the forecast floor under it: a chat blip at a floor of 6
    # paired with the burst that followed would hold 6 replicas a whole hold window after the floor fell.
    needed = recommendation
    forecast = forecast_floor(snapshot.demand_history, config.tolerance) if config.forecast else None
    if forecast is not None:
        terms.values["forecastReplicas"] = float(forecast.replicas)
        if forecast.replicas > recommendation:
            recommendation = clamp(forecast.replicas)
            notes.append(f"forecast floor {recommendation}: {forecast.reason}")
    hold_window = max(config.scale_down_window_seconds, config.burst_hold_cold_starts * time_to_ready)
    # A burst's need is recorded from a rate window after its start (within the horizon, which can be short).
    lasting = min(snapshot.window_seconds, horizon / 2)
    chat = terms.prompt_tokens < config.long_prompt_tokens
    bursts = _record_burst(state.bursts, now, terms.burst, needed, horizon, hold_window, lasting, chat)
    floor, why = _burst_floor(bursts, now, hold_window) if config.burst_hold else (0, "")
    terms.values["burstHoldReplicas"] = float(floor)
    if floor > recommendation:
        recommendation = clamp(floor)
        notes.append(f"holding {recommendation} replicas: {why} (cold-start hold)")
    return _Floors(recommendation, forecast, bursts, floor, bounds)


def _forgets_burst(config: PolicyConfig, terms: _Terms) -> bool:
    """Whether this tick's scale-down window forgets what it remembered: long prompts stopped arriving."""
    return terms.long_prompts_ended and config.release_ended_bursts


def _burst_ended(config: PolicyConfig, state: PolicyState, terms: _Terms, now: float) -> float | None:
    """When today's last burst ended (its long prompts stopped arriving); None once a new burst came since."""
    if _forgets_burst(config, terms):
        return now
    return None if terms.burst else state.burst_ended


def _scale_down_step(config: PolicyConfig, terms: _Terms, burst_ended: float | None) -> int | None:
    """Most replicas one tick removes (None: no limit). The spec's limit when it sets one. Else one a tick,
    except once today's burst has ended (its long prompts stopped arriving, see `_burst_ended`) and no request
    waits: the replicas the burst needed serve nothing any more, and shrinking one a tick kept most of them for
    as many ticks (on `long-context-burst` at 90 s, 20 replicas took five minutes to go). While requests wait
    the end may be a lull inside the burst (its estimate fell for a tick): one a tick, as before."""
    if config.max_scale_down_per_step is not None:
        return config.max_scale_down_per_step
    if burst_ended is not None and not terms.values["waitingRequests"]:
        return None
    return DEFAULT_SCALE_DOWN_PER_STEP


def _stabilized(
    config: PolicyConfig,
    state: PolicyState,
    fleet: FleetState,
    floors: _Floors,
    terms: _Terms,
    burst_ended: float | None,
    hold_down: bool,
    limit_scale_up: bool,
) -> tuple[int, tuple[tuple[float, int], ...]]:
    """HPA's stabilization and step limits over the recommendation: (replicas, the history to keep)."""
    now, current, recommendation = fleet.now, fleet.current_replicas, floors.recommendation
    behavior = Behavior(
        scale_up_window_seconds=config.scale_up_window_seconds,
        scale_down_window_seconds=config.scale_down_window_seconds,
        max_scale_down_per_step=_scale_down_step(config, terms, burst_ended),
        limit_scale_up=limit_scale_up,
    )
    history_in = state.history
    if _forgets_burst(config, terms):
        # Long prompts stopped arriving and none is resident: the window's memory of what they needed goes
        # with them (what still decodes drains on the replicas being removed).
        history_in = ()
    elif not history_in and config.scale_down_window_seconds > config.scale_up_window_seconds:
        # A first tick (or a restart without saved state): as if `current` had just been recommended,
        # so nothing is removed before a whole scale-down window of evidence exists.
        history_in = ((now - config.scale_up_window_seconds - 1e-6, current),)
    desired, history = stabilize(history_in, now, recommendation, current, behavior, hold_down=hold_down)
    if config.transient_release and history and history[-1][0] == now:
        # What the stabilization window remembers: the recommendation without the replicas kept busy
        # by backlogs. A backlog is drained by the replicas it is queued on within a horizon, so the
        # extra replicas ordered for it must not hold for a whole scale-down window after it is gone;
        # the panic hold covers the backlog's own life. Nor, once today's burst has ended, the forecast
        # floor: it still holds while the earlier days' burst lasted, but the window must not hold it a
        # second time after it falls. Until then the window keeps it, a margin when the measured need is
        # wrong (a prior off by 2x): forgetting it during a burst cost the priors check 5 development and 9
        # held-out seeds.
        steady = config.clamp(recommend(terms.values["demandReplicas"], current, config.tolerance))
        forecast = floors.forecast.replicas if floors.forecast is not None else 0
        if burst_ended is not None:
            forecast = 0
        steady = max(steady, forecast, floors.burst_floor, floors.bounds.min_replicas)
        # Pruned with the value recorded, not the recommendation: a higher recommendation would supersede
        # (and drop) earlier entries that the lower value recorded does not.
        recorded = (now, min(recommendation, max(steady, 1)))
        history = prune_history(
            (*history_in, recorded), now, behavior.scale_up_window_seconds, behavior.scale_down_window_seconds
        )
    return desired, history


def _unneeded_starting(
    config: PolicyConfig,
    state: PolicyState,
    fleet: FleetState,
    terms: _Terms,
    desired: int,
    recommendation: int,
    missing: int,
) -> tuple[int, str]:
    """(replicas still starting to release, why): those the windows (or the panic hold) keep but the need has not
    wanted for a minute (`RELEASE_STARTING_AFTER_SECONDS`), while long prompts arrive or once they stopped
    arriving. A long-context burst is first ordered on its first minute of prompt lengths and, until a replica has
    been measured, the prior throughput; both are revised within a few ticks, and a replica ordered on the first
    estimate would serve nothing until ready and then hold GPUs for a whole window. Once long prompts stopped
    arriving (a tick ago or more, and the estimate still says chat), a replica still starting for them serves
    nothing: a lone long prompt, taken for a burst's start, is served long before the replicas it ordered are
    ready, and the panic hold would keep them for its whole length. Ready replicas keep the windows' protection.
    Chat bursts keep it for starting replicas too: shorter than a cold start, they recur, and the replica still
    starting serves the next one (releasing them cost `bursty` up to 22 points a seed)."""
    if missing:
        return 0, ""
    long_prompts = terms.prompt_tokens >= config.long_prompt_tokens
    if not long_prompts and state.burst_ended is None:
        return 0, ""  # chat, and no long prompts have come and gone since the last burst
    if (
        long_prompts
        and state.burst_ended is not None
        and fleet.now - state.burst_ended < RELEASE_STARTING_AFTER_SECONDS
    ):
        return 0, ""  # the window just forgot a burst: it holds no minute of needs to release against
    recent = [n for t, n in state.history if fleet.now - t <= RELEASE_STARTING_AFTER_SECONDS]
    why = (
        "long prompts arriving, the need revised down for a minute" if long_prompts else "long prompts stopped arriving"
    )
    return max(0, desired - max(recommendation, *recent, fleet.ready_replicas)), why


def _record_burst(
    bursts: tuple[BurstRecord, ...],
    now: float,
    burst: bool,
    needed: int,
    horizon: float,
    window: float,
    lasting: float,
    chat: bool,
) -> tuple[BurstRecord, ...]:
    """The last two bursts as (start, replicas the need recommended from `lasting` after it until one horizon
    after it, whether the prompt estimate said chat throughout that horizon); a burst detected within the horizon
    of the previous one is the same burst. What a burst needs in its first `lasting` seconds is not recorded: a
    lone long prompt looks like a burst's start for a tick or two, is served within a rate window and leaves
    nothing to hold, while a burst still needs its replicas then. Dropped once two windows old (too old to pair
    with a new one)."""
    kept = [b for b in bursts if now - b[0] <= 2 * window]
    if kept and now - kept[-1][0] <= horizon:
        start, most, was_chat = kept[-1]
        kept[-1] = (start, max(most, needed) if now - start >= lasting else most, was_chat and chat)
    elif burst:
        kept.append((now, 0, chat))
    return tuple(kept[-2:])


def _burst_floor(bursts: tuple[BurstRecord, ...], now: float, window: float) -> tuple[int, str]:
    """(replicas to hold, why) while the last burst is within `window` of now. Of two bursts within `window`
    of each other, what both needed: demand that recurs faster than it pays to release and cold-start again.
    Of a chat burst (a jump in requests, not in their length), what it needed even the first time: such bursts
    last minutes, shorter than a cold start, so the replicas one orders are ready when it has passed, and only
    replicas kept from it serve the next (`bursty`: the second burst of a seed came ten seconds after the
    window had released the first one's replica). A long-context burst lasts long enough to be served by the
    replicas it orders; once its long prompts stop, they leave."""
    if not bursts or now - bursts[-1][0] > window:
        return 0, ""
    _, n1, chat = bursts[-1]
    recurring = min(bursts[0][1], n1) if len(bursts) == 2 and bursts[1][0] - bursts[0][0] <= window else 0
    if chat and n1 > recurring:
        return n1, f"a burst of chat came {now - bursts[-1][0]:.0f}s ago and may recur within {window:.0f}s"
    return recurring, f"bursts recurred within {window:.0f}s" if recurring else ""


# Read by the ReplicaSet controller when it picks the pods a scale-down deletes: the lowest cost goes first
# (an integer in a string; an unannotated pod counts 0). Not-ready pods go before any ready one whatever it says.
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
INT32_MAX = 2**31 - 1


def removal_costs(fresh: Sequence[ReplicaSignals], plan_capacity: float) -> dict[str, int]:
    """What removing each measured replica costs: the KV tokens resident on it, i.e. the work a drain must finish
    or cut short. The replica holding the least goes first, as the simulator drains; left to itself the ReplicaSet
    deletes the newest ready pod, whatever it holds."""
    costs: dict[str, int] = {}
    for replica in fresh:
        resident = replica.used_tokens(plan_capacity)
        if resident is not None:
            costs[replica.replica] = min(INT32_MAX, max(0, round(resident)))
    return costs


def replicas_to_apply(spec: MiniMaxM3DeploymentSpec, status: Mapping[str, Any]) -> int:
    """spec.replicas, unless the built-in autoscaler acts: then its last decision (GitOps keeps spec)."""
    scaling = spec.autoscaling
    if not scaling.enabled or scaling.mode != AutoscalingMode.ACT:
        return spec.replicas
    decided = (status.get("autoscaling") or {}).get("desiredReplicas")
    count = int(decided) if isinstance(decided, int | float) else spec.replicas
    return max(scaling.min_replicas, min(scaling.max_replicas, count))


# A decision that changes nothing is still recorded this often, so the terms shown stay current.
RECORD_HEARTBEAT_SECONDS = 300.0


def worth_recording(previous: Mapping[str, Any], decision: Mapping[str, Any], now: float) -> bool:
    """Record when what is decided changes (the reason's numbers drift every tick and do not count), or the
    horizon's source (the first measured time-to-ready), and otherwise at most every RECORD_HEARTBEAT_SECONDS, so
    the terms shown stay current without a write per tick."""
    if not previous:
        return True
    keys = ("desiredReplicas", "action", "mode", "panic", "applied")
    if any(previous.get(k) != decision.get(k) for k in keys):
        return True
    if bool(previous.get("unservableRequests")) != bool(decision.get("unservableRequests")):
        return True
    if (previous.get("timeToReady") or {}).get("source") != (decision.get("timeToReady") or {}).get("source"):
        return True  # the horizon went from the prior to a measurement
    if _gateway_use(previous) != _gateway_use(decision):
        return True  # a gateway's series came into use, or its bytes per token were first measured
    if _held_without_metrics(previous) != _held_without_metrics(decision):
        return True  # the metrics went away (status must say so while it holds) or came back
    last = epoch(previous.get("time"))
    return last is None or now - last >= RECORD_HEARTBEAT_SECONDS


def _held_without_metrics(record: Mapping[str, Any]) -> bool:
    """Whether a recorded decision held for want of metrics (it has no need computed from them)."""
    return "needReplicas" not in (record.get("terms") or {})


def _gateway_use(record: Mapping[str, Any]) -> tuple[Any, bool]:
    """(bytes-per-token source, whether the series are used yet) of a recorded decision's gateway status."""
    gateway = (record.get("prefillThroughput") or {}).get("gateway") or {}
    return gateway.get("source"), not str(gateway.get("window", "")).startswith(GATEWAY_WARMING_UP)


def _decision(
    config: PolicyConfig,
    fleet: FleetState,
    desired: int,
    recommended: int,
    reason: str,
    bounds: Bounds,
    panic: bool,
    **details: Any,
) -> Decision:
    """The one place a Decision is made: what is common to holding and to deciding on the terms."""
    return Decision(
        time=fleet.now,
        mode=config.mode,
        action=_action(desired, fleet.current_replicas),
        desired_replicas=desired,
        current_replicas=fleet.current_replicas,
        recommended_replicas=recommended,
        reason=_mode_prefix(config, reason),
        panic=panic,
        bounds=bounds,
        **details,
    )


def _verb(config: PolicyConfig, current: int, desired: int, recommendation: int, need: int, held_by: str | None) -> str:
    """What the tick does, and what held back a recommendation it does not follow."""
    if desired > current:
        return f"scale-up {current} -> {desired}"
    if desired < current:
        return f"scale-down {current} -> {desired}"
    if recommendation == current:
        return f"hold at {current}" + (" (within tolerance)" if need != current else "")
    if recommendation < current:
        by = held_by or f"the {config.scale_down_window_seconds:.0f}s stabilization window"
        return f"hold at {current}: scale-down to {recommendation} held by {by}"
    return f"hold at {current}: scale-up to {recommendation} held by the scale-up window"


def _action(desired: int, current: int) -> Action:
    if desired > current:
        return Action.SCALE_UP
    if desired < current:
        return Action.SCALE_DOWN
    return Action.HOLD


def _mode_prefix(config: PolicyConfig, reason: str) -> str:
    return f"advisory (not applied): {reason}" if config.mode == AutoscalingMode.ADVISORY.value else reason

"""Typed engine signals: what the Prometheus adapters read, the policy decides on, the simulator emits.

One vocabulary for all three so the simulator cannot feed the policy anything a real adapter could
not produce. Everything here is plain data (pure, no I/O); times are Unix seconds.

Engine-neutral units: tokens, requests, seconds. Rates are per second over the adapter's window;
histograms hold the observations made *during* the window (Prometheus `increase(..._bucket[w])`),
so "prompt tokens" describes requests that *finished* in the window — a lagging view by design.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

# Adapter windows (Prometheus `rate(...[60s])`, `increase(..._bucket[300s])`); the simulator uses the same.
RATE_WINDOW_SECONDS = 60.0
HISTOGRAM_WINDOW_SECONDS = 300.0
# vLLM's TTFT buckets (vllm/v1/metrics/loggers.py); +inf is implied after the last.
TTFT_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)


def one_two_five_buckets(maximum: float) -> tuple[float, ...]:
    """vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, ... up to `maximum` (prompt-length buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = float(mantissa * 10**exponent)
            if value > maximum:
                return tuple(out)
            out.append(value)
        exponent += 1


@dataclass(frozen=True)
class Histogram:
    """Observations over a window: cumulative counts per upper bound (ascending, +inf last)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    total: float = 0.0
    count: float = 0.0

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.cumulative):
            raise ValueError("histogram bounds and counts differ in length")

    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def buckets(self) -> list[tuple[float, float, float]]:
        """(lower, upper, observations) per bucket; counter resets can make a delta negative: clamp."""
        out: list[tuple[float, float, float]] = []
        lower, previous = 0.0, 0.0
        for upper, cum in zip(self.bounds, self.cumulative, strict=True):
            out.append((lower, upper, max(0.0, cum - previous)))
            lower, previous = upper, max(previous, cum)
        return out

    def observations(self) -> float:
        return max(self.cumulative[-1], self.count) if self.cumulative else self.count

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket holding the q-quantile (the last finite bound for +inf); None if empty."""
        total = self.cumulative[-1] if self.cumulative else 0.0
        if total <= 0:
            return None
        finite = [b for b in self.bounds if math.isfinite(b)]
        for bound, cum in zip(self.bounds, self.cumulative, strict=True):
            if cum >= q * total:
                return bound if math.isfinite(bound) else (finite[-1] if finite else None)
        return finite[-1] if finite else None

    @staticmethod
    def merge(histograms: Iterable[Histogram | None]) -> Histogram | None:
        """Sum histograms with the same bounds (one per replica); others are skipped, not guessed."""
        present = [h for h in histograms if h is not None]
        if not present:
            return None
        bounds = present[0].bounds
        same = [h for h in present if h.bounds == bounds]
        return Histogram(
            bounds=bounds,
            cumulative=tuple(sum(h.cumulative[i] for h in same) for i in range(len(bounds))),
            total=sum(h.total for h in same),
            count=sum(h.count for h in same),
        )


@dataclass(frozen=True)
class ReplicaSignals:
    """One engine replica (a pod, or a multi-node group's leader), aggregated over its DP engines.

    `None` means "not exported / not found", never zero.
    """

    replica: str
    up: bool = True  # the last scrape succeeded
    sample_time: float | None = None  # newest gauge sample (Unix s); staleness is judged against it
    scrapes_in_window: float | None = None  # samples of a gauge within the rate window: rates need two
    kv_usage: float | None = None  # 0..1
    kv_capacity_tokens: float | None = None  # what the engine reports the replica holds (sum over its KV pools)
    kv_capacity_tokens_per_rank: float | None = None  # one KV pool (a DP rank, or the TP group)
    kv_ranks: int | None = None  # KV pools (DP ranks) the replica reported
    kv_used_tokens: float | None = None  # direct token count when the engine exports one (SGLang, TRT-LLM)
    running: float | None = None
    waiting: float | None = None
    prompt_tokens_rate: float | None = None  # prompt tokens prefilled per second
    generation_tokens_rate: float | None = None
    first_token_rate: float | None = None  # requests reaching their first token per second
    finished_rate: float | None = None
    preemption_rate: float | None = None
    prompt_tokens: Histogram | None = None  # prompt lengths of requests finished in the window
    ttft_seconds: Histogram | None = None
    queue_seconds: Histogram | None = None  # time requests waited before being scheduled (their TTFT's queue part)
    # finished requests' engine time from first scheduling to first token (vLLM only): their prefill, with no queue
    # wait and no API-server time, observed at finish like `prompt_tokens`
    prefill_seconds: Histogram | None = None
    itl_seconds: Histogram | None = None  # each finished request's mean seconds per output token after the first
    acceptance_length: float | None = None  # speculative decoding: tokens emitted per target forward pass

    def used_tokens(self, plan_capacity: float) -> float | None:
        """Resident KV tokens: the engine's own count, else usage x the capacity it reports (the plan's if none)."""
        if self.kv_used_tokens is not None:
            return self.kv_used_tokens
        if self.kv_usage is not None:
            return self.kv_usage * (self.kv_capacity_tokens or plan_capacity)
        return None

    def has_load_gauges(self) -> bool:
        return (
            self.running is not None
            and self.waiting is not None
            and (self.kv_usage is not None or self.kv_used_tokens is not None)
        )


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything one adapter read at `time`, or why it could not (`error`)."""

    engine: str
    time: float
    replicas: tuple[ReplicaSignals, ...] = ()
    error: str | None = None
    window_seconds: float = 60.0
    # Token footprints (prompt + max output) of requests queued *upstream*, one per request, when a
    # gateway exports them; empty when unknown (no engine exports per-request sizes).
    queued_request_tokens: tuple[int, ...] = field(default_factory=tuple)
    # The resource's own need in earlier periods (e.g. the same time on previous days), for the
    # forecast floor; None when nothing is recorded yet.
    demand_history: DemandHistory | None = None
    # What a gateway in front of the fleet records as requests arrive (spec.autoscaling.gateway); None without.
    gateway: GatewaySignals | None = None


@dataclass(frozen=True)
class GatewaySignals:
    """Requests arriving at a gateway that records each request's size (bytes) when it arrives, before any
    engine has seen it: the Gateway API Inference Extension's endpoint picker (`inference_objective_request_sizes`).
    The engines count a prompt's tokens only at its first token, so this is the one signal that sizes a burst of
    long prompts while they still wait. Rates in per second; `recent_*` over the last two samples (Prometheus
    `irate`), the others over the adapter's rate window; None where not exported."""

    request_rate: float | None = None
    bytes_rate: float | None = None
    recent_request_rate: float | None = None
    recent_bytes_rate: float | None = None


@dataclass(frozen=True)
class DemandHistory:
    """Replicas this resource needed around the same time in earlier periods (a forecast input).

    `windows[k]` is the largest need (in replicas, before min/max) recorded during
    [now - (k+1) x period, now - (k+1) x period + look_ahead]: what the next `look_ahead` seconds
    needed one, two, ... periods ago. None where nothing was recorded (the operator was not running).
    The operator records its own `needReplicas` (status or its exported gauge) and reads it back
    with an offset; the simulator replays the earlier days it ran.
    """

    period_seconds: float
    look_ahead_seconds: float
    windows: tuple[float | None, ...]


@dataclass(frozen=True)
class FleetState:
    """What the operator knows from Kubernetes, not from Prometheus."""

    now: float
    current_replicas: int  # replicas the workload is set to now (ready + starting)
    ready_replicas: int
    starting_ages: tuple[float, ...] = ()  # seconds since creation of each replica not yet ready
    time_to_ready_seconds: float | None = None  # measured (e.g. p90 create->ready); None = spec's default
    # How long each starting replica still needs, when the pods tell (e.g. image pulled and started:
    # only the engine's load remains); same order as starting_ages. Empty: estimate from the ages.
    starting_remaining: tuple[float, ...] = ()

    @property
    def starting_replicas(self) -> int:
        return len(self.starting_ages)


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty list (the operator's time-to-ready p90, for example)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]

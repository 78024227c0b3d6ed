"""Seeded discrete-event simulation of one deployment under an autoscaler. Pure Python, no clock.

One module of ~900 lines on purpose: the engine, the fleet, the router and the scrapes advance on one event
queue and read each other's state at every event; split, each part would reach into the others' internals.

The engine model (one KV pool per DP rank, `Engine`) is a fluid version of vLLM's scheduler that
stays event-driven, so an hour of traffic runs in well under a second:

* **KV**: capacity in tokens from the plan (x `ENGINE_CAPACITY_FACTOR`, as engines report a little
  less than the arithmetic); a request is admitted FCFS when its whole prompt fits under a 1%
  watermark; decoding grows the KV one token per step; when it is full the newest request is
  preempted and recomputed later (vLLM's recompute preemption).
* **Time**: each iteration runs one decode step for every decoding request and a chunk of at most
  `token_budget` prompt tokens of one prompt at a time, first come, first served: vLLM gives the
  step's budget to the running requests in order (a long prompt takes all of it until it is
  prefilled; `--long-prefill-token-threshold` is unset), SGLang to its one chunked request first,
  so the requests behind it wait (and hold no KV) until it is done. `PerfModel.prefill_discipline` "shared"
  instead shares each step's budget equally among every admitted prompt (processor sharing; see
  `PrefillDiscipline`): the same prefill throughput, short prompts no longer wait behind a long one.
  A mixed iteration costs max(decode step, prefill chunk) — decodes piggyback on compute-bound prefill chunks
  (Sarathi-style). Decode step = a + b x sequences + c x context tokens (MSA's index
  scan grows with context); a prompt token costs linear + quadratic-in-length (the MSA indexer).
* **Fleet**: replicas start after a seeded cold start of several minutes and are billed from
  creation (loading included); scale-down cancels starting replicas first, then drains the ready
  replica with the least resident KV — the order the operator gives a Deployment's ReplicaSet
  through pod-deletion-cost: unroutable, it serves what it holds, its queue included, billed until
  empty. A draining replica is never taken back: a scale-up starts new ones, as for a terminating pod.
  The router sends each request to the engine with the most free KV net of its queue; with no
  ready replica, requests wait at the gateway.
* **Signals**: every 15 s the simulator "scrapes" each ready replica into the same counters and
  gauges vLLM exports; at each tick (5 s after a scrape) the autoscaler receives the
  `MetricsSnapshot` a Prometheus adapter would build from them (rates over 60 s, histograms of
  finished requests over 300 s). No autoscaler sees a request's true size or timing.

The SLO per request is the resource's (spec.autoscaling.slo; by default TTFT <= 2 s + 1.5 x its unloaded
prefill time on one replica, and mean inter-token latency <= 1.5 x the unloaded inter-token latency at its
context).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, Protocol, TypeVar, runtime_checkable

from m3fleet.api.models import Plan, SloSpec
from m3fleet.api.spec_gateway import InferenceGatewaySpec
from m3fleet.autoscaling.signals import (
    HISTOGRAM_WINDOW_SECONDS,
    RATE_WINDOW_SECONDS,
    TTFT_BUCKETS,
    FleetState,
    GatewaySignals,
    Histogram,
    MetricsSnapshot,
    ReplicaSignals,
    one_two_five_buckets,
    quantile,
)
from m3fleet.catalog.engine_metrics import ENGINE_METRICS
from m3fleet.engines.base import IN_FLIGHT_DEADLINE_SECONDS
from m3fleet_simulator.scenarios import Request, Workload

# When an engine observes each request's prefill time: at its finish (vLLM), or when its first token comes (SGLang).
PrefillTime = Literal["finish", "first_token"]

# Relative speed per accelerator vs H200 (UNVERIFIED assumptions, not calibrated on hardware):
# prefill scales with dense FLOPs, the decode step with HBM bandwidth.
# The newer pools as m3fleet.catalog.throughput scales them (dense BF16 rate, HBM bandwidth vs H200).
PREFILL_SPEED: Final[dict[str, float]] = {
    "h200": 1.0,
    "h100": 1.0,
    "h20": 0.15,
    "gb200": 2.2,
    "gb300": 2.2,
    "b200": 2.2,
    "b300": 2.2,
    "mi300x": 1.32,
    "mi325x": 1.32,
    "mi350x": 1.66,
    "mi355x": 2.0,
}
DECODE_STEP_SCALE: Final[dict[str, float]] = {
    "h200": 1.0,
    "h100": 1.43,
    "h20": 1.2,
    "gb200": 0.65,
    "gb300": 0.65,
    "b200": 0.65,
    "b300": 0.65,
    "mi300x": 0.9,
    "mi325x": 0.8,
    "mi350x": 0.65,
    "mi355x": 0.65,
}
MULTI_NODE_PREFILL_EFFICIENCY: Final = 0.85
MULTI_NODE_DECODE_PENALTY: Final = 1.15
ENGINE_CAPACITY_FACTOR: Final = 0.95

# The order in which an engine prefills the prompts it holds. "fcfs": one prompt at a time in arrival order, chunked
# (vLLM's and SGLang's default schedulers; every run before the option existed). "shared": the step's token budget split
# equally among every admitted prompt (processor sharing), as vLLM's `--long-prefill-token-threshold N` with
# `--long-prefill-token-threshold-adaptive` does (SchedulerConfig.long_prefill_token_threshold_adaptive, vLLM 0.33:
# each request's chunk capped at max(N, max_num_batched_tokens / queued and running requests)); the older
# `--max-num-partial-prefills` did the same on vLLM's V0 engine. Total prefill throughput is the same.
PrefillDiscipline = Literal["fcfs", "shared"]
PREFILL_ORDER: Final[dict[str, str]] = {
    "fcfs": "one prompt at a time, first come, first served, in chunks of tokenBudget per step (vLLM and "
    "SGLang with a long prompt); the requests behind it wait, holding no KV",
    "shared": "every admitted prompt at once, tokenBudget per step shared equally among them (processor sharing, as "
    "vLLM's --long-prefill-token-threshold-adaptive); admitted first come, first served while their KV fits",
}


@dataclass(frozen=True)
class PerfModel:
    """Time model of one engine (a DP rank's TP group). Seconds and tokens."""

    prefill_linear: float  # s per prompt token
    prefill_quadratic: float  # s per prompt token per token of prompt length (MSA indexer)
    decode_step: float  # s per iteration (one target forward pass)
    decode_per_sequence: float
    decode_per_context_token: float  # the index-K scan; TP does not shard it
    token_budget: int
    max_num_seqs: int
    capacity_tokens: int
    watermark: float = 0.01
    # Tokens an iteration emits per decoding sequence: speculative decoding's acceptance length (the plan's prior),
    # else 1. One target pass verifies the drafts, prefill chunk or not, so a mixed iteration emits as many.
    tokens_per_step: float = 1.0
    # Tokens the target computes per decoding sequence and iteration: 1 + the drafted tokens it verifies. The step's
    # per-sequence share scales with them; the weights and each sequence's KV are read once a step whatever it verifies.
    verified_per_step: float = 1.0
    prefill_discipline: PrefillDiscipline = "fcfs"

    @classmethod
    def from_plan(cls, plan: Plan) -> PerfModel:
        accel = str(plan.accelerator)
        ranks = max(1, plan.data_parallel_size)
        gpus = plan.gpus_per_replica / ranks
        multi_node = plan.gpus_per_replica / ranks > plan.gpus_per_node
        speed = gpus / 8 * PREFILL_SPEED.get(accel, 1.0) * (MULTI_NODE_PREFILL_EFFICIENCY if multi_node else 1.0)
        step = 0.025 * DECODE_STEP_SCALE.get(accel, 1.0) * (MULTI_NODE_DECODE_PENALTY if multi_node else 1.0)
        # Speculative decoding emits the acceptance length's tokens per target step (the plan's prior) and verifies
        # every drafted token (the draft's own forward pass is small beside the target's and left out).
        draft = plan.speculative_decoding
        per_step = draft.acceptance_length_prior if draft else 1.0
        return cls(
            prefill_linear=20e-6 / speed,
            prefill_quadratic=1e-11 / speed,
            decode_step=step,
            decode_per_sequence=5e-5,
            decode_per_context_token=3e-9,
            token_budget=2048,
            max_num_seqs=256,
            capacity_tokens=int(plan.kv_cache_tokens_per_rank * ENGINE_CAPACITY_FACTOR) // 128 * 128,
            tokens_per_step=per_step,
            verified_per_step=1.0 + draft.num_speculative_tokens if draft else 1.0,
        )

    def scaled(self, prefill: float, decode: float) -> PerfModel:
        """The same engine with every prefill cost x `prefill` and every decode cost x `decode`."""
        return replace(
            self,
            decode_step=self.decode_step * decode,
            decode_per_sequence=self.decode_per_sequence * decode,
            decode_per_context_token=self.decode_per_context_token * decode,
            prefill_linear=self.prefill_linear * prefill,
            prefill_quadratic=self.prefill_quadratic * prefill,
        )

    def token_cost(self, prompt: float) -> float:
        """Mean compute seconds per token of a prompt of this length (linear + quadratic part)."""
        return self.prefill_linear + self.prefill_quadratic * prompt

    def unloaded_prefill_seconds(self, prompt: float) -> float:
        return prompt * max(self.decode_step / self.token_budget, self.token_cost(prompt))

    def unloaded_itl(self, context: float) -> float:
        """Seconds per output token of a sequence decoding alone."""
        # Summed in this order, so a run without a draft is bit for bit as before.
        per_sequence = self.verified_per_step * self.decode_per_sequence
        return (self.decode_step + per_sequence + self.decode_per_context_token * context) / self.tokens_per_step

    def describe(self) -> dict[str, Any]:
        return {
            "prefillSecondsPerToken": self.prefill_linear,
            "prefillSecondsPerTokenPerPromptToken": self.prefill_quadratic,
            "decodeStepSeconds": self.decode_step,
            "decodeSecondsPerSequence": self.decode_per_sequence,
            "decodeSecondsPerContextToken": self.decode_per_context_token,
            **({"tokensPerDecodeStep": self.tokens_per_step} if self.tokens_per_step != 1.0 else {}),
            **({"tokensVerifiedPerDecodeStep": self.verified_per_step} if self.verified_per_step != 1.0 else {}),
            "tokenBudget": self.token_budget,
            "maxNumSeqs": self.max_num_seqs,
            "kvTokensPerEngine": self.capacity_tokens,
            "admissionWatermark": self.watermark,
            "prefillOrder": PREFILL_ORDER[self.prefill_discipline],
            "unloadedPrefillSeconds": {
                f"{n // 1000}k": round(self.unloaded_prefill_seconds(n), 2) for n in (4000, 100_000, 500_000, 1_000_000)
            },
            "unloadedInterTokenSeconds": {
                f"{n // 1000}k": round(self.unloaded_itl(n), 4) for n in (4000, 100_000, 1_000_000)
            },
        }


def cold_start_range(plan: Plan) -> tuple[float, float]:
    """Seconds from pod creation to ready: node provisioning plus weight loading (several minutes)."""
    extra = 60.0 * (plan.nodes_per_replica - 1)
    return 180.0 + extra, 360.0 + extra


# --- the engine ------------------------------------------------------------------------------

WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3


class SimRequest:
    __slots__ = (
        "admitted",
        "cost",
        "d_start",
        "finish",
        "first_token",
        "need",
        "phase",
        "preemptions",
        "produced",
        "spec",
        "stint",
    )

    def __init__(self, spec: Request) -> None:
        self.spec = spec
        self.need = spec.prompt  # tokens to (re)prefill: prompt + tokens produced before a preemption
        self.produced = 0
        self.phase = WAITING
        self.stint = -1  # id of this request's live heap entry; anything else in a heap is stale
        self.d_start = 0.0
        self.cost = 0.0
        self.first_token: float | None = None
        self.finish: float | None = None
        self.admitted: float | None = None  # first admission to the batch: the end of its queue wait
        self.preemptions = 0


@dataclass
class Counters:
    """The engine's Prometheus counters and histograms (cumulative)."""

    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    first_tokens: int = 0
    finished: int = 0
    preemptions: int = 0
    prompt_hist: list[int] = field(default_factory=list)
    prompt_sum: float = 0.0
    ttft_hist: list[int] = field(default_factory=list)
    ttft_sum: float = 0.0
    queue_sum: float = 0.0  # seconds waiting before admission, over requests that reached a first token
    prefill_sum: float = 0.0  # seconds from first admission to first token, over finished requests (vLLM's, at finish)
    prefill_ended_sum: float = 0.0  # the same seconds, summed when the first token comes (SGLang's, at prefill end)


class Engine:
    """One KV pool (a DP rank). Fluid between events: all decoding requests advance together."""

    def __init__(self, model: PerfModel, sim: Simulation, replica: Replica) -> None:
        self.m = model
        self.sim = sim
        self.replica = replica
        self.cap = float(model.capacity_tokens)
        self.waiting: deque[SimRequest] = deque()
        self.queued_tokens = 0.0
        self.running: dict[int, SimRequest] = {}  # admission order: the newest is preempted first
        # The prompts being prefilled (one under FCFS), each with the value of V at which its prefill is done.
        self.prefilling: dict[SimRequest, float] = {}
        self.prefill_cost = 0.0  # the sum of their costs per token
        self.dec_heap: list[tuple[float, int, SimRequest]] = []
        self.n_dec = 0
        self.dstart_sum = 0.0
        self.reserved_dec = 0.0
        self.reserved = 0.0
        self.D = 0.0  # tokens every decoding request advanced (iterations x tokens_per_step)
        self.P = 0.0  # prompt tokens prefilled so far
        self.V = 0.0  # prompt tokens each prefilling prompt received so far (its share of P; P itself under FCFS)
        self.t = sim.now
        self.version = 0
        self.c = Counters(prompt_hist=[0] * (len(sim.prompt_bounds) + 1), ttft_hist=[0] * (len(TTFT_BUCKETS) + 1))

    # state ------------------------------------------------------------------------------------
    def used(self) -> float:
        return self.reserved + self.n_dec * self.D - self.dstart_sum

    def idle(self) -> bool:
        return not self.running and not self.waiting

    def _iteration(self) -> float:
        m = self.m
        step = m.decode_step
        if self.n_dec:
            context = self.reserved_dec + self.n_dec * self.D - self.dstart_sum
            step += m.verified_per_step * m.decode_per_sequence * self.n_dec + m.decode_per_context_token * context
        if self.prefilling:
            # each prompt's share of the budget at its own cost per token (one prompt, the whole budget, under FCFS)
            chunk = m.token_budget * self.prefill_cost / len(self.prefilling)
            return chunk if chunk > step else step
        return step

    def advance(self, now: float) -> None:
        dt = now - self.t
        if dt <= 0:
            return
        if self.prefilling or self.n_dec:
            iterations = dt / self._iteration()
            if self.n_dec:
                self.D += iterations * self.m.tokens_per_step
            if self.prefilling:
                self.P += iterations * self.m.token_budget
                self.V += iterations * self.m.token_budget / len(self.prefilling)
        self.t = now

    @staticmethod
    def _top(heap: list[tuple[float, int, SimRequest]], phase: int) -> tuple[float, int, SimRequest] | None:
        while heap:
            entry = heap[0]
            if entry[2].phase == phase and entry[2].stint == entry[1]:
                return entry
            heapq.heappop(heap)
        return None

    def next_time(self, now: float) -> float | None:
        best = math.inf
        iteration = self._iteration()
        if self.prefilling:
            best = (min(self.prefilling.values()) - self.V) * len(self.prefilling) / self.m.token_budget * iteration
        if self.n_dec:
            top = self._top(self.dec_heap, DECODE)
            if top is not None:
                best = min(best, (top[0] - self.D) / self.m.tokens_per_step * iteration)
            best = min(best, max(0.0, self.cap - self.used()) / self.n_dec / self.m.tokens_per_step * iteration)
        return now + max(0.0, best) if best < math.inf else None

    # transitions ------------------------------------------------------------------------------
    def enqueue(self, request: SimRequest) -> None:
        request.phase = WAITING
        self.waiting.append(request)
        self.queued_tokens += request.need

    def process(self, now: float) -> None:
        self.advance(now)
        while self.prefilling:
            first, end = min(self.prefilling.items(), key=lambda item: item[1])
            if end - self.V > 1e-9 * end + 1e-6:
                break
            self._start_decode(first, now)
        while self.n_dec:
            top = self._top(self.dec_heap, DECODE)
            if top is None or top[0] - self.D > 1e-9 * top[0] + 1e-6:
                break
            heapq.heappop(self.dec_heap)
            self._finish(top[2], now)
        while self.n_dec and self.running and self.used() >= self.cap - 1e-6:
            self._preempt_newest()
        self._admit()

    def _admit(self) -> None:
        limit = self.cap * (1.0 - self.m.watermark)
        shared = self.m.prefill_discipline == "shared"
        while (shared or not self.prefilling) and self.waiting and len(self.running) < self.m.max_num_seqs:
            r = self.waiting[0]
            if self.running and self.used() + r.need > limit:
                return  # FCFS admission: the head blocks the queue until its prompt fits
            self.waiting.popleft()
            self.queued_tokens -= r.need
            if r.admitted is None:
                r.admitted = self.t
            r.phase = PREFILL
            reused = self._reuse_prefix(r)
            # Only the uncached suffix is computed; each of its tokens still attends to the whole context before it
            # (the quadratic term's mean over positions reused..need is linear + quadratic x (need + reused)).
            r.cost = self.m.prefill_linear + self.m.prefill_quadratic * (r.need + reused)
            self.prefilling[r] = self.V + r.need - reused
            self.prefill_cost += r.cost
            self.reserved += r.need
            self.running[r.spec.rid] = r

    def prefill_left(self) -> float:
        """Prompt tokens still to prefill of the prompts being prefilled."""
        return sum(end - self.V for end in self.prefilling.values())

    def _reuse_prefix(self, r: SimRequest) -> int:
        """Prompt tokens of `r` whose KV this engine already holds (prefix caching); none without a cache."""
        return 0

    def _leave_prefill(self, r: SimRequest) -> None:
        if self.prefilling.pop(r, None) is not None:
            self.prefill_cost = self.prefill_cost - r.cost if self.prefilling else 0.0

    def _leave_decode(self, r: SimRequest) -> float:
        """Remove a decoding request from the batch; returns the tokens it produced in this stint."""
        produced = self.D - r.d_start
        self.n_dec -= 1
        self.dstart_sum = self.dstart_sum - r.d_start if self.n_dec else 0.0
        self.reserved_dec = self.reserved_dec - r.need if self.n_dec else 0.0
        self.c.generation_tokens += produced
        return produced

    def _start_decode(self, r: SimRequest, now: float) -> None:
        self._leave_prefill(r)
        if r.first_token is None:  # the prefill's last step emits the first token
            r.first_token = now
            r.produced = 1
            ttft = now - r.spec.arrival
            self.c.first_tokens += 1
            self.c.prompt_tokens += r.spec.prompt
            self.c.generation_tokens += 1
            self.c.ttft_hist[bisect_left(TTFT_BUCKETS, ttft)] += 1
            self.c.ttft_sum += ttft
            if r.admitted is not None:
                self.c.prefill_ended_sum += now - r.admitted
            self.c.queue_sum += (r.admitted if r.admitted is not None else now) - r.spec.arrival
        remaining = r.spec.output - r.produced
        if remaining <= 0:
            self._finish(r, now)
            return
        r.phase = DECODE
        r.stint = next(self.sim.seq)
        r.d_start = self.D
        heapq.heappush(self.dec_heap, (self.D + remaining, r.stint, r))
        self.n_dec += 1
        self.dstart_sum += self.D
        self.reserved_dec += r.need

    def _finish(self, r: SimRequest, now: float) -> None:
        if r.phase == DECODE:
            self._leave_decode(r)
        self.reserved = self.reserved - r.need if len(self.running) > 1 else 0.0
        del self.running[r.spec.rid]
        r.phase = DONE
        r.finish = now
        self.c.finished += 1
        self.c.prompt_hist[bisect_left(self.sim.prompt_bounds, r.spec.prompt)] += 1
        self.c.prompt_sum += r.spec.prompt
        if r.first_token is not None and r.admitted is not None:
            self.c.prefill_sum += r.first_token - r.admitted
        self.sim.on_finish(r)

    def _preempt_newest(self) -> None:
        rid = next(reversed(self.running))
        r = self.running.pop(rid)
        if r.phase == PREFILL:
            self._leave_prefill(r)
        else:
            r.produced += int(self._leave_decode(r))
        self.reserved = self.reserved - r.need if self.running else 0.0
        r.need = r.spec.prompt + r.produced  # recompute: prompt and output so far are prefilled again
        r.stint = -1
        r.phase = WAITING
        r.preemptions += 1
        self.c.preemptions += 1
        self.waiting.appendleft(r)
        self.queued_tokens += r.need

    def generation_total(self) -> float:
        return self.c.generation_tokens + self.n_dec * self.D - self.dstart_sum


# --- the fleet ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scrape:
    time: float
    running: int
    waiting: int
    used: float
    capacity: float
    prompt_tokens: float
    generation_tokens: float
    first_tokens: int
    finished: int
    preemptions: int
    prompt_cumulative: tuple[int, ...]
    prompt_sum: float
    ttft_cumulative: tuple[int, ...]
    ttft_sum: float
    queue_sum: float
    prefill_sum: float
    prefill_ended_sum: float


class Replica:
    __slots__ = ("created", "deleted", "drain_started", "draining", "engines", "name", "ready", "scrapes", "serial")

    def __init__(self, serial: int, created: float, name: str | None = None) -> None:
        self.serial = serial
        self.name = name or f"replica-{serial}"
        self.created = created
        self.ready = False
        self.draining = False
        self.drain_started = 0.0
        self.deleted: float | None = None
        self.engines: list[Engine] = []
        self.scrapes: list[Scrape] = []

    def used(self) -> float:
        return sum(e.used() for e in self.engines)

    def idle(self) -> bool:
        return all(e.idle() for e in self.engines)


class Autoscaler(Protocol):
    name: str

    def desired(self, snapshot: MetricsSnapshot, fleet: FleetState) -> int: ...


@runtime_checkable
class ReadsHeldRequests(Protocol):
    """An autoscaler that also reads the requests the gateway holds (the zero rule's signal), before each tick."""

    def observe_held(self, held: float) -> None: ...


# GIE v1.3.0's flow control bounds its queue at 1 GB of request bytes per priority band (then 429) (docs/gateway.md).
HELD_BYTES_LIMIT: Final = 1e9
# A held request waits until the Gateway gives up on it: the HTTPRoute's timeouts.request, spec.gateway's
# requestTimeoutSeconds (then 504). Its default, read from the product's field.
HELD_TIMEOUT_SECONDS: Final = float(InferenceGatewaySpec.model_fields["request_timeout_seconds"].default)


@dataclass(frozen=True)
class Holding:
    """The gateway's flow control at zero ready replicas: arriving requests are held, up to `max_bytes` of them, each
    for at most `timeout_seconds`; one refused or timed out fails (counts against attainment)."""

    max_bytes: float = HELD_BYTES_LIMIT
    timeout_seconds: float = HELD_TIMEOUT_SECONDS


@dataclass(frozen=True)
class GatewayModel:
    """A gateway in front of the fleet that records each request's size in bytes as it arrives (GIE's endpoint
    picker): the request's JSON, `bytes_per_token` per prompt token (seeded per run: the text's language and kind)
    with a per-request spread, plus a fixed envelope."""

    bytes_per_token: float
    seed: int
    spread: float = 0.15  # lognormal sigma of one request's bytes per token
    envelope_bytes: float = 300.0

    def describe(self) -> dict[str, Any]:
        return {
            "records": "request bytes at arrival (inference_objective_request_sizes)",
            "bytesPerToken": round(self.bytes_per_token, 2),
            "perRequestSpread": self.spread,
            "envelopeBytes": self.envelope_bytes,
        }


@dataclass(frozen=True)
class SimSettings:
    tick_seconds: float = 15.0
    scrape_seconds: float = 15.0
    tick_offset_seconds: float = 5.0  # a tick reads the scrape taken this long before it
    tail_seconds: float = 900.0  # after the last arrival, time for in-flight requests to finish
    # A draining replica's work in flight is cut off where the engine pod stops draining (vLLM's --shutdown-timeout).
    drain_deadline_seconds: float = float(IN_FLIGHT_DEADLINE_SECONDS)
    gateway: GatewayModel | None = None  # spec.autoscaling.gateway: the gateway's request sizes are exported
    # spec.gateway's flow control, bounded (needs `gateway`: the bound is in request bytes); None: the unbounded
    # wait every run had before scale to zero, kept so that runs without it stay as they were.
    holding: Holding | None = None
    rate_window_seconds: float = RATE_WINDOW_SECONDS  # spec.autoscaling.prometheus.rateWindowSeconds

    @property
    def histogram_window_seconds(self) -> float:
        return max(HISTOGRAM_WINDOW_SECONDS, self.rate_window_seconds)

    def describe(self) -> dict[str, Any]:
        return {
            "gateway": self.gateway.describe() if self.gateway else None,
            "tickSeconds": self.tick_seconds,
            "scrapeSeconds": self.scrape_seconds,
            "tickReadsScrapeAgeSeconds": self.tick_offset_seconds,
            "rateWindowSeconds": self.rate_window_seconds,
            "histogramWindowSeconds": self.histogram_window_seconds,
            "tailSeconds": self.tail_seconds,
            "drainDeadlineSeconds": self.drain_deadline_seconds,
            "drain": (
                "a replica scaled down takes no new requests and serves what it holds, its queue included "
                "(vLLM with --shutdown-timeout, SGLang), until drainDeadlineSeconds"
            ),
        }


@dataclass
class PolicyResult:
    name: str
    requests: int
    rejected: int
    met: int
    unfinished: int
    gpu_hours: float
    preemptions: int
    scale_events: int
    peak_replicas: int
    replica_minutes: list[int] = field(default_factory=list)  # replicas billed, per minute
    held_failed: int = 0  # requests the gateway refused (queue full) or gave up on (timeout) while holding them

    @property
    def admitted(self) -> int:
        return self.requests - self.rejected

    @property
    def slo_attainment(self) -> float:
        return self.met / self.admitted if self.admitted else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            # null when the engine rejected every request: no SLO was met or missed, and 100% would read as served
            "sloAttainment": round(self.slo_attainment, 4) if self.admitted else None,
            "gpuHours": round(self.gpu_hours, 2),
            "preemptions": self.preemptions,
            "rejected": self.rejected,
            "scaleEvents": self.scale_events,
            "requests": self.requests,
            "metSlo": self.met,
            "unfinished": self.unfinished,
            "peakReplicas": self.peak_replicas,
        }


class Simulation:
    """One policy on one request stream. `run()` once; or, with no autoscaler, `begin()`, then `advance` and
    `follow` the outside fleet."""

    def __init__(
        self,
        plan: Plan,
        model: PerfModel,
        requests: Sequence[Request],
        autoscaler: Autoscaler | None,
        *,
        duration: float,
        initial_replicas: int,
        cold_starts: Sequence[float],
        measured_cold_starts: Sequence[float],
        settings: SimSettings = SimSettings(),
        clock_offset: float = 0.0,
        slo: SloSpec | None = None,
    ) -> None:
        self.plan = plan
        self.slo = slo or SloSpec()  # what a finished request is scored against
        self.model = model
        self.requests = requests
        self.autoscaler = autoscaler
        self.duration = duration
        self.settings = settings
        self.cold_starts = cold_starts
        self.measured = list(measured_cold_starts)
        self.clock_offset = clock_offset  # the wall-clock time (Unix s) of simulated t = 0, for the autoscaler
        self.prompt_bounds = one_two_five_buckets(plan.max_model_len)
        metrics = ENGINE_METRICS[str(plan.engine)]
        # Whether the plan's engine times each prefill, and when it observes it (PrefillTime).
        self.prefill_time: PrefillTime | None = None
        if metrics.prefill_time:
            self.prefill_time = "first_token" if metrics.prefill_time_at_first_token else "finish"
        self.limit = min(plan.max_model_len, model.capacity_tokens)
        self.ranks = max(1, plan.data_parallel_size)
        self.now = 0.0
        self.seq = itertools.count()
        self.events: list[tuple[float, int, int, Any, Any]] = []
        self.replicas: list[Replica] = []
        self.gateway: deque[SimRequest] = deque()
        self.in_flight = 0
        self.met = 0
        self.rejected = 0
        self.scale_events = 0
        self.finished: list[SimRequest] = []
        self.sizes = random.Random(f"{settings.gateway.seed}:request-bytes") if settings.gateway else None
        self.arrived_requests, self.arrived_bytes = 0, 0.0
        self.gateway_scrapes: list[tuple[float, int, float]] = []  # (time, requests, bytes) as the gateway counts
        self.held: dict[int, tuple[SimRequest, float]] = {}  # with `holding`: held requests and their bytes, in order
        self.held_keys = itertools.count()
        self.held_failed = 0
        self.held_scraped = 0  # the picker's held-request gauge at the last scrape
        for _ in range(initial_replicas):
            replica = self._new_replica(0.0)
            self._ready(replica)

    # events -------------------------------------------------------------------------------------
    ARRIVAL, ENGINE, READY, SCRAPE, TICK, CALL = 0, 1, 2, 3, 4, 5

    def _push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, a, b))

    def _reschedule(self, engine: Engine) -> None:
        engine.version += 1
        t = engine.next_time(self.now)
        if t is not None:
            self._push(t, self.ENGINE, engine, engine.version)
        replica = engine.replica
        if replica.draining and replica.deleted is None and replica.idle():
            replica.deleted = self.now

    def run(self) -> PolicyResult:
        self.begin()
        self.advance(self.duration + self.settings.tail_seconds)
        return self.result()

    def begin(self) -> None:
        """Schedule the first arrival, scrape and autoscaler tick. Without an autoscaler the fleet changes only
        through `follow`: the replicas an outside autoscaler runs (the closed-loop tier's pods)."""
        if self.requests:
            self._push(self.requests[0].arrival, self.ARRIVAL, 0)
        self._push(0.0, self.SCRAPE)
        if self.autoscaler is not None:
            self._push(self.settings.tick_offset_seconds, self.TICK)

    def advance(self, until: float) -> bool:
        """Process every event up to simulated time `until`; False once the run is over (the scenario ended
        and nothing is in flight at a tick)."""
        s = self.settings
        while self.events and self.events[0][0] <= until:
            t, _, kind, a, b = heapq.heappop(self.events)
            self.now = t
            if kind == self.ENGINE:
                if b == a.version:
                    a.process(t)
                    self._reschedule(a)
            elif kind == self.ARRIVAL:
                self._arrive(a)
            elif kind == self.READY:
                if a.deleted is None:
                    self.measured.append(t - a.created)
                    self._ready(a)
            elif kind == self.SCRAPE:
                self._scrape()
                self._push(t + s.scrape_seconds, self.SCRAPE)
            elif kind == self.TICK:
                if t >= self.duration and self.in_flight == 0 and not self.held:
                    self.events.clear()
                    return False
                self._tick()
                self._push(t + s.tick_seconds, self.TICK)
            elif kind == self.CALL:  # a model built on this one (a KV transfer, a session's next turn)
                a()
        return bool(self.events)

    def follow(self, names: Collection[str]) -> None:
        """Make the serving replicas exactly `names`: a new name is a replica that became ready now (its cold
        start happened outside), a serving replica whose name is gone drains as a scale-down would."""
        serving = {r.name: r for r in self._serving()}
        for name in sorted(set(names) - set(serving)):
            self._ready(self._new_replica(self.now, name))
        for name in sorted(set(serving) - set(names)):
            self._drain(serving[name])

    def replica(self, name: str) -> Replica | None:
        return next((r for r in self.replicas if r.name == name), None)

    def _arrive(self, index: int) -> None:
        spec = self.requests[index]
        if index + 1 < len(self.requests):
            self._push(self.requests[index + 1].arrival, self.ARRIVAL, index + 1)
        gateway = self.settings.gateway
        size = 0.0
        if gateway is not None and self.sizes is not None:  # the gateway sees every request, rejected ones too
            per_token = gateway.bytes_per_token * self.sizes.lognormvariate(0.0, gateway.spread)
            size = gateway.envelope_bytes + spec.prompt * per_token
            self.arrived_requests += 1
            self.arrived_bytes += size
        if spec.prompt + spec.output > self.limit:
            self.rejected += 1  # the engine answers 400: longer than max_model_len
            return
        holding = self.settings.holding
        if holding is not None and not self._serving():
            self._hold(SimRequest(spec), size, holding)
            return
        self.in_flight += 1
        self._route(SimRequest(spec))

    def _hold(self, request: SimRequest, size: float, holding: Holding) -> None:
        """The picker holds the request while no replica is ready: refused (429) past the byte bound, given up on
        (504) past the timeout; either fails the request."""
        if sum(held for _, held in self.held.values()) + size > holding.max_bytes:
            self.held_failed += 1
            return
        key = next(self.held_keys)
        self.held[key] = (request, size)
        self._push(self.now + holding.timeout_seconds, self.CALL, lambda: self._give_up(key))

    def _give_up(self, key: int) -> None:
        if self.held.pop(key, None) is not None:
            self.held_failed += 1

    def _serving(self) -> list[Replica]:
        return [r for r in self.replicas if r.ready and not r.draining and r.deleted is None]

    def _choose(self, request: SimRequest) -> Engine | None:
        """The engine with the most free KV net of its queue; None with no serving replica."""
        best: Engine | None = None
        best_score = -math.inf
        for replica in self._serving():
            for engine in replica.engines:
                score = engine.cap - engine.used() - engine.queued_tokens
                if score > best_score:
                    best, best_score = engine, score
        return best

    def _route(self, request: SimRequest) -> None:
        best = self._choose(request)
        if best is None:
            self.gateway.append(request)
            return
        self._send(best, request)

    def _send(self, engine: Engine, request: SimRequest) -> None:
        engine.advance(self.now)
        engine.enqueue(request)
        engine.process(self.now)
        self._reschedule(engine)

    def on_finish(self, r: SimRequest) -> None:
        self.in_flight -= 1
        self.finished.append(r)
        if meets_slo(r, self.slo, self.model):
            self.met += 1

    # the fleet ------------------------------------------------------------------------------------
    def _new_replica(self, created: float, name: str | None = None) -> Replica:
        replica = Replica(len(self.replicas), created, name)
        self.replicas.append(replica)
        return replica

    def _ready(self, replica: Replica) -> None:
        replica.ready = True
        replica.engines = [self._new_engine(replica) for _ in range(self.ranks)]
        held = list(self.gateway)
        self.gateway.clear()
        for request in held:
            self._route(request)
        released = [request for request, _ in self.held.values()]
        self.held.clear()
        for request in released:  # to the first ready replica, in the order they arrived
            self.in_flight += 1
            self._route(request)

    def _new_engine(self, replica: Replica) -> Engine:
        return Engine(self.model, self, replica)

    def _apply(self, desired: int) -> None:
        starting = [r for r in self.replicas if not r.ready and r.deleted is None]
        serving = self._serving()
        current = len(serving) + len(starting)
        if desired == current:
            return
        self.scale_events += 1
        if desired > current:
            # A draining replica is a terminating pod: Kubernetes cannot take it back, so every replica added
            # is a new one with a full cold start while the draining ones finish (and are billed) beside it.
            for _ in range(desired - current):
                replica = self._new_replica(self.now)
                self._push(self.now + self.cold_starts[replica.serial % len(self.cold_starts)], self.READY, replica)
            return
        remove = current - desired
        for replica in sorted(starting, key=lambda r: -r.created)[:remove]:
            replica.deleted = self.now
            remove -= 1
        for replica in sorted(serving, key=lambda r: r.used())[:remove]:
            self._drain(replica)

    def _drain(self, replica: Replica) -> None:
        """Stop routing to the replica; it serves what it holds, queued requests included, as a terminating
        engine does (vLLM with --shutdown-timeout and SGLang finish every request they were sent, the
        waiting ones too; nothing hands a queued request back to the gateway)."""
        replica.draining = True
        replica.drain_started = self.now
        if replica.idle():
            replica.deleted = self.now

    def _kill_overdue_drains(self) -> None:
        for replica in self.replicas:
            if replica.draining and replica.deleted is None:
                drained_for = self.now - replica.drain_started
                if drained_for > self.settings.drain_deadline_seconds and not replica.idle():
                    for engine in replica.engines:
                        self.in_flight -= len(engine.running) + len(engine.waiting)
                        engine.running.clear()
                        engine.waiting.clear()
                        engine.version += 1
                    replica.deleted = self.now

    # signals -----------------------------------------------------------------------------------------
    def _scrape(self) -> None:
        if self.settings.gateway is not None:
            self.gateway_scrapes.append((self.now, self.arrived_requests, self.arrived_bytes))
        self.held_scraped = len(self.held)
        for replica in self._serving():
            engines = replica.engines
            for engine in engines:
                engine.advance(self.now)
            cp = [0] * (len(self.prompt_bounds) + 1)
            ct = [0] * (len(TTFT_BUCKETS) + 1)
            for engine in engines:
                for i, n in enumerate(engine.c.prompt_hist):
                    cp[i] += n
                for i, n in enumerate(engine.c.ttft_hist):
                    ct[i] += n
            replica.scrapes.append(
                Scrape(
                    time=self.now,
                    running=sum(len(e.running) for e in engines),
                    waiting=sum(len(e.waiting) for e in engines),
                    used=sum(e.used() for e in engines),
                    capacity=sum(e.cap for e in engines),
                    prompt_tokens=sum(e.c.prompt_tokens for e in engines),
                    generation_tokens=sum(e.generation_total() for e in engines),
                    first_tokens=sum(e.c.first_tokens for e in engines),
                    finished=sum(e.c.finished for e in engines),
                    preemptions=sum(e.c.preemptions for e in engines),
                    prompt_cumulative=tuple(itertools.accumulate(cp)),
                    prompt_sum=sum(e.c.prompt_sum for e in engines),
                    ttft_cumulative=tuple(itertools.accumulate(ct)),
                    ttft_sum=sum(e.c.ttft_sum for e in engines),
                    queue_sum=sum(e.c.queue_sum for e in engines),
                    prefill_sum=sum(e.c.prefill_sum for e in engines),
                    prefill_ended_sum=sum(e.c.prefill_ended_sum for e in engines),
                )
            )

    def snapshot(self) -> MetricsSnapshot:
        off = self.clock_offset
        return MetricsSnapshot(
            engine=str(self.plan.engine),
            time=self.now + off,
            replicas=tuple(
                replace(
                    s,
                    sample_time=None if s.sample_time is None else s.sample_time + off,
                    acceptance_length=self._acceptance_length(s),
                )
                for s in (
                    signals_from_scrapes(r.name, r.scrapes, self.settings, self.prompt_bounds, self.prefill_time)
                    for r in self._serving()
                    if r.scrapes
                )
            ),
            window_seconds=self.settings.rate_window_seconds,
            gateway=gateway_signals(self.gateway_scrapes, self.settings) if self.gateway_scrapes else None,
        )

    def _acceptance_length(self, signals: ReplicaSignals) -> float | None:
        """What vLLM's speculative-decoding counters read over the rate window (1 + accepted / drafts): the engine
        model's tokens per step, the plan's prior; None without a draft or with nothing decoded in the window."""
        draft = self.plan.speculative_decoding
        if draft is None or not signals.generation_tokens_rate:
            return None
        return draft.acceptance_length_prior

    def fleet(self) -> FleetState:
        starting = [r for r in self.replicas if not r.ready and r.deleted is None]
        serving = self._serving()
        return FleetState(
            now=self.now + self.clock_offset,
            current_replicas=len(serving) + len(starting),
            ready_replicas=len(serving),
            starting_ages=tuple(self.now - r.created for r in starting),
            time_to_ready_seconds=quantile(self.measured, 0.9) if self.measured else None,
        )

    def _tick(self) -> None:
        self._kill_overdue_drains()
        if isinstance(self.autoscaler, ReadsHeldRequests):
            self.autoscaler.observe_held(float(self.held_scraped))
        if self.autoscaler is not None:  # begin() schedules ticks only with one
            self._apply(max(0, self.autoscaler.desired(self.snapshot(), self.fleet())))

    # results ------------------------------------------------------------------------------------------
    def result(self) -> PolicyResult:
        """The requests met so far; GPU-hours as if the replicas running now ran to the scenario's end."""
        end = self.duration
        gpus = self.plan.gpus_per_replica
        seconds = 0.0
        minutes = [0] * math.ceil(end / 60)
        for replica in self.replicas:
            start = max(0.0, replica.created)
            stop = min(end, replica.deleted if replica.deleted is not None else end)
            if stop > start:
                seconds += stop - start
                for minute in range(int(start // 60), math.ceil(stop / 60)):
                    if minute < len(minutes):
                        minutes[minute] += 1
        unfinished = sum(1 for r in self.requests if r.prompt + r.output <= self.limit) - len(self.finished)
        return PolicyResult(
            name=self.autoscaler.name if self.autoscaler else "outside",
            requests=len(self.requests),
            rejected=self.rejected,
            met=self.met,
            unfinished=unfinished,
            gpu_hours=seconds * gpus / 3600.0,
            preemptions=sum(e.c.preemptions for r in self.replicas for e in r.engines),
            scale_events=self.scale_events,
            peak_replicas=max(minutes, default=0),
            replica_minutes=minutes,
            held_failed=self.held_failed,
        )


def meets_slo(r: SimRequest, slo: SloSpec, model: PerfModel) -> bool:
    """A finished request against the SLO, whose unloaded times are `model`'s."""
    spec = r.spec
    assert r.first_token is not None and r.finish is not None
    ttft = r.first_token - spec.arrival
    itl = (r.finish - r.first_token) / (spec.output - 1) if spec.output > 1 else 0.0
    ttft_ok = ttft <= slo.ttft_seconds(spec.prompt, model.unloaded_prefill_seconds(spec.prompt))
    itl_ok = itl <= slo.itl_seconds(model.unloaded_itl(spec.prompt + spec.output / 2))
    return ttft_ok and itl_ok


def signals_from_scrapes(
    name: str,
    scrapes: Sequence[Scrape],
    settings: SimSettings,
    prompt_bounds: Sequence[float],
    prefill_time: PrefillTime | None,
) -> ReplicaSignals:
    """What a Prometheus adapter reads for one replica: gauges now, rates and histograms over windows (the prefill
    time's only where the plan's engine exports it, observed when it does)."""
    latest = scrapes[-1]
    rate_base = _base(scrapes, settings.scrape_seconds, settings.rate_window_seconds)
    hist_base = _base(scrapes, settings.scrape_seconds, settings.histogram_window_seconds)

    def rate(field_: Callable[[Scrape], float]) -> float | None:
        if rate_base is None:
            return None
        return (field_(latest) - field_(rate_base)) / (latest.time - rate_base.time)

    def hist(
        bounds: Sequence[float], cum: Callable[[Scrape], tuple[int, ...]], total: Callable[[Scrape], float]
    ) -> Histogram | None:
        if hist_base is None:
            return None
        now_c, base_c = cum(latest), cum(hist_base)
        delta = tuple(float(a - b) for a, b in zip(now_c, base_c, strict=True))
        return Histogram(
            bounds=(*bounds, math.inf), cumulative=delta, total=total(latest) - total(hist_base), count=delta[-1]
        )

    return ReplicaSignals(
        replica=name,
        up=True,
        sample_time=latest.time,
        kv_usage=latest.used / latest.capacity,
        kv_capacity_tokens=latest.capacity,
        running=float(latest.running),
        waiting=float(latest.waiting),
        prompt_tokens_rate=rate(lambda s: s.prompt_tokens),
        generation_tokens_rate=rate(lambda s: s.generation_tokens),
        first_token_rate=rate(lambda s: s.first_tokens),
        finished_rate=rate(lambda s: s.finished),
        preemption_rate=rate(lambda s: s.preemptions),
        prompt_tokens=hist(prompt_bounds, lambda s: s.prompt_cumulative, lambda s: s.prompt_sum),
        ttft_seconds=hist(TTFT_BUCKETS, lambda s: s.ttft_cumulative, lambda s: s.ttft_sum),
        queue_seconds=hist((), lambda s: (s.first_tokens,), lambda s: s.queue_sum),
        prefill_seconds=(
            None
            if prefill_time is None
            else hist(
                (),
                lambda s: (prefill_observations(s, prefill_time)[0],),
                lambda s: prefill_observations(s, prefill_time)[1],
            )
        ),
    )


def prefill_observations(scrape: Scrape, prefill_time: PrefillTime) -> tuple[int, float]:
    """(count, sum of seconds) of the prefill times an engine has observed by this scrape: at each request's finish
    (vLLM) or at its first token (SGLang)."""
    if prefill_time == "first_token":
        return scrape.first_tokens, scrape.prefill_ended_sum
    return scrape.finished, scrape.prefill_sum


def gateway_signals(scrapes: Sequence[tuple[float, int, float]], settings: SimSettings) -> GatewaySignals:
    """What `rate` and `irate` over the rate window read from the gateway's request-size histogram."""
    base = _base(scrapes, settings.scrape_seconds, settings.rate_window_seconds)
    if base is None:
        return GatewaySignals()
    (t1, n1, b1), (t0, n0, b0), (tb, nb, bb) = scrapes[-1], scrapes[-2], base
    return GatewaySignals(
        request_rate=(n1 - nb) / (t1 - tb),
        bytes_rate=(b1 - bb) / (t1 - tb),
        recent_request_rate=(n1 - n0) / (t1 - t0),
        recent_bytes_rate=(b1 - b0) / (t1 - t0),
    )


S = TypeVar("S")


def _base(scrapes: Sequence[S], interval: float, window: float) -> S | None:
    """The scrape `window` before the latest (or the oldest, for a younger replica); None with one scrape."""
    if len(scrapes) < 2:
        return None
    steps = round(window / interval)
    return scrapes[max(0, len(scrapes) - 1 - steps)]


@dataclass(frozen=True)
class SeedStreams:
    """Per-seed draws shared by every policy in a run (so replica k starts equally slowly for all)."""

    cold_starts: tuple[float, ...]
    measured: tuple[float, ...]

    @classmethod
    def draw(cls, seed: int, low: float, high: float, initial: int, fixed: float | None = None) -> SeedStreams:
        """Seeded cold starts in [low, high]; every one `fixed` seconds when given (`--cold-start`)."""
        if fixed is not None:
            return cls((fixed,), (fixed,) * max(1, initial))
        rng = random.Random(f"{seed}:cold-starts")
        cold = tuple(rng.uniform(low, high) for _ in range(512))
        before = random.Random(f"{seed}:initial-cold-starts")
        # The operator measured the initial replicas' starts before the window opened.
        measured = tuple(before.uniform(low, high) for _ in range(max(1, initial)))
        return cls(cold, measured)

    @classmethod
    def modelled(cls, seed: int, draw: Callable[[random.Random], float], initial: int) -> SeedStreams:
        """Seeded cold starts from a phase model (coldstart.py): `draw(rng)` is one replica's time-to-ready."""
        rng = random.Random(f"{seed}:cold-starts")
        cold = tuple(draw(rng) for _ in range(512))
        before = random.Random(f"{seed}:initial-cold-starts")
        return cls(cold, tuple(draw(before) for _ in range(max(1, initial))))


def scenario_duration(scenario: Workload, minutes: float | None) -> float:
    return scenario.duration if minutes is None else min(scenario.duration, minutes * 60.0)

"""From a metrics snapshot to the need: which replicas' metrics can be used (`check_health`), then the arriving
prompt length, the queues, the four terms and the numbers behind them (`compute_terms`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from m3fleet.autoscaling.policy.capacity import Capacity, checked_capacity, learned_prefill, tokens_per_step
from m3fleet.autoscaling.policy.config import PolicyConfig
from m3fleet.autoscaling.policy.estimates import (
    LEVEL_JUMP,
    RISE_EVIDENCE,
    RISE_WINDOWS,
    SHIFT,
    Load,
    Shift,
    output_per_request,
    positive_ratio,
    prompt_estimate,
    sum_known,
)
from m3fleet.autoscaling.policy.gateway import Arrivals, gateway_arrivals
from m3fleet.autoscaling.policy.state import PolicyState
from m3fleet.autoscaling.policy.terms import bin_term, decode_term, kv_term, prefill_term
from m3fleet.autoscaling.signals import FleetState, MetricsSnapshot, ReplicaSignals

# "What finished recently" for a burst's shift test: a high quantile of the window's finished prompts, so one long
# prompt among chat does not set it (the mean would), while a tenth of the window's requests being long does.
RECENT_PROMPT_QUANTILE: Final = 0.9


@dataclass(frozen=True)
class Health:
    fresh: tuple[ReplicaSignals, ...]
    missing: int  # ready replicas without fresh metrics
    hold: str | None  # reason to hold, when nothing can be decided


def check_health(config: PolicyConfig, snapshot: MetricsSnapshot, fleet: FleetState) -> Health:
    if snapshot.error:
        return Health((), fleet.ready_replicas, f"metrics unavailable ({snapshot.error})")
    if fleet.now - snapshot.time > config.stale_after_seconds:
        age = fleet.now - snapshot.time
        return Health((), fleet.ready_replicas, f"metrics snapshot is {age:.0f}s old")
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
        return Health(fresh, missing, f"no fresh metrics from any of the {fleet.ready_replicas} ready replicas")
    if fleet.ready_replicas == 0:
        starting = fleet.starting_replicas
        return Health(fresh, 0, f"no ready replica to measure ({starting} starting)")
    return Health(fresh, missing, None)


@dataclass(frozen=True)
class Terms:
    values: dict[str, float]
    need: float
    dominant: str
    request_rate: float
    prompt_tokens: float
    in_flight: tuple[tuple[float, float], ...]
    unservable: int
    burst: bool  # demand arrived at a new level at once this tick (see rate_estimate, prompt_estimate)
    long_prompts_ended: bool  # long prompts stopped arriving this tick (see prompt_estimate)
    capacity: Capacity
    prefill_rate: float | None  # the learned prefill throughput to keep
    prefill_samples: int
    prefill_cap_ticks: int
    prefill: dict[str, Any]
    bytes_per_token: float | None  # the measured gateway ratio to keep
    gateway_jump: float | None
    gateway_since: float | None


def _arriving_prompt_length(
    config: PolicyConfig,
    state: PolicyState,
    load: Load,
    fresh: Sequence[ReplicaSignals],
    since_burst: float | None,
    window: float,
    elapsed: float | None,
    rising: bool,
    arrivals: Arrivals,
) -> tuple[float, Shift]:
    """(mean prompt tokens of arriving requests, how their mix changed). With a gateway, what it saw arrive: a
    burst when SHIFT times the estimate, else smoothed as below (rises taken at once just after a jump). Without,
    prompt tokens per first token of recent prefills. The router sends new requests to replicas without a queue, so
    theirs describe what arrives now; a replica with a queue prefills what arrived before (its ratio describes its
    own queue, see `_queued_prompt_tokens`). Within a rate window of a burst the ratio still mixes in the old
    regime. See `prompt_estimate`."""
    per_running = positive_ratio(load.resident, load.running)
    recent = load.histogram.quantile(RECENT_PROMPT_QUANTILE) if load.histogram else None
    if arrivals.requests and arrivals.prompt_tokens is not None:
        seen, previous = arrivals.prompt_tokens / arrivals.requests, state.prompt_tokens
        if previous is not None and seen >= SHIFT * previous:
            return seen, Shift.BURST
        # A fall is the long prompts' end only when the last two samples show it too: just after a burst starts,
        # the rate window still averages in the minute before it.
        ended = arrivals.recent_prompt is not None and (
            previous is None or LEVEL_JUMP * arrivals.recent_prompt <= previous
        )
        return prompt_estimate(
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
        positive_ratio(sum_known([r.prompt_tokens_rate for r in side]), sum_known([r.first_token_rate for r in side]))
        or per_running
        or (load.histogram.mean() if load.histogram else None)
        or config.default_prompt_tokens
    )
    settled = since_burst is None or since_burst >= window
    prefills = sum_known([r.first_token_rate for r in side]) * window
    return prompt_estimate(
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
        (r.waiting or 0.0)
        * max(prompt_tokens, positive_ratio(r.prompt_tokens_rate or 0.0, r.first_token_rate or 0.0) or 0.0)
        for r in fresh
    ]


def compute_terms(
    config: PolicyConfig,
    state: PolicyState,
    health: Health,
    snapshot: MetricsSnapshot,
    fleet: FleetState,
    horizon: float,
) -> Terms:
    """The four needs (KV, long-request bins, prefill, decode) and the numbers behind them; the largest wins."""
    now, fresh = fleet.now, health.fresh
    checked = checked_capacity(config, fresh)
    capacity, rank_capacity = checked.replica, checked.rank
    bin_size = config.kv_target * rank_capacity
    load = Load.of(fresh, config.kv_tokens_per_replica)

    elapsed = now - state.last_time if state.last_time is not None and now > state.last_time else None
    since_burst = now - state.burst.start if state.burst is not None else None
    # Within one horizon of a burst's start the new level is still being measured: rises are taken at
    # once (the replicas ordered now arrive one time-to-ready later, too late for a slow estimate). After
    # RISE_WINDOWS rate windows, only while requests queue: the fleet is still behind the burst and what
    # its replicas report still lags it. Without a queue the windows have seen only the new level, and a
    # rise taken at once is the noise of a steady one, ratcheted up and then held by the scale-down window.
    window = snapshot.window_seconds
    rising = (
        since_burst is not None and since_burst < horizon and (since_burst < RISE_WINDOWS * window or load.waiting > 0)
    )
    arrivals = gateway_arrivals(state, snapshot, fleet, fresh, load, elapsed)
    isl, prompt_shift = _arriving_prompt_length(
        config, state, load, fresh, since_burst, window, elapsed, rising, arrivals
    )

    gateway = [float(t) for t in snapshot.queued_request_tokens]
    unservable = sum(1 for t in gateway if t > rank_capacity)
    servable_gateway = [t for t in gateway if t <= rank_capacity]
    local = _queued_prompt_tokens(fresh, isl)
    queued = sum(local) + sum(servable_gateway)

    learning = learned_prefill(config, state, fresh, elapsed)
    per_replica, prefill_status = learning.per_replica, learning.status
    prefill = prefill_term(
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

    # Per request, over the arrivals as well as the finishes: a new fleet's first finishes are its shortest answers.
    output = (
        output_per_request(load.generation_rate, load.finished_rate, prefill.request_rate)
        or config.default_output_tokens
    )
    kv = kv_term(config, load, queued, output, capacity, horizon)
    bin_replicas, large = bin_term(config, load, local, servable_gateway, kv.weight, bin_size)

    decode = decode_term(config, prefill.request_rate, isl, output, tokens_per_step(checked))

    candidates = {"kv": kv.replicas, "bin": bin_replicas, "prefill": prefill.replicas, "decode": decode.replicas}
    dominant = max(candidates, key=lambda k: candidates[k])
    values = {
        "kvReplicas": kv.replicas,
        "binReplicas": bin_replicas,
        "prefillReplicas": prefill.replicas,
        "needReplicas": candidates[dominant],
        # The need without the replicas kept busy by backlogs: what the arriving load itself needs. The
        # forecast records this (a backlog is a symptom of the last cold start, not demand to pre-provision).
        "demandReplicas": max(
            (load.resident + kv.growth) / (config.kv_target * capacity),
            bin_replicas,
            prefill.arrival_replicas,
            decode.replicas,
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
        "decodeReplicas": decode.replicas,
        "arrivingOutputTokensPerSecond": decode.output_rate,
        "decodeTokensPerSecondPerReplica": decode.per_replica,
        "decodeBatchPerRank": decode.batch,
        "decodeStepSeconds": decode.step_seconds,
        "tokensPerDecodeStep": decode.tokens_per_step,
        "runningRequests": load.running,
        "waitingRequests": load.waiting,
        "horizonSeconds": horizon,
        "freshReplicas": float(len(fresh)),
    }
    return Terms(
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
        prefill_rate=learning.learned,
        prefill_samples=learning.samples,
        prefill_cap_ticks=learning.cap_ticks,
        prefill=prefill_status,
        bytes_per_token=arrivals.bytes_per_token,
        gateway_jump=arrivals.jump_time,
        gateway_since=arrivals.since,
    )

"""The four needs, in (fractional) replicas: KV tokens, long-request bins, prefill and decode (the package's
docstring says what each counts)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from m3fleet.autoscaling.policy.config import PolicyConfig
from m3fleet.autoscaling.policy.estimates import (
    Load,
    conserved_request_rate,
    rate_estimate,
    slide_window,
    sum_known,
    warming_up,
)
from m3fleet.autoscaling.policy.gateway import Arrivals
from m3fleet.autoscaling.policy.state import PolicyState
from m3fleet.autoscaling.signals import FleetState, ReplicaSignals
from m3fleet.catalog.throughput import (
    DECODE_SECONDS_PER_CONTEXT_TOKEN,
    DECODE_SECONDS_PER_SEQUENCE,
    MAX_DECODE_BATCH_PER_RANK,
)


def _pairing_bins(items: Sequence[float], bin_size: float) -> float:
    """Bins the long items need: > 1/2 bin each alone, (1/3, 1/2] two per bin; monotone in sizes."""
    large = sum(1 for s in items if s > bin_size / 2)
    medium = sum(1 for s in items if bin_size / 3 < s <= bin_size / 2)
    return large + math.ceil(medium / 2)


@dataclass(frozen=True)
class KvTerm:
    replicas: float
    demand: float  # KV tokens wanted within the horizon
    weight: float  # share of the queue that turns over into the KV within the horizon
    growth: float  # tokens the running requests still decode


def kv_term(config: PolicyConfig, load: Load, queued: float, output: float, capacity: float, horizon: float) -> KvTerm:
    """Resident tokens, plus queued tokens weighted by KV turnover within the horizon (Little's law), plus
    the running requests' decode growth, at the KV target."""
    growth = load.running * output / 2.0
    turnover = load.resident / load.prompt_rate if load.prompt_rate > 0 else horizon
    weight = min(1.0, turnover / horizon)
    demand = load.resident + weight * queued + growth
    return KvTerm(demand / (config.kv_target * capacity), demand, weight, growth)


def bin_term(
    config: PolicyConfig, load: Load, local: Sequence[float], gateway: Sequence[float], weight: float, bin_size: float
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
class PrefillTerm:
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


def prefill_term(
    config: PolicyConfig,
    state: PolicyState,
    fresh: Sequence[ReplicaSignals],
    fleet: FleetState,
    load: Load,
    local: Sequence[float],
    at_gateway: float,
    prompt_tokens: float,
    per_replica: float,
    window: float,
    elapsed: float | None,
    rising: bool,
    horizon: float,
    gateway: Arrivals,
) -> PrefillTerm:
    """Arriving prompt tokens at the target utilisation, plus the replicas kept busy by backlogs.
    Arrivals: requests finishing plus the growth of those in flight (conservation) times the prompt
    length, smoothed over two minutes (one tick's delta is noise). Not the prefilled rate: a backlog
    drains faster than requests arrive. With a gateway, the requests it saw arrive."""
    in_flight = slide_window(state.in_flight, fleet.now, load.running + load.waiting, window)
    leaving = [r.finished_rate if r.finished_rate is not None else r.first_token_rate for r in fresh]
    if gateway.requests is not None:  # measured as requests arrive: a rise just after a jump is taken at once
        rising_now = gateway.jumped or ((rising or gateway.rising) and config.fast_rise)
        rate, burst = rate_estimate(state.request_rate, gateway.requests, elapsed, rising_now)
    elif any(v is not None for v in leaving):
        observed = conserved_request_rate(sum_known(leaving), in_flight)
        if warming_up(state.in_flight, fleet.now, window):
            rate, burst = observed, False  # a rate window not yet seen: rising from nothing is no burst
        else:
            rate, burst = rate_estimate(state.request_rate, observed, elapsed, rising and config.fast_rise)
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
    objective_tokens = config.ttft_objective_seconds(prompt_tokens, prompt_tokens / per_replica) * per_replica
    busy = sum(
        1.0
        if _blocks_new_arrivals(config, tokens, replica.waiting or 0.0, objective_tokens)
        else min(1.0, (tokens + excess / len(fresh)) / drain)
        for tokens, replica in zip(local, fresh, strict=True)
    )
    utilisation = config.prefill_utilisation(prompt_tokens, per_replica)
    arrival_replicas = arrivals / (utilisation * per_replica)
    return PrefillTerm(
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


@dataclass(frozen=True)
class DecodeTerm:
    replicas: float
    output_rate: float  # output tokens arriving per second: the request rate x the output per request
    per_replica: float  # output tokens/s one replica emits with the batch it can run
    batch: float  # sequences per rank: the engine's cap, or fewer where a step would miss the ITL objective
    step_seconds: float  # one target step of that batch
    tokens_per_step: float  # per sequence: the acceptance length with a draft, else 1


def decode_term(
    config: PolicyConfig,
    request_rate: float,
    prompt_tokens: float,
    output_tokens: float,
    tokens_per_step: float,
) -> DecodeTerm:
    """Output tokens arriving per second over what a replica decodes, at the KV target (the batch's sequences are the
    sequence count's twin of the KV's tokens). A target step costs the idle step (the weights read once) + a share per
    sequence for every token it computes (1 + the drafted tokens it verifies with speculative decoding,
    `verified_per_step`) + a share per context token (each sequence's KV is read once a step, whatever it verifies):
    the catalog's priors. It emits `tokens_per_step` tokens a sequence, the acceptance length with a draft. A rank
    runs at most MAX_DECODE_BATCH_PER_RANK sequences, and fewer where a larger batch's step would give each token
    more than the ITL objective (spec.autoscaling.slo.itl, at the sequences' mean context). So a draft lets a
    sequence decode, and hold its slot, for 1/acceptance of the steps: nearly that much faster for a small batch,
    less as verifying the drafts makes a large batch's step dearer. How many sequences fit in KV is the KV term's."""
    context = prompt_tokens + output_tokens / 2.0
    verified = config.verified_per_step
    per_sequence = verified * DECODE_SECONDS_PER_SEQUENCE + DECODE_SECONDS_PER_CONTEXT_TOKEN * context
    base = config.decode_step_seconds
    itl_bound = config.slo.itl_seconds((base + per_sequence) / tokens_per_step)
    batch = max(1.0, min(float(MAX_DECODE_BATCH_PER_RANK), (tokens_per_step * itl_bound - base) / per_sequence))
    step = base + batch * per_sequence
    per_replica = config.ranks_per_replica * batch * tokens_per_step / step
    output_rate = request_rate * output_tokens
    replicas = output_rate / (config.kv_target * per_replica)
    return DecodeTerm(replicas, output_rate, per_replica, batch, step, tokens_per_step)

"""The supply side: the KV capacity the policy plans with (the plan's, checked against what the engines report) and
the prefill throughput (the prior, or what the engines' own counters taught)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from m3fleet.autoscaling.policy.config import PolicyConfig
from m3fleet.autoscaling.policy.estimates import median, positive_ratio
from m3fleet.autoscaling.policy.state import PolicyState
from m3fleet.autoscaling.signals import ReplicaSignals
from m3fleet.text import tokens as format_tokens

LEARNING_SECONDS: Final = 3600.0  # each tick forgets elapsed/this of the learned bound; a longer gap all of it
LEARNED_AFTER: Final = 3  # saturated observations before the learned throughput replaces the prior
LEARN_CLAMP: Final = 4.0  # the learned throughput stays within [prior / 4, prior x 4]
# The engines observe a request's prompt length when it finishes, its TTFT at its first token: once a burst of long
# prompts ends, the prompt histogram still fills with its long requests finishing while the TTFTs are chat's.
# A finished mean this many times the mean prompt of the requests that reached a first token (the prompt-token
# and first-token counters) says the two histograms saw different requests: the replica teaches nothing then.
FINISHED_PROMPT_SKEW: Final = 2.0
# Finished requests a replica's prompt and TTFT histograms need in the window before their means teach anything.
LEARN_MIN_REQUESTS: Final = 3


@dataclass(frozen=True)
class Capacity:
    replica: float  # KV tokens per replica the policy plans with
    rank: float  # KV tokens per KV pool (DP rank, or the TP group)
    status: dict[str, Any]
    warning: str | None


def acceptance_length(config: PolicyConfig, fresh: Sequence[ReplicaSignals]) -> dict[str, Any] | None:
    """Speculative decoding's tokens per target forward pass: the median the replicas' own counters measured, else
    the plan's prior (catalog.speculative: 2.7 for the EAGLE3 draft, from its model card; 1 for MTP, unpublished).
    It sets how many tokens a decode step emits, so how long a sequence decodes at a given step time (the decode
    term, `tokens_per_step`); None without a draft."""
    if config.acceptance_length_prior is None:
        return None
    measured = [r.acceptance_length for r in fresh if r.acceptance_length]
    if not measured:
        return {"tokensPerStep": config.acceptance_length_prior, "source": "prior"}
    return {"tokensPerStep": round(median(measured), 3), "source": "engines", "prior": config.acceptance_length_prior}


def tokens_per_step(capacity: Capacity) -> float:
    """Tokens a decode step emits per sequence: the acceptance length `checked_capacity` reported (measured, else the
    prior), 1 without a draft."""
    speculative = capacity.status.get("acceptanceLength")
    return float(speculative["tokensPerStep"]) if speculative else 1.0


def checked_capacity(config: PolicyConfig, fresh: Sequence[ReplicaSignals]) -> Capacity:
    """The engines' reported capacity where it agrees with the plan within `capacity_margin`; otherwise the
    smaller of the two, and a warning (a mis-combined per-rank series or an engine configured unlike the
    plan must not silently size the fleet)."""
    plan_cap, plan_rank = config.kv_tokens_per_replica, config.kv_tokens_per_rank
    status: dict[str, Any] = {"planTokensPerReplica": round(plan_cap), "planTokensPerRank": round(plan_rank)}
    speculative = acceptance_length(config, fresh)
    if speculative is not None:
        status["acceptanceLength"] = speculative
    reported = [r.kv_capacity_tokens for r in fresh if r.kv_capacity_tokens]
    if not reported:
        return Capacity(plan_cap, plan_rank, {**status, "source": "plan"}, None)
    seen = median(reported)
    ranks = [r.kv_capacity_tokens_per_rank for r in fresh if r.kv_capacity_tokens_per_rank]
    seen_rank = median(ranks) if ranks else plan_rank * seen / plan_cap
    ratio, rank_ratio = seen / plan_cap, seen_rank / plan_rank
    status.update(reportedTokensPerReplica=round(seen), reportedTokensPerRank=round(seen_rank), ratio=round(ratio, 3))
    margin = config.capacity_margin
    if abs(ratio - 1.0) <= margin and abs(rank_ratio - 1.0) <= margin:
        return Capacity(seen, seen_rank, {**status, "source": "engines", "mismatch": False}, None)
    message = (
        f"engines report {format_tokens(seen)} KV tokens per replica ({format_tokens(seen_rank)} per rank), "
        f"{ratio:.2f}x the plan's {format_tokens(plan_cap)} ({format_tokens(plan_rank)} per rank), "
        f"more than {margin:.0%} apart: planning with the smaller; "
        "check the engine's memory and KV-dtype flags against the plan, and the metrics' labels"
    )
    return Capacity(
        min(seen, plan_cap),
        min(seen_rank, plan_rank),
        {**status, "source": "smaller of plan and engines", "mismatch": True, "message": message},
        message,
    )


@dataclass(frozen=True)
class Evidence:
    """What the engines showed of the prefill throughput: a prior above `ceiling` is discredited and `measured`
    planned with instead."""

    ceiling: float
    measured: float
    shown_by: str


@dataclass(frozen=True)
class LearnedPrefill:
    per_replica: float  # prompt tokens/s one replica prefills, to plan with
    learned: float | None  # the learned floor to keep
    samples: int  # observations behind the floor
    cap_ticks: int  # consecutive ticks with a chat bound from the engines' prefill time (`_chat_bounds`)
    status: dict[str, Any]


def learned_prefill(
    config: PolicyConfig, state: PolicyState, fresh: Sequence[ReplicaSignals], elapsed: float | None
) -> LearnedPrefill:
    """The prefill throughput to plan with: the prior, lifted or replaced by what the engines' counters show.

    Learned on replicas serving long prompts (for chat, the API server's per-request time and scheduling are a
    large part of TTFT). Two lower bounds of a replica's prefill throughput: the prompt tokens
    it prefilled per second (it cannot go faster; tight when it is busy), and mean prompt / mean (TTFT - queue time)
    (a request's prefill alone is at least its prompt over the throughput; the engines prefill one prompt at a time,
    after its queue time, so only decode steps sharing its iterations slow it; a replica whose finished requests are
    far longer than those reaching a first token is skipped, FINISHED_PROMPT_SKEW). Their best over replicas is kept
    and lifts a pessimistic prior. It is forgotten as time passes, whether or not long prompts arrive (a new image
    or shape may be slower): each tick keeps 1 - elapsed/LEARNING_SECONDS of it, so yesterday's bound, kept in
    status overnight, is gone at today's first tick and the prior stands again until LEARNED_AFTER new observations.
    A prior above the busy bound and `learn_slack` x the idle bound (a loaded replica's TTFT understates its speed)
    is discredited: the policy plans with the learned bound instead, as it does when the prior is below it (within
    the slack the prior stands). Clamped to [prior / LEARN_CLAMP, prior x LEARN_CLAMP]; nothing changes before
    LEARNED_AFTER observations.

    Chat alone discredits an optimistic prior too, where the engine times each request's prefill itself (vLLM's
    `request_prefill_time_seconds`, SGLang's `per_stage_req_latency_seconds{stage="prefill_forward"}`: first
    scheduling to first token, no queue and no API-server time;
    `_chat_bounds`), LEARNED_AFTER ticks in a row: a fleet serving only chat never shows a long prompt, and a prior
    twice the truth would plan its bursts at half the replicas they need for as long as it runs. It lifts no
    pessimistic prior (that would replan every chat fleet at a speed the chat targets were not measured at)."""
    prior = config.prefill_tokens_per_second
    learned, samples = state.prefill_rate, state.prefill_samples
    cap: float | None = None

    def clamp(value: float) -> float:
        return min(LEARN_CLAMP * prior, max(prior / LEARN_CLAMP, value))

    if learned is not None and elapsed is not None:
        learned *= 1.0 - min(1.0, elapsed / LEARNING_SECONDS)
        if learned <= 0.0:
            learned, samples = None, 0
    chat: list[tuple[float, float]] = []  # (floor, cap) per replica serving chat past the roofline's knee
    if config.learn_prefill:
        floors, caps = [], []
        for r in fresh:
            p, t, q = r.prompt_tokens, r.ttft_seconds, r.queue_seconds
            if p is None or p.count < LEARN_MIN_REQUESTS:
                continue
            mean_prompt = p.total / p.count
            if mean_prompt < config.long_prompt_tokens:
                bounds = _chat_bounds(config, r, mean_prompt)
                if bounds is not None:
                    chat.append(bounds)
                continue
            if t is None or t.count < LEARN_MIN_REQUESTS:
                continue
            first_token_prompt = positive_ratio(r.prompt_tokens_rate or 0.0, r.first_token_rate or 0.0)
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
    cap_ticks = state.prefill_cap_ticks + 1 if chat else 0
    learned_ready = learned is not None and samples >= LEARNED_AFTER
    # A prior above the ceiling is discredited and the policy plans with the measurement, as it does when the prior
    # is below it (the learned floor lifts it).
    evidence: Evidence | None = None
    if learned_ready and learned is not None and cap is not None:
        evidence = Evidence(cap, learned, "long prompts' TTFT")
    elif chat and cap_ticks >= LEARNED_AFTER:
        ceiling, measured = clamp(max(c for _, c in chat)), clamp(max(f for f, _ in chat))
        evidence = Evidence(ceiling, measured, "chat requests' prefill time")
    discredited = evidence is not None and prior > evidence.ceiling
    used = evidence.measured if evidence is not None and discredited else prior
    if learned_ready and learned is not None:
        used = max(used, learned)
    status: dict[str, Any] = {
        "priorTokensPerSecond": round(prior),
        "learnedTokensPerSecond": None if learned is None else round(learned),
        "samples": samples,
        "source": "prior" if used == prior else "learned",
    }
    if evidence is not None and discredited:
        status.update(priorAboveTokensPerSecond=round(evidence.ceiling), discreditedBy=evidence.shown_by)
    return LearnedPrefill(used, learned, samples, cap_ticks, status)


def _chat_bounds(config: PolicyConfig, replica: ReplicaSignals, mean_prompt: float) -> tuple[float, float] | None:
    """(floor, ceiling) of the replica's prefill throughput from its finished chat requests: their mean prompt over
    their mean prefill time (the engine's own: vLLM's observed at finish as the prompt histogram is, so the two means
    are of the same requests; SGLang's when the prefill ends, a chat request's few seconds before it finishes, so
    over the histogram window nearly the same requests) or the busy bound, whichever is higher; the ceiling
    `learn_slack` x the first. Only for prompts past the roofline's knee, prior x decode step tokens: a shorter
    prompt's forward pass takes a step whatever its length (the weights are read once a pass), so its prefill time
    measures the step, not the throughput. None without the engine's prefill-time histogram (TensorRT-LLM has
    none) or enough requests."""
    h = replica.prefill_seconds
    if h is None or h.count < LEARN_MIN_REQUESTS or h.total <= 0:
        return None
    if mean_prompt < config.prefill_tokens_per_second * config.decode_step_seconds:
        return None
    idle, busy = mean_prompt / (h.total / h.count), replica.prompt_tokens_rate or 0.0
    return max(idle, busy), max(config.learn_slack * idle, busy)

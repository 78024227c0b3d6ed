"""Arrivals as a gateway in front of the engines recorded them (spec.autoscaling.gateway), in prompt tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from m3fleet.autoscaling.policy.estimates import RISE_WINDOWS, SHIFT, Load, positive_ratio, sum_known
from m3fleet.autoscaling.policy.state import PolicyState
from m3fleet.autoscaling.signals import FleetState, MetricsSnapshot, ReplicaSignals

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


@dataclass(frozen=True)
class Arrivals:
    """What a gateway saw arrive (spec.autoscaling.gateway), in prompt tokens; the fields to keep in the state."""

    requests: float | None = None  # requests/s (None: no gateway, or its series answered nothing)
    prompt_tokens: float | None = None  # prompt tokens/s
    recent_prompt: float | None = None  # mean prompt tokens of the requests in the last two samples
    jumped: bool = False  # the last two samples are a new level (see gateway_arrivals): a burst is starting
    rising: bool = False  # within RISE_WINDOWS rate windows of a jump: rises are taken at once
    bytes_per_token: float | None = None  # measured, to keep
    jump_time: float | None = None  # when the arrivals last jumped, to keep
    since: float | None = None  # since when the gateway's series have answered, to keep
    status: dict[str, Any] | None = None


def gateway_arrivals(
    state: PolicyState,
    snapshot: MetricsSnapshot,
    fleet: FleetState,
    fresh: Sequence[ReplicaSignals],
    load: Load,
    elapsed: float | None,
) -> Arrivals:
    """The gateway's arrivals in prompt tokens: its request bytes over the measured bytes per token. The ratio is
    measured while every ready replica is fresh and nothing queues (then what arrived in the rate window is what
    the engines prefilled in it), smoothed over BYTES_PER_TOKEN_SECONDS; the prior stands until then. The last
    two samples replace the rate window when they are GATEWAY_JUMP times above it and SHIFT times what the estimate
    says arrives: a burst's start."""
    g = snapshot.gateway
    measured = state.bytes_per_token
    if g is None or g.request_rate is None or g.bytes_rate is None:
        return Arrivals(bytes_per_token=measured, jump_time=state.gateway_jump)
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
        return Arrivals(bytes_per_token=measured, jump_time=state.gateway_jump, since=since, status=status)
    # Per request on each side (bytes per arriving request over prompt tokens per first token), not rate over rate:
    # a counter that covers only part of the window (a replica or a gateway just started) under-reads its requests
    # as much as its bytes or tokens, so the ratio of means stays right where the ratio of rates would not.
    # Nor while the last two samples are GATEWAY_JUMP times off the rate window either way: what arrives is changing,
    # and the engines are still prefilling what arrived before (a burst's first tick would teach its bytes per chat
    # token).
    first_tokens = [r.first_token_rate for r in fresh]
    prefilled = None if None in first_tokens else positive_ratio(load.prompt_rate, sum_known(first_tokens))
    arriving = positive_ratio(g.bytes_rate, g.request_rate)
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
    return Arrivals(
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

"""The policy with a gateway in front (spec.autoscaling.gateway): request sizes recorded at arrival."""

from __future__ import annotations

from dataclasses import replace

import pytest

from m3fleet.autoscaling.policy import BYTES_PER_TOKEN_PRIOR, PolicyState, decide
from m3fleet.autoscaling.signals import GatewaySignals

from .snapshots import NOW, ROUND, fleet, replica, snapshot

CHAT = replica(running=6, kv_usage=0.03, prompt_tokens=5_000, request_rate=0.5)  # 2.5k prompt tokens/s
SETTLED = PolicyState(last_time=NOW - 15, prompt_tokens=5_000, request_rate=0.5, bytes_per_token=3.0)


def gateway(requests: float, bytes_: float, recent_requests: float | None = None, recent_bytes: float | None = None):
    return GatewaySignals(
        request_rate=requests,
        bytes_rate=bytes_,
        recent_request_rate=requests if recent_requests is None else recent_requests,
        recent_bytes_rate=bytes_ if recent_bytes is None else recent_bytes,
    )


def test_a_burst_still_queued_is_sized_from_the_gateway_at_once() -> None:
    # The engine has prefilled none of the burst yet: it reports chat. The gateway saw 0.2 requests/s of
    # 300k-token prompts arrive over the last two samples (at 3 bytes per token) on top of chat.
    burst = 0.2 * 300_000 * 3.0
    g = gateway(0.55, 0.5 * 5_000 * 3.0 + burst / 4, recent_requests=0.7, recent_bytes=0.5 * 5_000 * 3.0 + burst)
    queued = replace(CHAT, waiting=3)
    decision, state = decide(ROUND, SETTLED, replace(snapshot(queued), gateway=g), fleet(1))
    t = decision.terms
    arriving = (0.5 * 5_000 + 0.2 * 300_000) / 0.7
    assert t["promptTokensPerRequest"] == pytest.approx(arriving)
    assert t["arrivingPromptTokensPerSecond"] == pytest.approx(0.7 * arriving)
    assert decision.prefill["gateway"]["window"] == "last two samples (a jump)"
    # Without the gateway the same engines say chat: one replica is enough.
    without, _ = decide(ROUND, SETTLED, snapshot(queued), fleet(1))
    assert without.terms["promptTokensPerRequest"] == pytest.approx(5_000)
    assert decision.desired_replicas > without.desired_replicas
    assert state.bytes_per_token == 3.0  # a queue: nothing learned from this tick


def test_a_small_rise_reads_the_rate_window_not_the_last_two_samples() -> None:
    g = gateway(0.5, 7_500, recent_requests=0.6, recent_bytes=12_000)  # 1.6x: noise, not a jump
    decision, _ = decide(ROUND, SETTLED, replace(snapshot(CHAT), gateway=g), fleet(1))
    assert decision.prefill["gateway"]["window"] == "rate window"
    assert decision.prefill["gateway"]["arrivingPromptTokensPerSecond"] == round(7_500 / 3.0)


def test_a_busy_quarter_minute_inside_a_burst_is_no_jump() -> None:
    # Long prompts already arrive at 0.5/s of 200k tokens (3 bytes each): 300 kB/s. Heavy-tailed prompts come in
    # clumps, so the last two samples at 2.3x the rate window are no new level: below 4x the estimate.
    in_burst = replace(SETTLED, prompt_tokens=200_000, request_rate=0.5)
    g = gateway(0.5, 300_000, recent_requests=1.0, recent_bytes=700_000)
    decision, state = decide(ROUND, in_burst, replace(snapshot(CHAT), gateway=g), fleet(4))
    assert decision.prefill["gateway"]["window"] == "rate window"
    assert state.gateway_jump is None
    # From chat's level the same two samples are a jump, and its time is kept (rises are then taken at once).
    decision, state = decide(ROUND, SETTLED, replace(snapshot(CHAT), gateway=g), fleet(4))
    assert decision.prefill["gateway"]["window"] == "last two samples (a jump)"
    assert state.gateway_jump == NOW


@pytest.mark.parametrize(
    ("state", "load", "expected", "source"),
    [
        # Nothing measured, nothing to measure from (a queue): the prior.
        (PolicyState(), {"waiting": 2}, None, "prior"),
        # First measurement, taken as it is: 10k bytes/s over 2.5k prompt tokens/s prefilled.
        (PolicyState(), {}, 4.0 * 10_000 / 10_000, "measured"),
        # Then smoothed: 15 s of 600 s towards the new sample.
        (SETTLED, {}, 3.0 + 15 / 600 * (4.0 - 3.0), "measured"),
        # A replica without fresh metrics: its prefills are missing from the sum, so no sample.
        (SETTLED, {"ready": 2}, 3.0, "measured"),
    ],
    ids=["prior", "first", "smoothed", "a-replica-unmeasured"],
)
def test_bytes_per_token_is_measured_while_nothing_queues(
    state: PolicyState, load: dict[str, float], expected: float | None, source: str
) -> None:
    ready = int(load.pop("ready", 1))
    r = replace(CHAT, **load)
    g = gateway(0.5, 10_000)
    decision, new = decide(ROUND, state, replace(snapshot(r), gateway=g), fleet(ready))
    assert new.bytes_per_token == (pytest.approx(expected) if expected is not None else None)
    used = expected if expected is not None else BYTES_PER_TOKEN_PRIOR
    assert decision.prefill["gateway"]["source"] == source
    assert decision.prefill["gateway"]["arrivingPromptTokensPerSecond"] == round(10_000 / used)


def test_the_measured_ratio_is_kept_in_status() -> None:
    _, state = decide(ROUND, SETTLED, replace(snapshot(CHAT), gateway=gateway(0.5, 7_500)), fleet(1))
    assert PolicyState.from_dict(state.to_dict()).bytes_per_token == state.bytes_per_token


def test_without_gateway_series_the_engines_decide_as_before() -> None:
    empty = replace(snapshot(CHAT), gateway=GatewaySignals())  # configured, but its query answered nothing
    with_empty, _ = decide(ROUND, SETTLED, empty, fleet(1))
    without, _ = decide(ROUND, SETTLED, snapshot(CHAT), fleet(1))
    assert with_empty.terms == without.terms
    assert "gateway" not in with_empty.prefill

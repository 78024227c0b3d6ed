"""The policy with a gateway in front (spec.autoscaling.gateway): request sizes recorded at arrival."""

from __future__ import annotations

from dataclasses import replace

import pytest

from m3fleet.autoscaling.policy import BYTES_PER_TOKEN_PRIOR, PolicyState, decide
from m3fleet.autoscaling.signals import GatewaySignals
from tests.support.autoscaling.snapshots import NOW, ROUND, fleet, replica, snapshot

CHAT = replica(running=6, kv_usage=0.03, prompt_tokens=5_000, request_rate=0.5)  # 2.5k prompt tokens/s
# A gateway answering for ten minutes: its rate window is covered (see the warm-up test below).
ANSWERING = NOW - 600
SETTLED = PolicyState(
    last_time=NOW - 15, prompt_tokens=5_000, request_rate=0.5, bytes_per_token=3.0, gateway_since=ANSWERING
)


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
        (PolicyState(gateway_since=ANSWERING), {"waiting": 2}, None, "prior"),
        # First measurement, taken as it is: 10k bytes/s over 2.5k prompt tokens/s prefilled.
        (PolicyState(gateway_since=ANSWERING), {}, 4.0 * 10_000 / 10_000, "measured"),
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


def test_bytes_per_token_are_per_request_so_a_young_counter_does_not_skew_them() -> None:
    # The replica started 15 s into the 60 s window: its counters read a quarter of its prompt tokens and of its
    # first tokens. The gateway's, older, read all: 0.5 requests/s of 15k bytes (5k tokens at 3 bytes each).
    young = replica(running=6, kv_usage=0.03, prompt_tokens=5_000, request_rate=0.125)
    fresh = PolicyState(last_time=NOW - 15, gateway_since=ANSWERING)
    _, state = decide(ROUND, fresh, replace(snapshot(young), gateway=gateway(0.5, 7_500)), fleet(1))
    assert state.bytes_per_token == pytest.approx(3.0)  # rate over rate would say 12
    # Without a first-token rate there is nothing to divide by: nothing is measured.
    unpaired = replace(young, first_token_rate=None)
    _, state = decide(ROUND, fresh, replace(snapshot(unpaired), gateway=gateway(0.5, 7_500)), fleet(1))
    assert state.bytes_per_token is None


def test_nothing_is_measured_while_arrivals_change() -> None:
    # A burst's first tick: the gateway's last two samples are 3x its rate window, which holds some of the burst
    # too; the engines, with nothing queued yet, still prefill chat. Their ratio now would be 7.3 (the burst's bytes
    # over chat's tokens), not 3.
    burst = gateway(0.55, 20_000, recent_requests=0.7, recent_bytes=60_000)
    decision, state = decide(ROUND, SETTLED, replace(snapshot(CHAT), gateway=burst), fleet(1))
    assert decision.prefill["gateway"]["window"] == "last two samples (a jump)"
    assert state.bytes_per_token == SETTLED.bytes_per_token
    # The last two samples far below the rate window (the burst ending) are no time to measure either.
    ending = gateway(0.5, 60_000, recent_requests=0.5, recent_bytes=7_500)
    _, state = decide(ROUND, SETTLED, replace(snapshot(CHAT), gateway=ending), fleet(1))
    assert state.bytes_per_token == SETTLED.bytes_per_token


def test_the_measured_ratio_is_kept_in_status() -> None:
    _, state = decide(ROUND, SETTLED, replace(snapshot(CHAT), gateway=gateway(0.5, 7_500)), fleet(1))
    kept = PolicyState.from_dict(state.to_dict())
    assert (kept.bytes_per_token, kept.gateway_since) == (state.bytes_per_token, ANSWERING)


def test_a_gateway_is_used_once_its_series_cover_a_rate_window() -> None:
    # A gateway that just started: over the 60 s rate window its counters read a quarter of what arrives (they
    # cover 15 s of it), the last two samples all of it, and 2.5k prompt tokens/s were prefilled. Taken as they
    # are, that is a jump of 4x and 0.75 bytes per token (a quarter of the truth, 3).
    g = gateway(0.125, 0.125 * 5_000 * 3.0, recent_requests=0.5, recent_bytes=0.5 * 5_000 * 3.0)
    fresh = PolicyState(last_time=NOW - 15, prompt_tokens=5_000, request_rate=0.5)
    decision, state = decide(ROUND, fresh, replace(snapshot(CHAT), gateway=g), fleet(1))
    assert state.gateway_since == NOW and state.gateway_jump is None and state.bytes_per_token is None
    waiting = "not yet used: its series have answered for 0s of the 60s rate window"
    assert decision.prefill["gateway"]["window"] == waiting
    without, _ = decide(ROUND, fresh, snapshot(CHAT), fleet(1))
    assert decision.terms == without.terms  # the engines decided
    # A rate window later the counters cover it: read as they are, and the ratio is measured.
    later, now = replace(state, last_time=NOW + 45), NOW + 60
    covered = replace(snapshot(replace(CHAT, sample_time=now), time=now), gateway=gateway(0.5, 0.5 * 5_000 * 3.0))
    decision, state = decide(ROUND, later, covered, fleet(1, now=now))
    assert decision.prefill["gateway"]["window"] == "rate window"
    assert state.bytes_per_token == pytest.approx(3.0) and state.gateway_since == NOW
    # Series that stop answering (a gateway restarting) start the wait again when they come back.
    silent = replace(snapshot(replace(CHAT, sample_time=now + 15), time=now + 15), gateway=GatewaySignals())
    _, gone = decide(ROUND, replace(state, last_time=now), silent, fleet(1, now=now + 15))
    assert gone.gateway_since is None


def test_without_gateway_series_the_engines_decide_as_before() -> None:
    empty = replace(snapshot(CHAT), gateway=GatewaySignals())  # configured, but its query answered nothing
    with_empty, _ = decide(ROUND, SETTLED, empty, fleet(1))
    without, _ = decide(ROUND, SETTLED, snapshot(CHAT), fleet(1))
    assert with_empty.terms == without.terms
    assert "gateway" not in with_empty.prefill

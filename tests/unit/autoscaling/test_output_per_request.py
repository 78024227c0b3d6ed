"""Output tokens per request while the population in flight grows: a new fleet's first finished requests are its
shortest answers, so tokens decoded over finishes alone is many times any answer (the decode term then ordered 3-8
replicas on every `long-answers` seed within 40 s of the start, where two serve it); over the arrivals
(conservation) it is not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from m3fleet.autoscaling.policy import PolicyState, decide
from m3fleet.autoscaling.policy.estimates import output_per_request
from m3fleet_simulator.whatif import prepare, run_context_aware
from tests.support.autoscaling.snapshots import NOW, ROUND, fleet, replica, snapshot

TOKENS_PER_SECOND = 27.0  # per decoding sequence: a ~37 ms step
ARRIVALS = 3.6  # requests/s, each answering ~1,500 tokens: a lifetime of ~55 s


def test_steady_it_is_tokens_over_finishes_and_growing_over_arrivals() -> None:
    assert output_per_request(3_000.0, 2.0, 2.0) == 1_500.0  # steady: finishes = arrivals
    assert output_per_request(3_000.0, 0.2, 4.0) == 750.0  # growing: not 15,000 over the first short finishes
    assert output_per_request(3_000.0, 3.0, 1.0) == 1_000.0  # shrinking: the finishes are the larger count
    assert output_per_request(0.0, 1.0, 1.0) is None


def _first_minute_tick(state: PolicyState, seconds: float) -> tuple[dict[str, float], int, PolicyState]:
    """A new replica `seconds` into a decode-bound load: the population grows by the arrivals (nothing has decoded
    a whole answer yet) and only the shortest answers finish, 0.2 a second."""
    running = ARRIVALS * seconds
    signals = replace(
        replica(running=running, kv_usage=running * 700 / 1_000_000, prompt_tokens=400, request_rate=0.2),
        first_token_rate=ARRIVALS,
        generation_tokens_rate=running * TOKENS_PER_SECOND,
    )
    now = NOW - 60 + seconds
    decision, state = decide(ROUND, state, snapshot(signals, time=now), fleet(1, now=now))
    return decision.terms, decision.desired_replicas, state


def test_a_new_fleets_first_finishes_do_not_inflate_the_answers() -> None:
    state = PolicyState()
    for seconds in (15.0, 30.0, 45.0):
        terms, desired, state = _first_minute_tick(state, seconds)
    # 162 sequences decoding at 27 tokens/s is 4,374 tokens/s, 1,215 for each of 3.6 arrivals a second. Over the
    # 0.2 finishes a second it would read 21,870 tokens an answer: eighteen times the arrivals' figure.
    assert terms["outputTokensPerRequest"] == pytest.approx(45.0 * ARRIVALS * TOKENS_PER_SECOND / ARRIVALS, rel=0.2)
    assert terms["outputTokensPerRequest"] < 1_500
    assert desired == 1


def test_long_answers_starts_with_the_replicas_the_load_needs() -> None:
    """The simulator's `long-answers` from one replica at a 90 s cold start: at 3.6 requests/s of ~1,700-token
    answers two replicas hold the batch at the ITL bound; the first minutes' finishes ordered eight (maxReplicas)."""
    setup = prepare("long-answers", seed=32, minutes=5, cold_start=90)
    result = run_context_aware(setup)
    assert result.peak_replicas == 2

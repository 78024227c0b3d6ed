"""Prefix caching in the engine model and the routers in front of it (the routing benchmark's pieces)."""

from __future__ import annotations

from m3fleet_simulator.fleet import PerfModel, SimRequest
from m3fleet_simulator.prefix import BLOCK_TOKENS, ChainRequest, PrefixCache
from m3fleet_simulator.routing import EndpointPicker, PrefixEngine, RoundRobin, RoutedSimulation, Session, Turn
from tests.support.autoscaling.plans import sample_plan

SHARED = ("app", 0)


def chain(session: int, history: int, shared: int = 1024) -> tuple[tuple[object, int], ...]:
    return ((SHARED, shared), (("session", session), history))


def test_only_whole_blocks_of_a_chain_are_reused() -> None:
    cache = PrefixCache(capacity_blocks=100)
    assert cache.match(chain(1, 1000)) == 0
    cache.insert(chain(1, 1000))
    assert cache.match(chain(1, 1000)) == (1024 + 1000) // BLOCK_TOKENS * BLOCK_TOKENS
    assert cache.match(chain(1, 5000)) == (1024 + 1000) // BLOCK_TOKENS * BLOCK_TOKENS  # the history grew past it
    assert cache.match(chain(2, 1000)) == 1024  # another session behind the same system prompt
    assert cache.match(chain(1, 1000), limit=700) == 700


def test_a_block_straddling_two_segments_is_the_later_ones() -> None:
    cache = PrefixCache(capacity_blocks=100)
    cache.insert(chain(1, 300, shared=200))  # blocks end at 127 (shared), 255 and 383 (the session's)
    assert cache.match(chain(1, 300, shared=200)) == 384
    assert cache.match(chain(2, 300, shared=200)) == 128


def test_eviction_trims_the_least_recently_used_segment_from_its_tail_and_spares_pinned_ones() -> None:
    cache = PrefixCache(capacity_blocks=20)
    cache.insert(chain(1, 1024, shared=0))  # 8 blocks
    cache.insert(chain(2, 1024, shared=0))
    cache.pin(chain(1, 1024, shared=0))
    cache.insert(chain(3, 1024, shared=0))  # 24 blocks > 20: session 1 is older but pinned, so 2 loses 4
    assert cache.match(chain(1, 1024, shared=0)) == 1024
    assert cache.match(chain(2, 1024, shared=0)) == 4 * BLOCK_TOKENS
    assert cache.evicted == 4
    cache.unpin(chain(1, 1024, shared=0))
    cache.insert(chain(4, 1024, shared=0))  # now session 1 is the least recently used and unpinned
    assert cache.match(chain(1, 1024, shared=0)) == 0
    assert cache.total <= 20


def sessions(count: int, turns: int, history: int = 20_000, step: int = 2_000) -> list[Session]:
    return [
        Session(
            start=float(s),
            turns=tuple(
                Turn(think=1.0 if t else 0.0, segments=chain(s, history + t * step, shared=8192), output=100)
                for t in range(turns)
            ),
        )
        for s in range(count)
    ]


def routed(router: RoundRobin | EndpointPicker, work: list[Session], replicas: int = 2) -> RoutedSimulation:
    plan = sample_plan()
    sim = RoutedSimulation(plan, PerfModel.from_plan(plan), work, router, replicas=replicas)
    sim.run_all(3600.0)
    return sim


def test_a_cached_prefix_computes_only_the_suffix() -> None:
    sim = routed(EndpointPicker(seed=1), sessions(1, 2), replicas=1)
    engine = sim.replicas[0].engines[0]
    assert isinstance(engine, PrefixEngine)
    first, second = (8192 + 20_000), (8192 + 22_000)
    reused = first + 100 - (first + 100) % BLOCK_TOKENS  # the first turn's prompt and answer, whole blocks
    assert engine.reused == reused
    assert engine.computed == first + second - reused
    ttft = [r.first_token - r.spec.arrival for r in sim.finished if r.first_token is not None]
    assert ttft[1] < ttft[0] / 5


def test_the_picker_keeps_a_session_on_its_replica_and_round_robin_does_not() -> None:
    work = sessions(2, 6)
    picker, spread = routed(EndpointPicker(seed=1), work), routed(RoundRobin(), work)
    for sim in (picker, spread):
        assert len(sim.finished) == 12
    computed = {
        name: sum(e.computed for r in s.replicas for e in r.engines if isinstance(e, PrefixEngine))
        for name, s in (("picker", picker), ("spread", spread))
    }
    assert computed["picker"] < computed["spread"]
    # with the picker every turn after the first reuses its session's history: only the new tokens are computed
    assert computed["picker"] <= 2 * (8192 + 20_000) + 2 * 5 * (2_000 + BLOCK_TOKENS)


def test_the_picker_prefers_the_replica_without_a_queue_when_no_prefix_differs() -> None:
    plan = sample_plan()
    sim = RoutedSimulation(plan, PerfModel.from_plan(plan), sessions(1, 1), EndpointPicker(seed=1), replicas=2)
    busy, idle = sim.replicas
    for i in range(3):
        busy.engines[0].enqueue(SimRequest(ChainRequest(100 + i, 0.0, 400_000, 10, chain(100 + i, 390_000))))
    picker = EndpointPicker(seed=1)
    request = ChainRequest(7, 0.0, 9_000, 10, chain(7, 8_000))
    assert picker.pick(request, [busy, idle]) is idle
    scores = picker.scores(request, [busy, idle])
    assert scores[1] - scores[0] >= 2.0  # the queue scorer alone: weight 2 x (1 - 0)

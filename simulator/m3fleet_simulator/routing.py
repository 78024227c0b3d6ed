"""Request routing in front of a fixed fleet, with prefix caching in the engines. Pure Python, seeded.

Two routers, each given the same sessions:

* **round-robin**: what the fleet's ClusterIP Service gives (kube-proxy in IPVS mode is round-robin; in iptables
  mode it picks a backend at random per connection, which spreads the same way on average); it sees nothing.
* **endpoint picker**: the Gateway API Inference Extension's EPP as its v1.3.0 Helm chart configures it
  (config/charts/inferencepool/templates/epp-config.yaml): `queue-scorer` weight 2, `kv-cache-utilization-scorer`
  weight 2, `prefix-cache-scorer` weight 3, summed, the highest score wins (`max-score-picker`, ties at random).
  The scorers as in pkg/epp/scheduling/framework/plugins: queue = (max - waiting) / (max - min) over the pods (1 when
  all are equal); KV = 1 - kv_cache_usage_perc; prefix = matched blocks / hashed blocks of this request in the
  picker's own index (multi/prefix/plugin.go). With `autoTune` (the default) a block is the engine's block size x 4
  characters, so with M3's 128-token blocks about 128 tokens, and only the first `maxPrefixBlocksToMatch` = 256
  blocks (about 32k tokens) are hashed; the index is an LRU per pod sized to the pod's KV blocks, and a request's
  blocks are added to the chosen pod's index when it is picked (PreRequest), before the engine has computed them.
  The picker reads the engines' gauges every 50 ms (its default refresh); the model reads them live.

Inside a pod with several DP ranks, vLLM's own load balancer picks the rank with the lowest 4 x waiting + running.

Sessions (`Session`) are closed loops: a session starts at a drawn time and sends its next turn a drawn think
time after the previous answer finished, so a slower router does not change the work, only when it is done.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from m3fleet.api.models import Plan, SloSpec
from m3fleet.autoscaling.signals import quantile
from m3fleet_simulator.fleet import Engine, PerfModel, Replica, SimRequest, SimSettings, Simulation
from m3fleet_simulator.prefix import BLOCK_TOKENS, ChainRequest, PrefixCache, Segment, segments_of

EPP_WEIGHTS: Final = {"queue": 2.0, "kv": 2.0, "prefix": 3.0}  # GIE v1.3.0 chart's default profile
EPP_MAX_PREFIX_BLOCKS: Final = 256  # DefaultMaxPrefixBlocks


@dataclass(frozen=True)
class Turn:
    think: float  # seconds after the previous turn's answer (the first turn: after the session's start)
    segments: tuple[Segment, ...]  # the prompt
    output: int

    @property
    def prompt(self) -> int:
        return sum(tokens for _, tokens in self.segments)


@dataclass(frozen=True)
class Session:
    start: float
    turns: tuple[Turn, ...]
    kind: str = ""


class PrefixEngine(Engine):
    """An engine with vLLM's automatic prefix caching over its KV pool: a prompt computes only its uncached suffix;
    full blocks of prompts and outputs stay cached in the free part of the pool until evicted (LRU)."""

    def __init__(self, model: PerfModel, sim: Simulation, replica: Replica) -> None:
        super().__init__(model, sim, replica)
        self.cache = PrefixCache(int(self.cap) // BLOCK_TOKENS)
        self.computed = 0.0  # prompt tokens prefilled (recomputation after a preemption included)
        self.reused = 0.0
        self.busy = 0.0  # seconds with work in the batch

    def advance(self, now: float) -> None:
        if self.prefilling or self.n_dec:
            self.busy += max(0.0, now - self.t)
        super().advance(now)

    def _fit_cache(self) -> None:
        # Cached blocks share the pool with the running requests' KV: decode growth is not cached, the rest is.
        self.cache.capacity = int(self.cap - (self.used() - self.reserved)) // BLOCK_TOKENS

    def _reuse_prefix(self, r: SimRequest) -> int:
        segments = segments_of(r.spec)
        reused = self.cache.match(segments, limit=r.need - 1)  # the last token is always computed
        self.cache.pin(segments)
        self._fit_cache()
        self.cache.insert(segments, limit=r.need)
        self.computed += r.need - reused
        self.reused += reused
        return reused

    def _finish(self, r: SimRequest, now: float) -> None:
        segments = segments_of(r.spec)
        self.cache.unpin(segments)
        key, tokens = segments[-1]
        super()._finish(r, now)
        self._fit_cache()
        self.cache.insert((*segments[:-1], (key, tokens + r.spec.output)))  # the answer's full blocks too

    def _preempt_newest(self) -> None:
        self.cache.unpin(segments_of(next(reversed(self.running.values())).spec))
        super()._preempt_newest()


class Router(Protocol):
    name: str

    def pick(self, request: ChainRequest, replicas: Sequence[Replica]) -> Replica: ...


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self.next = 0

    def pick(self, request: ChainRequest, replicas: Sequence[Replica]) -> Replica:
        replica = replicas[self.next % len(replicas)]
        self.next += 1
        return replica


class EndpointPicker:
    """GIE v1.3.0's EPP with its chart's default scorers and weights (see the module's docstring)."""

    name = "endpoint-picker"

    def __init__(self, seed: int, weights: dict[str, float] | None = None) -> None:
        self.weights = dict(EPP_WEIGHTS if weights is None else weights)
        self.rng = random.Random(f"{seed}:epp-ties")
        self.index: dict[str, PrefixCache] = {}

    def scores(self, request: ChainRequest, replicas: Sequence[Replica]) -> list[float]:
        hashed = self.hashed(request)
        total = sum(tokens for _, tokens in hashed) // BLOCK_TOKENS
        waiting = [sum(len(e.waiting) for e in r.engines) for r in replicas]
        low, high = min(waiting), max(waiting)
        out = []
        for replica, queued in zip(replicas, waiting, strict=True):
            queue = 1.0 if high == low else (high - queued) / (high - low)
            kv = 1.0 - sum(e.used() for e in replica.engines) / sum(e.cap for e in replica.engines)
            index = self.index.get(replica.name)
            prefix = index.match(hashed) // BLOCK_TOKENS / total if index is not None and total else 0.0
            w = self.weights
            out.append(w["queue"] * queue + w["kv"] * kv + w["prefix"] * prefix)
        return out

    @staticmethod
    def hashed(request: ChainRequest) -> tuple[Segment, ...]:
        """The part of the prompt the picker hashes: its first 256 blocks."""
        return _truncate(segments_of(request), EPP_MAX_PREFIX_BLOCKS * BLOCK_TOKENS)

    def pick(self, request: ChainRequest, replicas: Sequence[Replica]) -> Replica:
        scores = self.scores(request, replicas)
        best = max(scores)
        chosen = self.rng.choice([r for r, s in zip(replicas, scores, strict=True) if s == best])
        blocks = sum(int(e.cap) for e in chosen.engines) // BLOCK_TOKENS  # autoTune: the pod's KV blocks
        self.index.setdefault(chosen.name, PrefixCache(blocks)).insert(self.hashed(request))
        return chosen


def _truncate(segments: Sequence[Segment], limit: int) -> tuple[Segment, ...]:
    out: list[Segment] = []
    left = limit
    for key, tokens in segments:
        if left <= 0:
            break
        out.append((key, min(tokens, left)))
        left -= tokens
    return tuple(out)


def dp_rank(replica: Replica) -> Engine:
    """vLLM's DP load balancer inside one pod: the rank with the lowest 4 x waiting + running."""
    return min(replica.engines, key=lambda e: 4 * len(e.waiting) + len(e.running))


@dataclass
class RoutingResult:
    router: str
    requests: int
    finished: int
    met: int
    prefill_computed: float
    prefill_reused: float
    ttft: list[float] = field(repr=False)
    busy_gpu_hours: float
    fleet_gpu_hours: float
    makespan: float
    preemptions: int
    evicted_blocks: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "router": self.router,
            "requests": self.requests,
            "finished": self.finished,
            "prefillTokensComputed": round(self.prefill_computed),
            "prefillTokensReused": round(self.prefill_reused),
            "ttftP50": round(quantile(self.ttft, 0.5), 3) if self.ttft else None,
            "ttftP90": round(quantile(self.ttft, 0.9), 3) if self.ttft else None,
            "sloAttainment": round(self.met / self.requests, 4) if self.requests else None,
            "busyGpuHours": round(self.busy_gpu_hours, 2),
            "fleetGpuHours": round(self.fleet_gpu_hours, 2),
            "makespanSeconds": round(self.makespan, 1),
            "preemptions": self.preemptions,
            "evictedBlocks": self.evicted_blocks,
        }


class RoutedSimulation(Simulation):
    """A fixed fleet of `replicas` prefix-caching engines behind `router`, serving closed-loop `sessions`."""

    def __init__(
        self,
        plan: Plan,
        model: PerfModel,
        sessions: Sequence[Session],
        router: Router,
        *,
        replicas: int,
        slo: SloSpec | None = None,
    ) -> None:
        self.router = router
        self.sessions = sorted(sessions, key=lambda s: s.start)
        self.rids = iter(range(1 << 62))
        end = max((s.start for s in self.sessions), default=0.0)
        first = [self._request(s, 0, s.start + s.turns[0].think) for s in self.sessions]
        super().__init__(
            plan,
            model,
            first,
            None,
            duration=end,
            initial_replicas=replicas,
            cold_starts=(0.0,),
            measured_cold_starts=(0.0,),
            settings=SimSettings(scrape_seconds=600.0),  # no autoscaler reads scrapes here
            slo=slo,
        )
        self.turn_of: dict[int, tuple[Session, int]] = {}
        self.sent: list[ChainRequest] = list(first)  # every turn so far, by arrival event index
        for request, session in zip(first, self.sessions, strict=True):
            self.turn_of[request.rid] = (session, 0)

    def _request(self, session: Session, turn: int, arrival: float) -> ChainRequest:
        t = session.turns[turn]
        return ChainRequest(next(self.rids), arrival, t.prompt, t.output, t.segments)

    def _new_engine(self, replica: Replica) -> Engine:
        return PrefixEngine(self.model, self, replica)

    def _choose(self, request: SimRequest) -> Engine | None:
        serving = self._serving()
        if not serving:
            return None
        assert isinstance(request.spec, ChainRequest)
        return dp_rank(self.router.pick(request.spec, serving))

    def begin(self) -> None:
        for index, request in enumerate(self.sent):
            self._push(request.arrival, self.ARRIVAL, index)

    def _arrive(self, index: int) -> None:
        spec = self.sent[index]
        if spec.prompt + spec.output > self.limit:
            self.rejected += 1
            return
        self.in_flight += 1
        self._route(SimRequest(spec))

    def on_finish(self, r: SimRequest) -> None:
        super().on_finish(r)
        session, turn = self.turn_of.pop(r.spec.rid)
        if turn + 1 < len(session.turns):
            assert r.finish is not None
            request = self._request(session, turn + 1, r.finish + session.turns[turn + 1].think)
            self.turn_of[request.rid] = (session, turn + 1)
            self.sent.append(request)
            self._push(request.arrival, self.ARRIVAL, len(self.sent) - 1)

    def run_all(self, horizon: float) -> RoutingResult:
        """Run until every turn of every session is answered (or `horizon` seconds)."""
        self.begin()
        self.advance(horizon)
        engines = [e for r in self.replicas for e in r.engines if isinstance(e, PrefixEngine)]
        gpus_per_engine = self.plan.gpus_per_replica / max(1, self.plan.data_parallel_size)
        makespan = max((r.finish or 0.0 for r in self.finished), default=0.0)
        return RoutingResult(
            router=self.router.name,
            requests=sum(len(s.turns) for s in self.sessions),
            finished=len(self.finished),
            met=self.met,
            prefill_computed=sum(e.computed for e in engines),
            prefill_reused=sum(e.reused for e in engines),
            ttft=[r.first_token - r.spec.arrival for r in self.finished if r.first_token is not None],
            busy_gpu_hours=sum(e.busy for e in engines) * gpus_per_engine / 3600,
            fleet_gpu_hours=len(self.replicas) * self.plan.gpus_per_replica * makespan / 3600,
            makespan=makespan,
            preemptions=sum(e.c.preemptions for e in engines),
            evicted_blocks=sum(e.cache.evicted for e in engines),
        )

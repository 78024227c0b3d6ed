"""A scenario's load on the closed loop's stand-ins: the simulator's engine model serves a scenario's requests in
real time on exactly the replicas the cluster runs, and each stand-in exports its replica's counters.

`ScenarioLoad` runs a `Simulation` with no autoscaler of its own: its clock is the wall clock since `start()`,
its fleet follows the running pods (a pod that comes up is a replica ready now; a pod that goes drains), the
router shares the requests among them, and a scrape every second gives each pod's reading (running, waiting, KV,
token and request counters, TTFT, prompt-length and prefill-time histograms) in its engine's format. What the
operator sees is then what a fleet under that scenario would export, and what it decides changes which replicas
serve.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from m3fleet.api.models import Plan
from m3fleet_simulator.fleet import PerfModel, PolicyResult, Scrape, SimSettings, Simulation, prefill_observations
from m3fleet_simulator.scenarios import SCENARIOS, Request
from tests.support.autoscaling.prom import REQUEST_LATENCY_BUCKETS, Reading

BURST = "long-context burst"  # the label of a scenario's long-prompt phase


def burst_slice(scenario: str, seed: int, before: float, burst: float, after: float) -> list[Request]:
    """The seed's requests around its long-context burst, as the scenario draws them: `before` seconds of the
    traffic before it, its first `burst` seconds, then the first `after` seconds of the traffic after it, moved
    up to follow the shortened burst. Times start at 0."""
    phases = SCENARIOS[scenario].phases(seed)
    start, end = next((p.start, p.end) for p in phases if p.label == BURST)
    burst = min(burst, end - start)
    kept = []
    for request in SCENARIOS[scenario].requests(seed):
        t = request.arrival
        if start - before <= t < start + burst:
            kept.append(replace(request, rid=len(kept), arrival=t - start + before))
        elif end <= t < end + after:
            kept.append(replace(request, rid=len(kept), arrival=t - end + before + burst))
    return kept


class ScenarioLoad:
    """One fleet's stand-in load: `requests` served by the plan's engine model on the pods that run."""

    def __init__(self, fleet: str, plan: Plan, requests: list[Request]) -> None:
        self.fleet = fleet
        duration = max((r.arrival for r in requests), default=0.0)
        self.sim = Simulation(
            plan,
            PerfModel.from_plan(plan),
            requests,
            None,  # the cluster's autoscaler decides: the fleet follows the pods
            duration=duration,
            initial_replicas=0,
            cold_starts=(0.0,),
            measured_cold_starts=(),
            settings=SimSettings(scrape_seconds=1.0),
        )
        self.sim.begin()
        self._lock = threading.Lock()
        self._started: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """The scenario's t = 0 is now (until then the pods idle and nothing arrives)."""
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def now(self) -> float:
        return 0.0 if self._started is None else time.monotonic() - self._started

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                self.sim.advance(self.now())

    def follow(self, fleet: str, pods: Collection[str]) -> None:
        if fleet != self.fleet:
            return
        with self._lock:
            self.sim.advance(self.now())
            self.sim.follow(pods)

    def reading(self, fleet: str, pod: str, elapsed: float) -> Reading:
        with self._lock:
            replica = self.sim.replica(pod)
            last = replica.scrapes[-1] if replica is not None and replica.scrapes else None
        return self._reading(last)

    def served(self, pod: str) -> float:
        """Prompt tokens the pod's replica has processed."""
        with self._lock:
            replica = self.sim.replica(pod)
            return sum(e.c.prompt_tokens for e in replica.engines) if replica is not None else 0.0

    def result(self) -> PolicyResult:
        with self._lock:
            return self.sim.result()

    def _reading(self, scrape: Scrape | None) -> Reading:
        bounds = tuple(self.sim.prompt_bounds)
        if scrape is None:  # not scraped yet (the clock has not started): an idle engine
            return Reading.idle(self.sim.model.capacity_tokens * self.sim.ranks, bounds)
        return Reading(
            running=scrape.running,
            waiting=scrape.waiting,
            kv_usage=scrape.used / scrape.capacity if scrape.capacity else 0.0,
            capacity_tokens=scrape.capacity,
            prompt_tokens=scrape.prompt_tokens,
            generation_tokens=scrape.generation_tokens,
            finished=scrape.finished,
            preemptions=scrape.preemptions,
            prompt_bounds=bounds,
            prompt_buckets=scrape.prompt_cumulative,
            prompt_sum=scrape.prompt_sum,
            ttft_buckets=scrape.ttft_cumulative,
            ttft_sum=scrape.ttft_sum,
            **self._prefill_time(scrape),
        )

    def _prefill_time(self, scrape: Scrape) -> dict[str, Any]:
        """The engine's per-request prefill-time histogram, observed when its engine observes it (vLLM at a
        request's finish, SGLang at its first token; TensorRT-LLM has none). The simulator keeps the sum and count
        only, which is what the policy reads (their mean), so every observation is exported in the +Inf bucket."""
        if self.sim.prefill_time is None:
            return {}
        count, total = prefill_observations(scrape, self.sim.prefill_time)
        return {"prefill_buckets": (0.0,) * len(REQUEST_LATENCY_BUCKETS) + (float(count),), "prefill_sum": total}

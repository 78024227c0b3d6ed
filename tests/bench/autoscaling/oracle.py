"""The oracle: perfect foresight of the true requests, and how far it is from a true lower bound.

`run_oracle(setup)` provisions, each tick, `headroom` x the replicas the true load needs (prefill work
at the unloaded rate, KV footprint in flight, long requests in flight, sequences in flight over an engine's batch;
`oracle_need`), each replica
ordered one cold start ahead (the exact cold start with `--cold-start`, else the worst case), and
finds the smallest headroom (to 0.01) that meets the SLO for >= 99% of admitted requests.

It is not itself a bound: a cleverer schedule could spend less. `work_lower_bound(setup)` is one no
policy can beat: every admitted request's prefill must run on some replica at the unloaded speed,
every token's KV must be resident for at least its unloaded lifetime, and at least `minReplicas`
replicas run throughout — so replica-seconds >= max(prefill seconds, KV token-seconds / capacity,
minReplicas x duration) (cold starts, queueing and the SLO are left out, which only lowers it).

`run_late_oracle(setup, goal, tick)` asks what foresight the oracle has that no autoscaler can: it
knows nothing of a burst until the `tick`-th autoscaler tick whose scrape follows the burst's start
(then it knows all of it and plans as the oracle does). Before that it runs a standing fleet (minReplicas to
minReplicas + 2) that cannot look past the burst's start. The cheapest such run meeting `goal` says
what the goal asks of an autoscaler that must first see a burst to react to it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from m3fleet.api.models import Plan
from m3fleet_simulator.fleet import PerfModel, PolicyResult
from m3fleet_simulator.scenarios import Request
from m3fleet_simulator.whatif import Setup, simulate

from .baselines import Schedule

ORACLE_GOAL = 0.99
HEADROOM_LOW, HEADROOM_HIGH, HEADROOM_STEP = 1.0, 8.0, 0.01
LATE_STANDING_EXTRA = 2  # the late oracle's standing fleets: minReplicas .. minReplicas + 2


def oracle_need(
    requests: Sequence[Request], model: PerfModel, plan: Plan, duration: float, step: float, window: float = 60.0
) -> list[float]:
    """Replicas each `step` needs, from the true requests at the unloaded rate (full utilisation).

    The largest of: prefill seconds arriving per second (averaged over `window`), the KV footprint
    in flight, the long requests in flight (> half an engine cannot share one), and the sequences in flight over
    the engine's batch (max_num_seqs: beyond it requests wait, whatever KV is free).
    """
    ranks = max(1, plan.data_parallel_size)
    limit = min(plan.max_model_len, model.capacity_tokens)
    cells = math.ceil(duration / step) + 1
    prefill = [0.0] * cells
    kv = [0.0] * cells
    large = [0.0] * cells
    batch = [0.0] * cells
    for r in requests:
        if r.prompt + r.output > limit:
            continue
        work = model.unloaded_prefill_seconds(r.prompt)
        prefill[min(cells - 1, int(r.arrival // step))] += work
        end = r.arrival + work + (r.output - 1) * model.unloaded_itl(r.prompt + r.output / 2)
        footprint = (r.prompt + r.output / 2) / model.capacity_tokens
        is_large = r.prompt + r.output > model.capacity_tokens / 2
        for cell in range(int(r.arrival // step), min(cells, int(end // step) + 1)):
            kv[cell] += footprint
            batch[cell] += 1 / model.max_num_seqs
            if is_large:
                large[cell] += 1
    half = max(1, round(window / step / 2))
    need = []
    for c in range(cells):
        lo, hi = max(0, c - half), min(cells, c + half + 1)
        prefill_rate = sum(prefill[lo:hi]) / ((hi - lo) * step)
        need.append(max(prefill_rate, kv[c], large[c], batch[c]) / ranks)
    return need


def _needed_counts(setup: Setup, headroom: float, requests: Sequence[Request] | None = None) -> tuple[list[int], int]:
    """`headroom` x the need of `requests` (all by default) per tick, within min/max; and how many ticks ahead a
    replica is ordered."""
    step = setup.settings.tick_seconds
    need = oracle_need(
        setup.requests if requests is None else requests,
        setup.model,
        setup.plan,
        setup.duration + setup.settings.tail_seconds,
        step,
    )
    s = setup.scenario
    base = [max(s.min_replicas, min(s.max_replicas, math.ceil(headroom * n - 1e-9))) for n in need]
    return base, math.ceil((setup.worst_cold_start() + step) / step)


def oracle_counts(setup: Setup, headroom: float) -> list[int]:
    base, lead = _needed_counts(setup, headroom)
    return [max(base[i : i + lead + 1]) for i in range(len(base))]


def burst_start(setup: Setup) -> float | None:
    """When the scenario's long-context burst starts (its hidden truth: the benchmark reads it, no policy does)."""
    starts = [p.start for p in setup.scenario.phases(setup.seed) if p.label == "long-context burst"]
    return starts[0] if len(starts) == 1 else None


def late_oracle_counts(setup: Setup, standing: int, start: float, tick: int, headroom: float) -> list[int]:
    """The oracle's counts from the `tick`-th tick whose scrape follows the burst's `start`; before that,
    `standing` replicas or what the requests before the burst need."""
    base, lead = _needed_counts(setup, headroom)
    before, _ = _needed_counts(setup, headroom, [r for r in setup.requests if r.arrival < start])
    settings = setup.settings
    first_scrape = math.ceil(start / settings.scrape_seconds) * settings.scrape_seconds  # the first to see it
    knows = int((first_scrape + settings.tick_offset_seconds) // settings.tick_seconds) + tick - 1  # Schedule's cell
    return [
        max(base[i : i + lead + 1]) if i >= knows else max(standing, *before[i : i + lead + 1])
        for i in range(len(base))
    ]


@dataclass(frozen=True)
class OracleRun:
    result: PolicyResult
    headroom: float
    tried: tuple[tuple[float, float, float], ...]  # (headroom, attainment, GPU-hours)

    @property
    def met_goal(self) -> bool:
        return self.result.slo_attainment >= ORACLE_GOAL


def _search_headroom(setup: Setup, counts: Callable[[float], list[int]], goal: float) -> dict[float, PolicyResult]:
    """Every run tried on the way to the smallest headroom meeting `goal`: doubling out from 1, then
    bisection to 0.01."""
    tried: dict[float, PolicyResult] = {}

    def attempt(headroom: float) -> PolicyResult:
        headroom = round(headroom, 2)
        if headroom not in tried:
            schedule = Schedule(counts(headroom), setup.settings.tick_seconds, setup.clock_offset)
            tried[headroom] = simulate(setup, schedule)
        return tried[headroom]

    low, high = HEADROOM_LOW, HEADROOM_LOW
    while attempt(high).slo_attainment < goal and high < HEADROOM_HIGH:
        low, high = high, min(HEADROOM_HIGH, high * 1.5)
    if attempt(high).slo_attainment >= goal and attempt(low).slo_attainment < goal:
        while high - low > HEADROOM_STEP + 1e-9:
            mid = round((low + high) / 2, 2)
            if mid in (low, high):
                break
            if attempt(mid).slo_attainment >= goal:
                high = mid
            else:
                low = mid
    return tried


def run_oracle(setup: Setup) -> OracleRun:
    """The smallest headroom meeting ORACLE_GOAL."""
    tried = _search_headroom(setup, lambda headroom: oracle_counts(setup, headroom), ORACLE_GOAL)
    meeting = [(h, r) for h, r in tried.items() if r.slo_attainment >= ORACLE_GOAL]
    if meeting:
        headroom, result = min(meeting, key=lambda hr: hr[1].gpu_hours)
    else:
        headroom, result = max(tried.items(), key=lambda hr: hr[1].slo_attainment)
    runs = tuple(sorted((h, r.slo_attainment, r.gpu_hours) for h, r in tried.items()))
    return OracleRun(result, headroom, runs)


@dataclass(frozen=True)
class LateOracleRun:
    tick: int  # knows the burst from this tick whose scrape follows its start (1: the first)
    goal: float
    standing: int  # replicas before it knows
    headroom: float
    result: PolicyResult  # the cheapest run meeting the goal, else the one closest to it

    @property
    def met_goal(self) -> bool:
        return self.result.slo_attainment >= self.goal


def run_late_oracle(setup: Setup, goal: float, tick: int) -> LateOracleRun | None:
    """The cheapest run meeting `goal` over standing fleets minReplicas .. minReplicas + LATE_STANDING_EXTRA;
    None when the scenario has no single long-context burst."""
    start = burst_start(setup)
    if start is None:
        return None
    runs: list[tuple[int, float, PolicyResult]] = []
    lowest = setup.scenario.min_replicas
    for standing in range(lowest, lowest + LATE_STANDING_EXTRA + 1):
        tried = _search_headroom(setup, functools.partial(late_oracle_counts, setup, standing, start, tick), goal)
        runs += [(standing, h, r) for h, r in tried.items()]
    meeting = [run for run in runs if run[2].slo_attainment >= goal]
    standing, headroom, result = (
        min(meeting, key=lambda run: run[2].gpu_hours) if meeting else max(runs, key=lambda run: run[2].slo_attainment)
    )
    return LateOracleRun(tick, goal, standing, headroom, result)


def work_lower_bound(setup: Setup) -> float:
    """GPU-hours no policy can go below on these requests (see the module docstring)."""
    model, plan = setup.model, setup.plan
    ranks = max(1, plan.data_parallel_size)
    limit = min(plan.max_model_len, model.capacity_tokens)
    prefill_seconds = 0.0
    kv_token_seconds = 0.0
    for r in setup.requests:
        if r.prompt + r.output > limit:
            continue
        work = model.unloaded_prefill_seconds(r.prompt)
        prefill_seconds += work
        lifetime = work + (r.output - 1) * model.unloaded_itl(r.prompt + r.output / 2)
        kv_token_seconds += (r.prompt + r.output / 2) * lifetime
    replica_seconds = max(
        prefill_seconds / ranks,
        kv_token_seconds / (model.capacity_tokens * ranks),
        setup.scenario.min_replicas * setup.duration,
    )
    return replica_seconds * plan.gpus_per_replica / 3600.0

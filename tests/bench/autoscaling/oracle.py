"""The oracle: perfect foresight of the true requests, and how far it is from a true lower bound.

`run_oracle(setup)` provisions, each tick, `headroom` x the replicas the true load needs (prefill work
at the unloaded rate, KV footprint in flight, long requests in flight; `oracle_need`), each replica
ordered one cold start ahead (the exact cold start with `--cold-start`, else the worst case), and
finds the smallest headroom (to 0.01) that meets the SLO for >= 99% of admitted requests.

It is not itself a bound: a cleverer schedule could spend less. `work_lower_bound(setup)` is one no
policy can beat: every admitted request's prefill must run on some replica at the unloaded speed,
every token's KV must be resident for at least its unloaded lifetime, and at least `minReplicas`
replicas run throughout — so replica-seconds >= max(prefill seconds, KV token-seconds / capacity,
minReplicas x duration) (cold starts, queueing and the SLO are left out, which only lowers it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from m3fleet.api.models import Plan
from m3fleet.autoscaling.scenarios import Request
from m3fleet.autoscaling.simulate import Setup, simulate
from m3fleet.autoscaling.simulator import PerfModel, PolicyResult

from .baselines import Schedule

ORACLE_GOAL = 0.99
HEADROOM_LOW, HEADROOM_HIGH, HEADROOM_STEP = 1.0, 8.0, 0.01


def oracle_need(
    requests: Sequence[Request], model: PerfModel, plan: Plan, duration: float, step: float, window: float = 60.0
) -> list[float]:
    """Replicas each `step` needs, from the true requests at the unloaded rate (full utilisation).

    The largest of: prefill seconds arriving per second (averaged over `window`), the KV footprint
    in flight, and the long requests in flight (> half an engine cannot share one).
    """
    ranks = max(1, plan.data_parallel_size)
    limit = min(plan.max_model_len, model.capacity_tokens)
    cells = math.ceil(duration / step) + 1
    prefill = [0.0] * cells
    kv = [0.0] * cells
    large = [0.0] * cells
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
            if is_large:
                large[cell] += 1
    half = max(1, round(window / step / 2))
    need = []
    for c in range(cells):
        lo, hi = max(0, c - half), min(cells, c + half + 1)
        prefill_rate = sum(prefill[lo:hi]) / ((hi - lo) * step)
        need.append(max(prefill_rate, kv[c], large[c]) / ranks)
    return need


def oracle_counts(setup: Setup, headroom: float) -> list[int]:
    step = setup.settings.tick_seconds
    need = oracle_need(setup.requests, setup.model, setup.plan, setup.duration + setup.settings.tail_seconds, step)
    s = setup.scenario
    base = [max(s.min_replicas, min(s.max_replicas, math.ceil(headroom * n - 1e-9))) for n in need]
    cold = setup.worst_cold_start()
    lead = math.ceil((cold + step) / step)
    return [max(base[i : i + lead + 1]) for i in range(len(base))]


@dataclass(frozen=True)
class OracleRun:
    result: PolicyResult
    headroom: float
    tried: tuple[tuple[float, float, float], ...]  # (headroom, attainment, GPU-hours)

    @property
    def met_goal(self) -> bool:
        return self.result.slo_attainment >= ORACLE_GOAL


def run_oracle(setup: Setup) -> OracleRun:
    """The smallest headroom meeting ORACLE_GOAL: doubling out from 1, then bisection to 0.01."""
    tried: dict[float, PolicyResult] = {}

    def attempt(headroom: float) -> PolicyResult:
        headroom = round(headroom, 2)
        if headroom not in tried:
            schedule = Schedule(oracle_counts(setup, headroom), setup.settings.tick_seconds, setup.clock_offset)
            tried[headroom] = simulate(setup, schedule)
        return tried[headroom]

    low, high = HEADROOM_LOW, HEADROOM_LOW
    while attempt(high).slo_attainment < ORACLE_GOAL and high < HEADROOM_HIGH:
        low, high = high, min(HEADROOM_HIGH, high * 1.5)
    if attempt(high).slo_attainment >= ORACLE_GOAL and attempt(low).slo_attainment < ORACLE_GOAL:
        while high - low > HEADROOM_STEP + 1e-9:
            mid = round((low + high) / 2, 2)
            if mid in (low, high):
                break
            if attempt(mid).slo_attainment >= ORACLE_GOAL:
                high = mid
            else:
                low = mid
    meeting = [(h, r) for h, r in tried.items() if r.slo_attainment >= ORACLE_GOAL]
    if meeting:
        headroom, result = min(meeting, key=lambda hr: hr[1].gpu_hours)
    else:
        headroom, result = max(tried.items(), key=lambda hr: hr[1].slo_attainment)
    runs = tuple(sorted((h, r.slo_attainment, r.gpu_hours) for h, r in tried.items()))
    return OracleRun(result, headroom, runs)


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

"""Each role of a disaggregated fleet (spec.disaggregation) scaled on its own signal. Pure.

* prefill workers on prompt tokens: those arriving per second plus the queued ones drained within a tick, over
  one worker's prefill throughput (the plan's) at the planner's target utilisation; a TTFT above its objective
  asks for one more worker than running;
* decode workers on KV-cache demand: the tokens the running sequences hold (with their expected growth), over one
  worker's KV pool at `kvCacheUtilization`; an inter-token latency above its objective asks for one more;
* the ratio kept within the plan's bounds: at least the prefill workers the decode workers' completions need at
  full utilisation (fewer would queue prompts without bound), at most twice the planner's derived ratio (more
  would only idle), so a lull in one role's signal cannot strand the other.

The result, per role, is what `status.autoscaling.roles` records: the count, the need behind it and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from m3fleet.api.models import DisaggregationPlan
from m3fleet.disaggregation import PREFILL_TARGET_UTILIZATION

MAX_RATIO_FACTOR: Final = 2.0  # the most prefill workers per decode worker kept: twice the derived ratio


@dataclass(frozen=True)
class RoleTargets:
    """What the roles are sized against: the plan's figures and the spec's targets."""

    prefill_tokens_per_worker: float  # prompt tokens/s one prefill worker prefills
    prefill_utilization: float  # the share of it to plan for
    decode_kv_tokens_per_worker: float
    kv_target: float  # spec.autoscaling.target.kvCacheUtilization
    min_ratio: float  # prefill workers per decode worker at full prefill utilisation
    max_ratio: float
    min_replicas: int  # decode workers
    max_replicas: int
    interval_seconds: float  # a queued prompt is planned to drain within one tick
    ttft_objective_seconds: float | None = None
    itl_objective_seconds: float | None = None

    @classmethod
    def from_plan(
        cls,
        d: DisaggregationPlan,
        kv_target: float,
        min_replicas: int,
        max_replicas: int,
        interval_seconds: float,
        **objectives: float | None,
    ) -> RoleTargets:
        need = d.decode.requests_per_second / d.prefill.requests_per_second
        return cls(
            prefill_tokens_per_worker=d.prefill.tokens_per_second,
            prefill_utilization=PREFILL_TARGET_UTILIZATION,
            decode_kv_tokens_per_worker=float(d.decode.kv_cache_tokens_per_worker),
            kv_target=kv_target,
            min_ratio=need,
            max_ratio=MAX_RATIO_FACTOR * d.derived_ratio,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            interval_seconds=interval_seconds,
            ttft_objective_seconds=objectives.get("ttft_objective_seconds"),
            itl_objective_seconds=objectives.get("itl_objective_seconds"),
        )


@dataclass(frozen=True)
class RoleSignals:
    """One tick's metrics, per role (Prometheus over the role's pods)."""

    prompt_tokens_per_second: float  # arriving at the prefill workers
    queued_prompt_tokens: float  # waiting in them
    decode_kv_tokens: float  # held by the running sequences, with their expected growth
    ttft_seconds: float | None = None  # at the SLO's percentile
    itl_seconds: float | None = None


@dataclass(frozen=True)
class RoleDecision:
    replicas: int
    need: float
    reason: str

    def record(self) -> dict[str, Any]:
        return {"replicas": self.replicas, "need": round(self.need, 3), "reason": self.reason}


def decide_roles(
    targets: RoleTargets, signals: RoleSignals, running: tuple[int, int]
) -> tuple[RoleDecision, RoleDecision]:
    """(prefill, decode) workers for this tick; `running` is (prefill, decode) now."""
    prefill_now, decode_now = running
    decode = _decode(targets, signals, decode_now)
    prefill = _prefill(targets, signals, prefill_now, decode.replicas)
    return prefill, decode


def _decode(t: RoleTargets, s: RoleSignals, now: int) -> RoleDecision:
    need = s.decode_kv_tokens / (t.decode_kv_tokens_per_worker * t.kv_target)
    reason = f"KV demand {s.decode_kv_tokens:.0f} tokens / ({t.decode_kv_tokens_per_worker:.0f} x {t.kv_target})"
    count = math.ceil(need - 1e-9)
    if t.itl_objective_seconds is not None and s.itl_seconds is not None and s.itl_seconds > t.itl_objective_seconds:
        count = max(count, now + 1)
        reason += f"; ITL {s.itl_seconds:.3f}s above its objective {t.itl_objective_seconds:.3f}s: one more"
    clamped = max(t.min_replicas, min(t.max_replicas, count))
    if clamped != count:
        reason += f"; held to [{t.min_replicas}, {t.max_replicas}]"
    return RoleDecision(clamped, need, reason)


def _prefill(t: RoleTargets, s: RoleSignals, now: int, decode: int) -> RoleDecision:
    demand = s.prompt_tokens_per_second + s.queued_prompt_tokens / t.interval_seconds
    need = demand / (t.prefill_tokens_per_worker * t.prefill_utilization)
    reason = (
        f"prompt tokens {s.prompt_tokens_per_second:.0f}/s + queued {s.queued_prompt_tokens:.0f} over "
        f"{t.interval_seconds:g}s, / ({t.prefill_tokens_per_worker:.0f} x {t.prefill_utilization:.2f})"
    )
    count = math.ceil(need - 1e-9)
    ttft, objective = s.ttft_seconds, t.ttft_objective_seconds
    if objective is not None and ttft is not None and ttft > objective:
        count = max(count, now + 1)
        reason += f"; TTFT {ttft:.2f}s above its objective {objective:.2f}s: one more"
    low = math.ceil(decode * t.min_ratio - 1e-9) if decode else 0
    high = max(low, math.ceil(decode * t.max_ratio - 1e-9)) if decode else 0
    bounded = max(low, min(high, count))
    if bounded != count:
        reason += f"; kept within the ratio's bounds [{low}, {high}] for {decode} decode worker(s)"
    return RoleDecision(bounded, need, reason)


def roles_record(prefill: RoleDecision, decode: RoleDecision) -> dict[str, Any]:
    """status.autoscaling.roles."""
    return {"prefill": prefill.record(), "decode": decode.record(), "ratio": f"{prefill.replicas}:{decode.replicas}"}

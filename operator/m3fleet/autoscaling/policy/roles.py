"""Each role of a disaggregated fleet (spec.disaggregation) scaled on its own signal. Pure.

* prefill workers on prompt tokens: those arriving per second plus the queued ones drained within a tick, over
  one worker's prefill throughput (the plan's) at the planner's target utilisation; a TTFT above its objective
  asks for one more worker than running;
* decode workers on KV-cache demand: the tokens the running sequences hold (with their expected growth), over one
  worker's KV pool at `kvCacheUtilization`; an inter-token latency above its objective asks for one more;
* the ratio kept within the plan's bounds: at least the prefill workers the decode workers' completions need at
  full utilisation (fewer would queue prompts without bound), at most twice the planner's derived ratio (more
  would only idle), so a lull in one role's signal cannot strand the other.

A ratio or prefill count the user pins (spec.disaggregation.ratio, prefill.replicas) is kept: the prefill workers
then follow the decode workers by that ratio, or stay at that count, and only the decode workers scale on their signal.

The result, per role, is what `status.autoscaling.roles` records: the count, the need behind it, why and which
signal decided. `role_signals` builds a tick's signals from each role's metrics snapshot (the adapter read over that
role's pods), `Stabilizer` applies the spec's HPA behaviour (the scale-down window) to each role, decode first, and
`role_replicas_to_apply` is what the render uses in act mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from m3fleet.api.models import AutoscalingMode, DisaggregationPlan, MiniMaxM3DeploymentSpec, SloSpec
from m3fleet.autoscaling.policy.hpa import Behavior, stabilize
from m3fleet.autoscaling.signals import Histogram, MetricsSnapshot, ReplicaSignals
from m3fleet.autoscaling.slo import mean_prompt_tokens
from m3fleet.disaggregation import PREFILL_TARGET_UTILIZATION, ROLES, Role

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
    pinned_prefill: int = 0  # spec.disaggregation.prefill.replicas: the prefill workers stay at this count
    pinned_ratio: tuple[int, int] | None = None  # spec.disaggregation.ratio: prefill follow decode by it

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
    # The signal or bound that set the count: prefill promptTokens, ttft, ratioMin, ratioMax, pinnedReplicas,
    # pinnedRatio; decode kvDemand, itl, minReplicas, maxReplicas; either scaleDownWindow or metricsUnavailable.
    decided_by: str = ""

    def record(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "need": round(self.need, 3) if math.isfinite(self.need) else 0.0,
            "reason": self.reason,
            "decidedBy": self.decided_by,
        }


Settle = Callable[[Role, RoleDecision], RoleDecision]  # a decision as kept: partial-metrics floor, scale-down window


def decide_roles(
    targets: RoleTargets, signals: RoleSignals, running: tuple[int, int], settle: Settle | None = None
) -> tuple[RoleDecision, RoleDecision]:
    """(prefill, decode) workers for this tick; `running` is (prefill, decode) now. `settle` (the partial-metrics
    floor, the scale-down window) is applied to decode before prefill is sized against it, so the ratio's bounds
    hold for the decode count that is kept."""
    prefill_now, decode_now = running
    decode = _decode(targets, signals, decode_now)
    decode = settle("decode", decode) if settle is not None else decode
    prefill = _prefill(targets, signals, prefill_now, decode.replicas)
    return (settle("prefill", prefill) if settle is not None else prefill), decode


def _decode(t: RoleTargets, s: RoleSignals, now: int) -> RoleDecision:
    need = s.decode_kv_tokens / (t.decode_kv_tokens_per_worker * t.kv_target)
    reason = f"KV demand {s.decode_kv_tokens:.0f} tokens / ({t.decode_kv_tokens_per_worker:.0f} x {t.kv_target})"
    count, by = math.ceil(need - 1e-9), "kvDemand"
    if t.itl_objective_seconds is not None and s.itl_seconds is not None and s.itl_seconds > t.itl_objective_seconds:
        count, by = max(count, now + 1), "itl"
        reason += f"; ITL {s.itl_seconds:.3f}s above its objective {t.itl_objective_seconds:.3f}s: one more"
    clamped = max(t.min_replicas, min(t.max_replicas, count))
    if clamped != count:
        reason += f"; held to [{t.min_replicas}, {t.max_replicas}]"
        by = "minReplicas" if clamped > count else "maxReplicas"
    return RoleDecision(clamped, need, reason, by)


def _prefill(t: RoleTargets, s: RoleSignals, now: int, decode: int) -> RoleDecision:
    demand = s.prompt_tokens_per_second + s.queued_prompt_tokens / t.interval_seconds
    need = demand / (t.prefill_tokens_per_worker * t.prefill_utilization)
    reason = (
        f"prompt tokens {s.prompt_tokens_per_second:.0f}/s + queued {s.queued_prompt_tokens:.0f} over "
        f"{t.interval_seconds:g}s, / ({t.prefill_tokens_per_worker:.0f} x {t.prefill_utilization:.2f})"
    )
    if t.pinned_prefill:
        why = f"{reason}; pinned by spec.disaggregation.prefill.replicas"
        return RoleDecision(t.pinned_prefill, need, why, "pinnedReplicas")
    if t.pinned_ratio is not None:
        p, q = t.pinned_ratio
        by_ratio = math.ceil(decode * p / q - 1e-9) if decode else 0
        return RoleDecision(
            by_ratio, need, f"{reason}; spec.disaggregation.ratio {p}:{q} for {decode} decode worker(s)", "pinnedRatio"
        )
    count, by = math.ceil(need - 1e-9), "promptTokens"
    ttft, objective = s.ttft_seconds, t.ttft_objective_seconds
    if objective is not None and ttft is not None and ttft > objective:
        count, by = max(count, now + 1), "ttft"
        reason += f"; TTFT {ttft:.2f}s above its objective {objective:.2f}s: one more"
    low = math.ceil(decode * t.min_ratio - 1e-9) if decode else 0
    high = max(low, math.ceil(decode * t.max_ratio - 1e-9)) if decode else 0
    bounded = max(low, min(high, count))
    if bounded != count:
        reason += f"; kept within the ratio's bounds [{low}, {high}] for {decode} decode worker(s)"
        by = "ratioMin" if bounded > count else "ratioMax"
    return RoleDecision(bounded, need, reason, by)


def roles_record(prefill: RoleDecision, decode: RoleDecision) -> dict[str, Any]:
    """status.autoscaling.roles."""
    return {"prefill": prefill.record(), "decode": decode.record(), "ratio": f"{prefill.replicas}:{decode.replicas}"}


def targets_for(spec: MiniMaxM3DeploymentSpec, d: DisaggregationPlan) -> RoleTargets:
    """The targets of a disaggregated resource's spec and plan (the objectives come with each tick's signals)."""
    scaling, wanted = spec.autoscaling, spec.disaggregation
    ratio = wanted.ratio if wanted is not None else ""
    p, _, q = ratio.partition(":")
    return replace(
        RoleTargets.from_plan(
            d,
            scaling.target.kv_cache_utilization,
            scaling.min_replicas,
            scaling.max_replicas,
            float(scaling.interval_seconds),
        ),
        pinned_prefill=wanted.prefill.replicas if wanted is not None else 0,
        pinned_ratio=(int(p), int(q)) if ratio else None,
    )


@dataclass(frozen=True)
class RoleReading:
    """One tick's signals of both roles, and the latency objectives they are judged against."""

    signals: RoleSignals
    ttft_objective_seconds: float | None
    itl_objective_seconds: float | None
    partial: frozenset[Role] = frozenset()  # roles with running workers whose metrics are missing: never scaled down


def _fresh(snapshot: MetricsSnapshot, stale_after_seconds: float) -> list[ReplicaSignals]:
    return [
        r
        for r in snapshot.replicas
        if r.up
        and r.has_load_gauges()
        and r.sample_time is not None
        and snapshot.time - r.sample_time <= stale_after_seconds
    ]


def _quantile(histograms: list[Histogram | None], q: float) -> float | None:
    merged = Histogram.merge(histograms)
    return None if merged is None else merged.quantile(q)


def role_signals(
    snapshots: dict[Role, MetricsSnapshot],
    running: dict[Role, int],
    d: DisaggregationPlan,
    slo: SloSpec,
    stale_after_seconds: float,
) -> RoleReading | str:
    """Both roles' signals from each role's snapshot (the engine metrics of that role's pods), or why none can be
    used (then both roles hold).

    * prompt tokens arriving: the prefill workers' prompt-token rate; queued: the requests waiting in them times
      the window's mean prompt (their prompt histograms; the plan's inputTokens before any has finished);
    * KV demand: the decode workers' resident KV tokens (their own count, else usage x capacity) plus the running
      sequences' expected growth (half the plan's outputTokens each, as the aggregated policy's KV term counts it);
    * TTFT: the prefill workers' time-to-first-token histogram at the SLO's percentile (a prefill worker's first
      token is the prompt prefilled: the part of TTFT more prefill workers shorten), judged against the SLO's bound
      at the mean prompt and one idle prefill worker's prefill time; ITL: the decode workers' time per output token
      at the percentile, judged only against an absolute bound (slo.itl.unloadedFactor 0), as status's SLO does.
    """
    fresh: dict[Role, list[ReplicaSignals]] = {}
    partial: set[Role] = set()
    for role in ROLES:
        snapshot = snapshots[role]
        if snapshot.error:
            return f"{role} workers' metrics unavailable ({snapshot.error})"
        fresh[role] = _fresh(snapshot, stale_after_seconds)
        if running[role] > 0 and not fresh[role]:
            return f"no fresh metrics from any of the {running[role]} {role} worker(s)"
        if len(fresh[role]) < running[role]:
            partial.add(role)
    prefill, decode = fresh["prefill"], fresh["decode"]
    prompt = mean_prompt_tokens(prefill) or float(d.input_tokens)
    per_worker = float(d.decode.kv_cache_tokens_per_worker)
    resident = sum(r.used_tokens(per_worker) or 0.0 for r in decode)
    growth = sum(r.running or 0.0 for r in decode) * d.output_tokens / 2.0
    q = slo.percentile / 100.0
    signals = RoleSignals(
        prompt_tokens_per_second=sum(r.prompt_tokens_rate or 0.0 for r in prefill),
        queued_prompt_tokens=sum(r.waiting or 0.0 for r in prefill) * prompt,
        decode_kv_tokens=resident + growth,
        ttft_seconds=_quantile([r.ttft_seconds for r in prefill], q),
        itl_seconds=_quantile([r.itl_seconds for r in decode], q),
    )
    unloaded_prefill = prompt / d.prefill.tokens_per_second if d.prefill.tokens_per_second > 0 else 0.0
    itl_objective = slo.itl.seconds if slo.itl.unloaded_factor == 0 and slo.itl.seconds > 0 else None
    return RoleReading(signals, slo.ttft_seconds(prompt, unloaded_prefill), itl_objective, frozenset(partial))


def hold_roles(running: dict[Role, int], reason: str) -> tuple[RoleDecision, RoleDecision]:
    """Both roles kept as they run (metrics missing, stale or unreachable)."""
    prefill, decode = (
        RoleDecision(running[role], math.nan, f"holding {running[role]}: {reason}", "metricsUnavailable")
        for role in ROLES
    )
    return prefill, decode


History = tuple[tuple[float, int], ...]


def decide_tick(
    targets: RoleTargets, reading: RoleReading | str, running: dict[Role, int], window: Stabilizer | None = None
) -> tuple[RoleDecision, RoleDecision]:
    """One tick's decisions: hold without usable metrics; a role whose metrics are partial is never scaled down;
    then `window` (the spec's HPA behaviour), decode first."""
    if isinstance(reading, str):
        return hold_roles(running, reading)
    with_objectives = replace(
        targets,
        ttft_objective_seconds=reading.ttft_objective_seconds,
        itl_objective_seconds=reading.itl_objective_seconds,
    )

    def settle(role: Role, decided: RoleDecision) -> RoleDecision:
        if role in reading.partial and decided.replicas < running[role]:
            why = f"{decided.reason}; some {role} workers' metrics are missing: not scaled down"
            return RoleDecision(running[role], decided.need, why, "metricsUnavailable")
        return window(role, decided) if window is not None else decided

    return decide_roles(with_objectives, reading.signals, (running["prefill"], running["decode"]), settle)


def behavior_of(spec: MiniMaxM3DeploymentSpec) -> Behavior:
    """The spec's HPA behaviour, per role: the stabilization windows and the scale-down step."""
    behavior = spec.autoscaling.behavior
    return Behavior(
        scale_up_window_seconds=float(behavior.scale_up.stabilization_window_seconds),
        scale_down_window_seconds=float(behavior.scale_down.stabilization_window_seconds),
        max_scale_down_per_step=behavior.scale_down.max_replicas_per_step,
        limit_scale_up=False,  # a role's count already follows its need; the bounds keep it in range
    )


@dataclass
class Stabilizer:
    """HPA's stabilization per role: a scale-down takes the highest count recommended within the window. Keeps each
    role's recent recommendations in `history` (what status and the operator's memory carry to the next tick)."""

    history: dict[Role, History]
    running: dict[Role, int]
    now: float
    behavior: Behavior

    def __call__(self, role: Role, decision: RoleDecision) -> RoleDecision:
        if decision.decided_by in ("metricsUnavailable", "pinnedReplicas", "pinnedRatio"):
            return decision
        now = self.running[role]
        desired, self.history[role] = stabilize(
            self.history.get(role, ()), self.now, decision.replicas, now, self.behavior
        )
        if desired > decision.replicas and desired == now:
            window = self.behavior.scale_down_window_seconds
            kept_back = f"{decision.replicas} wanted, {desired} kept within the {window:g}s scale-down window"
            return RoleDecision(desired, decision.need, f"{decision.reason}; {kept_back}", "scaleDownWindow")
        return replace(decision, replicas=desired) if desired != decision.replicas else decision


def history_from(record: Any) -> dict[Role, History]:
    """The per-role recommendations kept in status.autoscaling.roles.history (bad entries are skipped)."""
    out: dict[Role, History] = {}
    for role in ROLES:
        entries = record.get(role) if isinstance(record, dict) else None
        out[role] = tuple(
            (float(e[0]), int(e[1]))
            for e in (entries if isinstance(entries, list) else [])
            if isinstance(e, list | tuple) and len(e) == 2 and all(isinstance(v, int | float) for v in e)
        )
    return out


def role_replicas_to_apply(spec: MiniMaxM3DeploymentSpec, status: Mapping[str, Any]) -> dict[str, int] | None:
    """The role counts the render uses: the autoscaler's last decision in act mode (status.autoscaling.roles), the
    decode count held to [minReplicas, maxReplicas]; None otherwise (spec.replicas and the plan's ratio)."""
    scaling = spec.autoscaling
    if spec.disaggregation is None or not scaling.enabled or scaling.mode != AutoscalingMode.ACT:
        return None
    roles = (status.get("autoscaling") or {}).get("roles") or {}
    counts: dict[str, int] = {}
    for role in ROLES:
        value = (roles.get(role) or {}).get("replicas") if isinstance(roles, Mapping) else None
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            return None
        counts[role] = int(value)
    counts["decode"] = max(scaling.min_replicas, min(scaling.max_replicas, counts["decode"]))
    return counts

"""The `m3fleet simulate` benchmark: every policy on the same requests, the oracle, sweeps, frontiers.

`benchmark(setup)` returns the JSON report. Policies and their defaults:

* `context-aware` — `policy.decide` with the resource's autoscaling settings;
* `request-count` — HPA, `REQUEST_COUNT_TARGET` running+waiting requests per replica;
* `kv-utilization` — KEDA, KV usage `KV_TARGET` per replica plus `KV_WAITING` waiting per replica;
* `oracle` — perfect-foresight provisioning: the replicas the true load needs each moment (prefill
  work at the unloaded rate, KV footprint in flight, long requests in flight), times the smallest
  headroom from `ORACLE_HEADROOMS` that meets the SLO for >= 99% of admitted requests, each
  replica started one worst-case cold start ahead.

The sweeps vary each baseline's target (and ours) so a comparison never rests on one setting.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from m3fleet.api.models import MiniMaxM3Deployment, Plan, Variant
from m3fleet.api.parse import parse_resource
from m3fleet.autoscaling.baselines import ContextAware, Schedule, kv_utilization, request_count
from m3fleet.autoscaling.calibration import calibrate
from m3fleet.autoscaling.policy import PolicyConfig
from m3fleet.autoscaling.scenarios import SCENARIOS, Request, Scenario, describe_phases
from m3fleet.autoscaling.simulator import (
    SLO_ITL_FACTOR,
    SLO_TTFT_FACTOR,
    SLO_TTFT_SLACK,
    Autoscaler,
    PerfModel,
    PolicyResult,
    SeedStreams,
    SimSettings,
    Simulation,
    cold_start_range,
    oracle_need,
    scenario_duration,
)
from m3fleet.bench.results import BenchResult
from m3fleet.catalog import VARIANTS
from m3fleet.planner import plan as make_plan

REQUEST_COUNT_TARGET: Final = 16.0
KV_TARGET, KV_WAITING = 0.8, 5.0
REQUEST_COUNT_SWEEP: Final = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
KV_SWEEP: Final = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
CONTEXT_AWARE_SWEEP: Final = (0.5, 0.6, 0.7, 0.8, 1.0)  # prefill safety margin (default 0.7)
ORACLE_HEADROOMS: Final = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0)
ORACLE_GOAL: Final = 0.99
AIM_POINTS, AIM_SAVINGS, AIM_ORACLE_RATIO = 15.0, 0.20, 1.25

# manifests/samples/vllm-h200-tp8.yaml, the default resource.
DEFAULT_RESOURCE: Final[dict[str, Any]] = {
    "apiVersion": "m3fleet.dev/v1alpha1",
    "kind": "MiniMaxM3Deployment",
    "metadata": {"name": "m3-vllm-h200-tp8", "namespace": "llm"},
    "spec": {
        "model": {"variant": "bf16", "source": {"pvc": {"claimName": "m3-weights"}}},
        "engine": {"name": "vllm"},
        "accelerator": "h200",
        "parallelism": {"strategy": "tp"},
        "context": {"maxModelLen": 131072},
        "replicas": 1,
    },
}
DEFAULT_SOURCE: Final = "manifests/samples/vllm-h200-tp8.yaml (built in)"


@dataclass(frozen=True)
class Setup:
    scenario: Scenario
    seed: int
    resource: MiniMaxM3Deployment
    resource_note: str
    plan: Plan
    model: PerfModel
    requests: tuple[Request, ...]
    duration: float
    streams: SeedStreams
    settings: SimSettings = field(default_factory=SimSettings)
    prior: dict[str, Any] | None = None  # how a measured benchmark replaced the model's assumed speed


def prepare(
    scenario_name: str,
    resource: MiniMaxM3Deployment | None = None,
    seed: int = 1,
    minutes: float | None = None,
    measured: tuple[BenchResult, str] | None = None,
) -> Setup:
    """Resolve the resource and plan, draw the requests and cold starts; with `measured` (an `m3fleet bench`
    result and where it came from), its speeds replace the model's. Raises KeyError, SpecError(s)."""
    scenario = SCENARIOS[scenario_name]
    if resource is None:
        body = copy.deepcopy(DEFAULT_RESOURCE)
        note = DEFAULT_SOURCE
        if scenario.max_model_len is not None:
            body["spec"]["context"]["maxModelLen"] = scenario.max_model_len
            note += (
                f" with spec.context.maxModelLen {scenario.max_model_len}: the scenario's prompts reach 1M tokens, "
                "so the deployment must serve them (the planner picks the layout)"
            )
            if scenario.max_model_len > VARIANTS[Variant.BF16].native_max_model_len:
                # vLLM's NVIDIA MiniMax-M3 model applies no YaRN, so past the BF16 checkpoint's native 512K the
                # deployment serves the MXFP8 checkpoint, whose native window is 1M.
                body["spec"]["model"]["variant"] = Variant.MXFP8.value
                note += " and model.variant mxfp8 (native 1M context; vLLM on NVIDIA cannot YaRN-extend bf16)"
        resource = parse_resource(body)
    else:
        note = "the resource given with -f, as written"
        if scenario.max_model_len is not None and resource.spec.context.max_model_len < scenario.max_model_len:
            note += (
                f"; its maxModelLen {resource.spec.context.max_model_len} is below the scenario's longest requests: "
                "the engine rejects those (counted as rejected)"
            )
    plan = make_plan(resource.spec)
    model = PerfModel.from_plan(plan)
    prior = None
    if measured is not None:
        model, prior = calibrate(model, plan, *measured)
    duration = scenario_duration(scenario, minutes)
    low, high = cold_start_range(plan)
    return Setup(
        scenario=scenario,
        seed=seed,
        resource=resource,
        resource_note=note,
        plan=plan,
        model=model,
        requests=tuple(scenario.requests(seed, duration)),
        duration=duration,
        streams=SeedStreams.draw(seed, low, high, scenario.initial_replicas),
        prior=prior,
    )


def simulate(setup: Setup, autoscaler: Autoscaler) -> PolicyResult:
    return Simulation(
        setup.plan,
        setup.model,
        setup.requests,
        autoscaler,
        duration=setup.duration,
        initial_replicas=setup.scenario.initial_replicas,
        cold_starts=setup.streams.cold_starts,
        measured_cold_starts=setup.streams.measured,
        settings=setup.settings,
    ).run()


# --- the policies ------------------------------------------------------------------------------


def policy_config(setup: Setup, **overrides: Any) -> PolicyConfig:
    spec = setup.resource.spec.autoscaling
    bounds = {"min_replicas": setup.scenario.min_replicas, "max_replicas": setup.scenario.max_replicas}
    return PolicyConfig.from_spec(spec, setup.plan, **{**bounds, **overrides})


def context_aware(setup: Setup, prefill_safety: float | None = None) -> ContextAware:
    overrides = {} if prefill_safety is None else {"prefill_safety": prefill_safety}
    return ContextAware(policy_config(setup, **overrides))


def run_request_count(setup: Setup, target: float = REQUEST_COUNT_TARGET) -> PolicyResult:
    s = setup.scenario
    return simulate(setup, request_count(target, s.min_replicas, s.max_replicas))


def run_kv_utilization(setup: Setup, target: float = KV_TARGET) -> PolicyResult:
    s = setup.scenario
    return simulate(setup, kv_utilization(target, s.min_replicas, s.max_replicas, KV_WAITING))


def oracle_counts(setup: Setup, headroom: float) -> list[int]:
    step = setup.settings.tick_seconds
    need = oracle_need(setup.requests, setup.model, setup.plan, setup.duration + setup.settings.tail_seconds, step)
    s = setup.scenario
    base = [max(s.min_replicas, min(s.max_replicas, math.ceil(headroom * n - 1e-9))) for n in need]
    lead = math.ceil((cold_start_range(setup.plan)[1] + step) / step)
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
    tried: list[tuple[float, float, float]] = []
    best: tuple[PolicyResult, float] | None = None
    for headroom in ORACLE_HEADROOMS:
        result = simulate(setup, Schedule(oracle_counts(setup, headroom), setup.settings.tick_seconds))
        tried.append((headroom, result.slo_attainment, result.gpu_hours))
        if best is None or result.slo_attainment > best[0].slo_attainment:
            best = (result, headroom)
        if result.slo_attainment >= ORACLE_GOAL:
            best = (result, headroom)
            break
    assert best is not None
    return OracleRun(best[0], best[1], tuple(tried))


# --- sweeps and the comparison -------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    setting: float
    attainment: float
    gpu_hours: float

    def to_dict(self, key: str, pareto: bool) -> dict[str, Any]:
        return {
            key: self.setting,
            "sloAttainment": round(self.attainment, 4),
            "gpuHours": round(self.gpu_hours, 2),
            "pareto": pareto,
        }


def sweep(settings: Iterable[float], run: Callable[[float], PolicyResult]) -> list[Point]:
    points = []
    for setting in settings:
        result = run(setting)
        points.append(Point(setting, result.slo_attainment, result.gpu_hours))
    return points


def pareto(points: Sequence[Point]) -> list[bool]:
    """True for points no other point beats on both attainment (>=) and GPU-hours (<=)."""
    return [
        not any(
            q is not p
            and q.attainment >= p.attainment
            and q.gpu_hours <= p.gpu_hours
            and (q.attainment > p.attainment or q.gpu_hours < p.gpu_hours)
            for q in points
        )
        for p in points
    ]


def _frontier(points: Sequence[Point]) -> list[Point]:
    """The Pareto points, cheapest first (so attainment rises along the list)."""
    return sorted((p for p, keep in zip(points, pareto(points), strict=True) if keep), key=lambda p: p.gpu_hours)


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float | None:
    """Linear interpolation inside [xs[0], xs[-1]]; None outside (never extrapolate a frontier)."""
    for (x0, y0), (x1, y1) in itertools.pairwise(zip(xs, ys, strict=True)):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[0] if len(xs) == 1 and x == xs[0] else None


def compare(ours: PolicyResult, baseline: Sequence[Point], oracle: PolicyResult) -> dict[str, Any]:
    """Our default against one baseline's swept frontier (linear between its Pareto points).

    `attainmentPointsAhead`: our attainment minus the baseline frontier's at our GPU-hours.
    `gpuHoursSaved`: 1 - our GPU-hours / the baseline frontier's GPU-hours at our attainment.
    Either is null when our point lies outside the range the sweep covered.
    """
    front = _frontier(baseline)
    gpu = [p.gpu_hours for p in front]
    att = [p.attainment for p in front]
    at_our_cost = _interpolate(gpu, att, ours.gpu_hours)
    if at_our_cost is None and ours.gpu_hours > gpu[-1]:
        at_our_cost = att[-1]  # the baseline's best, reached with fewer GPU-hours than ours
    cost_of_ours = _interpolate(att, gpu, ours.slo_attainment)
    if cost_of_ours is None and ours.slo_attainment < att[0]:
        cost_of_ours = gpu[0]  # even its cheapest setting is better than us
    points = None if at_our_cost is None else (ours.slo_attainment - at_our_cost) * 100
    savings = None if cost_of_ours is None else 1 - ours.gpu_hours / cost_of_ours
    ratio = ours.gpu_hours / oracle.gpu_hours if oracle.gpu_hours else None
    better = (points is not None and points >= AIM_POINTS) or (savings is not None and savings >= AIM_SAVINGS)
    beaten_by = [p for p in front if p.attainment >= ours.slo_attainment and p.gpu_hours <= ours.gpu_hours]
    return {
        "baselineSettingsAtLeastAsGoodOnBoth": [p.setting for p in beaten_by],
        "dominatesEveryBaselineSetting": all(
            p.attainment <= ours.slo_attainment and p.gpu_hours >= ours.gpu_hours for p in baseline
        ),
        "baselineFrontier": [
            {"target": p.setting, "sloAttainment": round(p.attainment, 4), "gpuHours": round(p.gpu_hours, 2)}
            for p in front
        ],
        "baselineAttainmentAtOurGpuHours": None if at_our_cost is None else round(at_our_cost, 4),
        "attainmentPointsAhead": None if points is None else round(points, 1),
        "baselineGpuHoursAtOurAttainment": None if cost_of_ours is None else round(cost_of_ours, 2),
        "gpuHoursSaved": None if savings is None else round(savings, 3),
        "gpuHoursVsOracle": None if ratio is None else round(ratio, 3),
        "aim": f">= {AIM_POINTS:g} points ahead at no more GPU-hours, or >= {AIM_SAVINGS:.0%} fewer GPU-hours at "
        f"the same attainment, and <= {AIM_ORACLE_RATIO}x the oracle's GPU-hours",
        "aimMet": bool(better and ratio is not None and ratio <= AIM_ORACLE_RATIO),
    }


def parameters(setup: Setup, oracle: OracleRun) -> dict[str, Any]:
    plan, s = setup.plan, setup.scenario
    low, high = cold_start_range(plan)
    limit = min(plan.max_model_len, setup.model.capacity_tokens)
    return {
        "resource": setup.resource_note,
        "scenario": s.description,
        "durationMinutes": setup.duration / 60,
        "workload": describe_phases(s.phases(setup.seed)),
        "requests": len(setup.requests),
        "rejectedRule": (
            f"requests with prompt + output > {limit} tokens (maxModelLen, or the engine's KV if smaller) are "
            "rejected by the engine, counted as rejected, and excluded from the sloAttainment denominator"
        ),
        "slo": (
            f"TTFT <= {SLO_TTFT_SLACK:g} s + {SLO_TTFT_FACTOR:g} x unloaded prefill time on one replica, and mean "
            f"inter-token latency <= {SLO_ITL_FACTOR:g} x the unloaded inter-token latency at prompt + output/2"
        ),
        "replicas": {"min": s.min_replicas, "max": s.max_replicas, "initial": s.initial_replicas},
        "coldStartSeconds": {"low": low, "high": high, "distribution": "uniform, seeded per replica serial"},
        "gpuHours": "billed per replica from creation (loading included) to deletion, over the scenario window",
        "perfModel": setup.model.describe(),
        "throughputPrior": setup.prior or "assumed: per-accelerator speeds from the catalog (not measured)",
        "simulator": setup.settings.describe(),
        "router": "most free KV net of queued prompt tokens; requests wait at the gateway while no replica is ready",
        "policySettings": {
            "context-aware": _config_summary(policy_config(setup)),
            "request-count": {"targetInFlightPerReplica": REQUEST_COUNT_TARGET, "hpa": "defaults"},
            "kv-utilization": {"kvCacheUsage": KV_TARGET, "waitingPerReplica": KV_WAITING, "hpa": "defaults"},
            "oracle": {
                "headroom": oracle.headroom,
                "metGoal": oracle.met_goal,
                "tried": [
                    {"headroom": h, "sloAttainment": round(a, 4), "gpuHours": round(g, 2)} for h, a, g in oracle.tried
                ],
            },
        },
    }


def _config_summary(config: PolicyConfig) -> dict[str, Any]:
    return {
        "gatewayHoldsRequests": config.gateway_holds_requests,
        "burstHold": (
            f"recurring bursts held for max(scale-down window, {config.burst_hold_cold_starts:g} x time-to-ready)"
            if config.burst_hold
            else "off"
        ),
        "kvTarget": config.kv_target,
        "prefillTarget": config.prefill_target if config.prefill_target is not None else "from the TTFT objective",
        "ttftObjective": f"{config.ttft_slack_seconds:g} s + {config.ttft_factor:g} x unloaded prefill",
        "prefillSafety": config.prefill_safety,
        "prefillTargetCap": config.prefill_target_cap,
        "prefillTokensPerSecondPerReplica": round(config.prefill_tokens_per_second),
        "tolerance": config.tolerance,
        "scaleDownWindowSeconds": config.scale_down_window_seconds,
        "maxScaleDownPerStep": config.max_scale_down_per_step,
        "panicThreshold": config.panic_threshold,
        "coldStartSecondsBeforeMeasured": config.cold_start_seconds,
    }


def benchmark(setup: Setup, with_sweep: bool = True) -> dict[str, Any]:
    ours = simulate(setup, context_aware(setup))
    rc = run_request_count(setup)
    kv = run_kv_utilization(setup)
    oracle = run_oracle(setup)
    report: dict[str, Any] = {
        "scenario": setup.scenario.name,
        "seed": setup.seed,
        "plan": setup.plan.model_dump(by_alias=True, mode="json"),
        "parameters": parameters(setup, oracle),
        "policies": {
            "context-aware": ours.to_dict(),
            "request-count": rc.to_dict(),
            "kv-utilization": kv.to_dict(),
            "oracle": oracle.result.to_dict(),
        },
    }
    if with_sweep:
        families = {
            "request-count": ("target", sweep(REQUEST_COUNT_SWEEP, lambda t: run_request_count(setup, t))),
            "kv-utilization": ("target", sweep(KV_SWEEP, lambda t: run_kv_utilization(setup, t))),
            "context-aware": (
                "prefillSafety",
                sweep(CONTEXT_AWARE_SWEEP, lambda t: simulate(setup, context_aware(setup, t))),
            ),
        }
        report["frontier"] = {
            name: [p.to_dict(key, flag) for p, flag in zip(points, pareto(points), strict=True)]
            for name, (key, points) in families.items()
        }
        report["comparison"] = {
            "context-aware vs request-count": compare(ours, families["request-count"][1], oracle.result),
            "context-aware vs kv-utilization": compare(ours, families["kv-utilization"][1], oracle.result),
        }
    return report


# --- several seeds -------------------------------------------------------------------------------


def _spread(values: Sequence[float | None]) -> dict[str, float] | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {
        "mean": round(sum(present) / len(present), 4),
        "min": round(min(present), 4),
        "max": round(max(present), 4),
        "seeds": len(present),
    }


def summarize(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds of each policy's attainment and GPU-hours, and the spread of each comparison."""
    names = list(reports[0]["policies"])
    out: dict[str, Any] = {
        "seeds": [r["seed"] for r in reports],
        "policies": {
            name: {
                "sloAttainment": _spread([r["policies"][name]["sloAttainment"] for r in reports]),
                "gpuHours": _spread([r["policies"][name]["gpuHours"] for r in reports]),
            }
            for name in names
        },
    }
    if all("comparison" in r for r in reports):
        out["comparison"] = {
            key: {
                "attainmentPointsAhead": _spread([r["comparison"][key]["attainmentPointsAhead"] for r in reports]),
                "gpuHoursSaved": _spread([r["comparison"][key]["gpuHoursSaved"] for r in reports]),
                "gpuHoursVsOracle": _spread([r["comparison"][key]["gpuHoursVsOracle"] for r in reports]),
                "aimMetOnSeeds": [r["seed"] for r in reports if r["comparison"][key]["aimMet"]],
            }
            for key in reports[0]["comparison"]
        }
    return out

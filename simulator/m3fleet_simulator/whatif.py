"""What the autoscaler would do with a resource: the policy in the simulator, for `m3fleet simulate`.

`prepare(scenario, resource, seed)` resolves the resource's plan and draws the scenario's requests and
cold starts; `run_context_aware(setup)` runs the context-aware policy (with the resource's own
autoscaling settings) on them and returns what it achieved. A recurring scenario first replays its
earlier days with the same policy and records its need per tick, the history the forecast floor
reads on the measured day, as the operator would have recorded it; the policy's state (learned
throughput, recent bursts) carries from day to day as the operator's does in status.

Pure: no I/O, no clock. Comparisons with other autoscalers live in the project's benchmark
(tests/bench/autoscaling), not here.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from m3fleet.api.models import MiniMaxM3Deployment, Plan, SloSpec, Variant
from m3fleet.api.parse import parse_resource
from m3fleet.autoscaling.forecast import DAY, DemandRecord, bucket_seconds, record_demand
from m3fleet.autoscaling.policy import DEFAULT_SCALE_DOWN_PER_STEP, PolicyConfig, PolicyState, decide
from m3fleet.autoscaling.policy.zero import zero_rule
from m3fleet.autoscaling.signals import FleetState, MetricsSnapshot
from m3fleet.bench.results import BenchResult
from m3fleet.catalog import VARIANTS
from m3fleet.documents import InputError
from m3fleet.planner import plan as make_plan
from m3fleet_simulator.calibration import calibrate
from m3fleet_simulator.coldstart import ColdStartModel
from m3fleet_simulator.fleet import (
    Autoscaler,
    GatewayModel,
    PerfModel,
    PolicyResult,
    SeedStreams,
    SimSettings,
    Simulation,
    cold_start_range,
    scenario_duration,
)
from m3fleet_simulator.scenarios import CHAT_OUTPUT, CHAT_PROMPT, SCENARIOS, Request, Workload
from m3fleet_simulator.trace import RecordedDemand, Trace, trace_of

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
# `gateway=True` on the built-in resource: a Gateway API Inference Extension in front of it.
DEFAULT_GATEWAY: Final[dict[str, Any]] = {"matchLabels": {"model_name": "MiniMaxAI/MiniMax-M3"}}
# Request bytes per prompt token a simulated gateway records, drawn per seed (English prose runs near 4 with its
# JSON, code and CJK text lower): the policy has to measure it.
GATEWAY_BYTES_PER_TOKEN: Final = (2.5, 4.5)
EPOCH: Final = 1799020800.0  # 2027-01-04T00:00:00Z, a Monday: the simulated calendar's first day


@dataclass(frozen=True)
class Day:
    """One simulated window: its requests and the wall-clock time its t = 0 stands for."""

    requests: tuple[Request, ...]
    clock_offset: float


@dataclass(frozen=True)
class Replicas:
    """The replica bounds a run keeps to, the count it starts with, and whose bounds they are."""

    min: int
    max: int
    initial: int
    source: str

    @classmethod
    def of(cls, scenario: Workload, resource: MiniMaxM3Deployment) -> Replicas:
        """The resource's own min/max when it enables autoscaling (what would the autoscaler do with it), else the
        scenario's, sized for its traffic; the scenario's initial count within them."""
        scaling = resource.spec.autoscaling
        if not scaling.enabled:
            return cls(
                scenario.min_replicas,
                scenario.max_replicas,
                scenario.initial_replicas,
                "the scenario's (the resource does not enable autoscaling)"
                if scenario.kind == "scenario"
                else "the resource's spec.autoscaling (which it does not enable)",
            )
        low, high = scaling.min_replicas, scaling.max_replicas
        initial = max(low, 1, min(high, scenario.initial_replicas))
        return cls(low, high, initial, "the resource's spec.autoscaling")


@dataclass(frozen=True)
class Setup:
    scenario: Workload  # a scenario, or a trace
    seed: int
    resource: MiniMaxM3Deployment
    resource_note: str
    replicas: Replicas
    plan: Plan
    model: PerfModel
    requests: tuple[Request, ...]  # the measured window
    duration: float
    streams: SeedStreams
    cold_start: float | None = None  # --cold-start: every new replica takes this long
    clock_offset: float = EPOCH
    earlier_days: tuple[Day, ...] = ()  # recurring scenarios: the days before the measured one
    settings: SimSettings = field(default_factory=SimSettings)
    prior: dict[str, Any] | None = None  # how a measured benchmark replaced the model's assumed speed
    cold_start_model: ColdStartModel | None = None  # --cold-start-model: cold starts built from phases

    def worst_cold_start(self) -> float:
        """The longest time-to-ready a replica can take in this run."""
        if self.cold_start is not None:
            return self.cold_start
        if self.cold_start_model is not None:
            return self.cold_start_model.bounds()[1]
        return cold_start_range(self.plan)[1]


def prepare(
    scenario_name: str | Workload,
    resource: MiniMaxM3Deployment | None = None,
    seed: int = 1,
    minutes: float | None = None,
    cold_start: float | None = None,
    measured: tuple[BenchResult, str] | None = None,
    cold_start_model: str | None = None,
    gateway: bool = False,
    speculative: str | None = None,
) -> Setup:
    """Resolve the resource and plan, draw the requests and cold starts; with `measured` (an `m3fleet bench`
    result and where it came from), its speeds replace the model's; with `cold_start_model` (cache, pvc, hub)
    every cold start is built from phases (coldstart.py); with `gateway` the built-in resource has a gateway
    (spec.autoscaling.gateway) in front; with `speculative` (mtp, eagle3) the built-in resource drafts with that
    method (spec.speculativeDecoding). A resource naming a gateway runs with its request sizes exported.
    Raises KeyError, SpecError(s)."""
    scenario = SCENARIOS[scenario_name] if isinstance(scenario_name, str) else scenario_name
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
        if gateway:
            body["spec"]["autoscaling"] = {"gateway": copy.deepcopy(DEFAULT_GATEWAY)}
            note += ", behind an inference gateway that exports request sizes (spec.autoscaling.gateway)"
        if speculative is not None:
            body["spec"]["speculativeDecoding"] = {"method": speculative}
            note += f", with speculative decoding (spec.speculativeDecoding.method {speculative})"
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
    measured_day = scenario.days - 1
    phases = ColdStartModel.of(cold_start_model, plan) if cold_start_model is not None and cold_start is None else None
    replicas = Replicas.of(scenario, resource)
    if phases is not None:
        streams = SeedStreams.modelled(seed, phases.draw, replicas.initial)
    else:
        streams = SeedStreams.draw(seed, low, high, replicas.initial, cold_start)
    if measured_day:  # by the measured day the operator has timed the replicas it started before
        streams = replace(streams, measured=streams.cold_starts[:10])
    opening = scenario.clock_start
    if opening is None:
        opening = EPOCH + measured_day * DAY + scenario.start_of_window(seed)
    earlier = tuple(
        Day(tuple(scenario.requests(seed, duration, day)), opening - (measured_day - day) * DAY)
        for day in range(measured_day)
    )
    exported = None
    if resource.spec.autoscaling.gateway is not None:
        exported = GatewayModel(random.Random(f"{seed}:gateway").uniform(*GATEWAY_BYTES_PER_TOKEN), seed)
    window = float(resource.spec.autoscaling.prometheus.rate_window_seconds)
    settings = SimSettings(gateway=exported, rate_window_seconds=window)
    return Setup(
        scenario=scenario,
        seed=seed,
        resource=resource,
        resource_note=note,
        replicas=replicas,
        plan=plan,
        model=model,
        requests=tuple(scenario.requests(seed, duration)),
        duration=duration,
        streams=streams,
        cold_start=cold_start,
        clock_offset=opening,
        earlier_days=earlier,
        prior=prior,
        cold_start_model=phases,
        settings=settings,
    )


CHAT_MIX_DRAWS: Final = 4000  # requests drawn to average the chat mix over (seeded: the same every run)


def replica_request_rate(resource: MiniMaxM3Deployment, plan: Plan) -> float:
    """Chat requests a second one replica serves at the policy's own targets: the lesser of what its KV holds at
    kvCacheUtilization (Little's law: each request holds its prompt and output over its unloaded lifetime) and
    what its prefill serves at the policy's utilisation target. How a recorded need in replicas becomes requests."""
    config = PolicyConfig.from_spec(resource.spec.autoscaling, plan)
    model = PerfModel.from_plan(plan)
    rng = random.Random("chat-mix")
    mix = [(CHAT_PROMPT.draw(rng), CHAT_OUTPUT.draw(rng)) for _ in range(CHAT_MIX_DRAWS)]
    token_seconds = sum(
        (model.unloaded_prefill_seconds(p) + o * model.unloaded_itl(p + o / 2)) * (p + o) for p, o in mix
    ) / len(mix)
    prompt = sum(p for p, _ in mix) / len(mix)
    kv_rate = config.kv_target * config.kv_tokens_per_replica / token_seconds
    prefill_rate = config.prefill_utilisation(prompt) * config.prefill_tokens_per_second / prompt
    return min(kv_rate, prefill_rate)


def recorded_trace(record: RecordedDemand, resource: MiniMaxM3Deployment, source: str) -> Trace:
    """The demand `record` (the resource's `status.autoscaling.demand`) as chat-shaped requests: in each recorded
    bucket, Poisson arrivals at need x `replica_request_rate` (trace.py). Drawn the same for every seed."""
    plan = make_plan(resource.spec)
    rate = replica_request_rate(resource, plan)
    rng = random.Random(f"recorded:{source}")
    rows: list[tuple[float, int, int]] = []
    for start, need in record.needs:
        per_second = need * rate
        t = start
        while per_second > 0:
            t += rng.expovariate(per_second)
            if t >= start + record.bucket:
                break
            rows.append((t, CHAT_PROMPT.draw(rng), CHAT_OUTPUT.draw(rng)))
    if not rows:
        raise InputError(
            source,
            "records a need of 0 replicas throughout: nothing to replay",
            "replay the resource once it has served traffic, or a request log with --trace",
            field="status.autoscaling.demand",
        )
    span = record.needs[-1][0] - record.needs[0][0] + record.bucket
    minutes = span / 60.0
    description = (
        f"the demand {source} recorded (status.autoscaling.demand): {len(record.needs)} buckets of "
        f"{record.bucket:g} s over {minutes:g} minutes, the need in replicas {min(n for _, n in record.needs):g}-"
        f"{max(n for _, n in record.needs):g}, replayed as chat requests at {rate:.3g}/s per replica needed "
        "(the record holds replicas, not requests; a bucket with nothing recorded has no requests)"
    )
    bounds = (resource.spec.autoscaling.min_replicas, resource.spec.autoscaling.max_replicas)
    return trace_of(source, rows, bounds, description, origin=record.needs[0][0], duration=span)


def simulate(
    setup: Setup,
    autoscaler: Autoscaler,
    requests: Sequence[Request] | None = None,
    clock_offset: float | None = None,
    initial_replicas: int | None = None,
) -> PolicyResult:
    """One run on the measured window (or on `requests` at `clock_offset`, an earlier day), starting with the
    scenario's ready replicas (or `initial_replicas`)."""
    return Simulation(
        setup.plan,
        setup.model,
        setup.requests if requests is None else requests,
        autoscaler,
        duration=setup.duration,
        initial_replicas=setup.replicas.initial if initial_replicas is None else initial_replicas,
        cold_starts=setup.streams.cold_starts,
        measured_cold_starts=setup.streams.measured,
        settings=setup.settings,
        clock_offset=setup.clock_offset if clock_offset is None else clock_offset,
        slo=setup.resource.spec.autoscaling.slo,
    ).run()


@dataclass
class ContextAware:
    """The policy as the operator runs it: its state round-tripped through `to_dict` every tick, and its
    demand (`demandReplicas`: the need without backlogs) folded into the `DemandRecord` the operator keeps in
    `status.autoscaling.demand` (round-tripped through its status form), from which the forecast reads the
    earlier days back."""

    config: PolicyConfig
    name: str = "context-aware"
    state: PolicyState = field(default_factory=PolicyState)
    demand: DemandRecord | None = None

    def desired(self, snapshot: MetricsSnapshot, fleet: FleetState) -> int:
        period = self.config.forecast_period_seconds
        demand = self.demand or DemandRecord(bucket_seconds(period))
        look_ahead = self.config.forecast_look_ahead(fleet.time_to_ready_seconds)
        if self.config.forecast:
            snapshot = replace(snapshot, demand_history=demand.history(fleet.now, period, look_ahead))
        decision, state = decide(self.config, self.state, snapshot, fleet)
        self.state = PolicyState.from_dict(state.to_dict())
        if self.config.forecast:
            demand = record_demand(demand, fleet.now, decision.terms.get("demandReplicas"), period, look_ahead)
            self.demand = DemandRecord.from_status(demand.to_status(), demand.bucket)
        return decision.desired_replicas


@dataclass
class ScaleToZero:
    """The policy with the product's zero rule over it (policy/zero.py), as the operator's autoscaler applies it behind
    a gateway with minReplicas 0: it reads the requests the gateway holds (the simulator's `Holding`) each tick."""

    policy: ContextAware
    idle_after_seconds: float  # autoscaling.scaleToZeroAfterSeconds
    name: str = "context-aware-scale-to-zero"
    held: float | None = None  # None until the first scrape: an unread count never takes the fleet to zero
    last_busy: float | None = None

    def observe_held(self, held: float) -> None:
        self.held = held

    def desired(self, snapshot: MetricsSnapshot, fleet: FleetState) -> int:
        decided = self.policy.desired(snapshot, fleet)
        busy = any((r.running or 0) + (r.waiting or 0) > 0 for r in snapshot.replicas)
        verdict = zero_rule(
            decided, fleet.current_replicas, self.held, busy, self.last_busy, fleet.now, self.idle_after_seconds
        )
        self.last_busy = verdict.last_busy
        return verdict.replicas


def policy_config(setup: Setup, **overrides: Any) -> PolicyConfig:
    """The resource's autoscaling settings, within the run's replica bounds (and any overrides)."""
    spec = setup.resource.spec.autoscaling
    bounds = {"min_replicas": setup.replicas.min, "max_replicas": setup.replicas.max}
    return PolicyConfig.from_spec(spec, setup.plan, **{**bounds, **overrides})


def context_aware(setup: Setup, **overrides: Any) -> ContextAware:
    """The policy for the measured window, with the state and the demand it kept on the earlier days (if
    any): the operator keeps both in status from one day to the next."""
    config = policy_config(setup, **overrides)
    demand: DemandRecord | None = None
    state = PolicyState()
    for day in setup.earlier_days:
        earlier = ContextAware(config, state=state, demand=demand)
        simulate(setup, earlier, day.requests, day.clock_offset)
        demand, state = earlier.demand, earlier.state
    return ContextAware(config, state=state, demand=demand)


def run_context_aware(setup: Setup, **overrides: Any) -> PolicyResult:
    return simulate(setup, context_aware(setup, **overrides))


def parameters(setup: Setup) -> dict[str, Any]:
    """Every assumption a run rests on (workload, time model, cold starts, SLO, router, settings)."""
    plan, s = setup.plan, setup.scenario
    low, high = cold_start_range(plan)
    limit = min(plan.max_model_len, setup.model.capacity_tokens)
    cold: dict[str, Any] = (
        {"seconds": setup.cold_start, "distribution": "fixed (--cold-start)"}
        if setup.cold_start is not None
        else {**setup.cold_start_model.describe(), "distribution": "phases, seeded per replica serial"}
        if setup.cold_start_model is not None
        else {"low": low, "high": high, "distribution": "uniform, seeded per replica serial"}
    )
    return {
        "resource": setup.resource_note,
        s.kind: s.description,
        "durationMinutes": setup.duration / 60,
        "days": s.days,
        "workload": s.describe_workload(setup.seed),
        "requests": len(setup.requests),
        "rejectedRule": (
            f"requests with prompt + output > {limit} tokens (maxModelLen, or the engine's KV if smaller) are "
            "rejected by the engine, counted as rejected, and excluded from the sloAttainment denominator"
        ),
        "slo": describe_slo(setup.resource.spec.autoscaling.slo),
        "replicas": {
            "min": setup.replicas.min,
            "max": setup.replicas.max,
            "initial": setup.replicas.initial,
            "source": setup.replicas.source,
        },
        "coldStartSeconds": cold,
        "gpuHours": "billed per replica from creation (loading included) to deletion, over the scenario window",
        "perfModel": setup.model.describe(),
        "throughputPrior": setup.prior or "assumed: per-accelerator speeds from the catalog (not measured)",
        "simulator": setup.settings.describe(),
        "router": "most free KV net of queued prompt tokens; requests wait at the gateway while no replica is ready",
        "policy": config_summary(policy_config(setup)),
    }


def describe_ttft(slo: SloSpec) -> str:
    """The TTFT bound in words (only the parts the resource sets)."""
    ttft = f"{slo.ttft.seconds:g} s"
    if slo.ttft.per_prompt_token_seconds:
        ttft += f" + {slo.ttft.per_prompt_token_seconds:g} s per prompt token"
    if slo.ttft.unloaded_prefill_factor:
        ttft += f" + {slo.ttft.unloaded_prefill_factor:g} x unloaded prefill time on one replica"
    return ttft


def describe_slo(slo: SloSpec) -> str:
    """The SLO a finished request is scored against, in words."""
    itl = " + ".join(
        part
        for part in (
            f"{slo.itl.seconds:g} s" if slo.itl.seconds else "",
            f"{slo.itl.unloaded_factor:g} x the unloaded inter-token latency at prompt + output/2"
            if slo.itl.unloaded_factor
            else "",
        )
        if part
    )
    objective = f"objective: {slo.percentile:g}% of requests"
    return f"TTFT <= {describe_ttft(slo)}, and mean inter-token latency <= {itl}; {objective}"


def config_summary(config: PolicyConfig) -> dict[str, Any]:
    return {
        "gatewayHoldsRequests": config.gateway_holds_requests,
        "burstHold": (
            "a burst of chat and the fleet as found held until the SLO's error budget covers a recurrence"
            if config.burst_hold
            else "off"
        ),
        "forecast": "floor from the need recorded in the last two days" if config.forecast else "off",
        "schedule": [w.name for w in config.schedule],
        "kvTarget": config.kv_target,
        "prefillTarget": config.prefill_target if config.prefill_target is not None else "from the TTFT objective",
        "ttftObjective": describe_ttft(config.slo),
        "prefillSafety": config.prefill_safety,
        "prefillTokensPerSecondPerReplicaPrior": round(config.prefill_tokens_per_second),
        "learnPrefillThroughput": config.learn_prefill,
        "tolerance": config.tolerance,
        "scaleDownWindowSeconds": config.scale_down_window_seconds,
        "maxScaleDownPerStep": (
            config.max_scale_down_per_step
            if config.max_scale_down_per_step is not None
            else f"{DEFAULT_SCALE_DOWN_PER_STEP}, unlimited once a burst ended and nothing waits"
        ),
        "panicThreshold": config.panic_threshold,
        "coldStartSecondsBeforeMeasured": config.cold_start_seconds,
    }


def run_report(setup: Setup) -> dict[str, Any]:
    """`m3fleet simulate -o json`, one seed: the contract's object with the policy's result."""
    ours = run_context_aware(setup)
    return {
        setup.scenario.kind: setup.scenario.name,
        "seed": setup.seed,
        "coldStartSeconds": setup.cold_start,
        "plan": setup.plan.model_dump(by_alias=True, mode="json"),
        "parameters": parameters(setup),
        "policies": {"context-aware": ours.to_dict()},
    }

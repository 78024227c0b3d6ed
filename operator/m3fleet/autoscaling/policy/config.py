"""What the policy reads from the spec and the plan, as plain numbers (`PolicyConfig`), and the priors it starts
from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from m3fleet.api.models import AutoscalingMode, AutoscalingSpec, Plan, SloSpec
from m3fleet.autoscaling.forecast import Bounds, ScheduleWindow, bounds_at, parse_hhmm

# Prefill throughput prior, prompt tokens per second per GPU at long context (a stand-in for a
# measured profile; UNVERIFIED), shared with the disaggregation planner. Multi-node replicas lose some of it to
# inter-node traffic.
from m3fleet.catalog.throughput import DECODE_STEP_SECONDS, MULTI_NODE_DECODE_PENALTY
from m3fleet.catalog.throughput import MULTI_NODE_EFFICIENCY as MULTI_NODE_EFFICIENCY
from m3fleet.catalog.throughput import PREFILL_TOKENS_PER_GPU_SECOND as PREFILL_TOKENS_PER_GPU_SECOND

WEEKDAYS: Final = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
# The prefill utilisation planned for never falls below this share, however tight the TTFT bound: below it the
# arriving load is noise beside one prompt, and a bound no utilisation meets must not ask for unbounded replicas.
PREFILL_UTILISATION_FLOOR: Final = 0.05
# A snapshot (or a replica's sample) older than max(this, STALE_AFTER_INTERVALS ticks) is stale: a scrape every
# 15-30 s (the chart's PodMonitor) misses two in a row before it, and a longer tick would otherwise judge its own
# previous snapshot stale.
STALE_AFTER_MIN_SECONDS: Final = 60.0
STALE_AFTER_INTERVALS: Final = 4.0


@dataclass(frozen=True)
class PolicyConfig:
    """Everything the policy needs from the spec and the plan, as plain numbers."""

    kv_tokens_per_replica: float
    kv_tokens_per_rank: float
    ranks_per_replica: int
    max_model_len: int
    prefill_tokens_per_second: float  # per replica
    # An idle target decode step of one rank (HBM-bound: the weights read once), the catalog's prior for the plan's
    # accelerator, x the penalty when a replica spans nodes; the decode term adds the batch's share (terms.py).
    decode_step_seconds: float = DECODE_STEP_SECONDS["h200"]
    # Speculative decoding: tokens a target forward pass emits, assumed until the engines' counters measure it (the
    # plan's prior; None without a draft). Each decode step then advances a request by this many tokens.
    acceptance_length_prior: float | None = None
    # Tokens the target computes per sequence and step: 1 + the drafted tokens it verifies (1 without a draft).
    verified_per_step: float = 1.0
    min_replicas: int = 1
    max_replicas: int = 4
    mode: str = AutoscalingMode.ACT.value
    interval_seconds: float = 15.0
    kv_target: float = 0.8
    # Prefill utilisation to plan for. None derives it from the TTFT objective (`slo`: slack + factor x
    # the unloaded prefill time t, + any allowance per prompt token): prompts queueing for one prefill at
    # a time (as the engines run them) wait on average about t/(1-u) in all (M/M/1; less if they are all
    # one length), so u <= 1 - t/(slack + factor t), times a safety margin for the tail, capped. Long
    # prompts land near 1/3, chat near the cap.
    prefill_target: float | None = None
    slo: SloSpec = field(default_factory=SloSpec)  # spec.autoscaling.slo: its TTFT bound sizes prefill
    prefill_safety: float = 0.85
    prefill_target_cap: float = 0.6
    tolerance: float = 0.1
    scale_up_window_seconds: float = 0.0
    scale_down_window_seconds: float = 300.0
    # None: DEFAULT_SCALE_DOWN_PER_STEP, and no limit once a burst has ended and nothing waits (`_scale_down_step`).
    max_scale_down_per_step: int | None = None
    panic_threshold: float = 2.0
    panic_hold_seconds: float = 120.0
    cold_start_seconds: float = 600.0
    stale_after_seconds: float = 60.0
    default_prompt_tokens: float = 2048.0
    default_output_tokens: float = 256.0
    # Whether a gateway in front of the engines holds requests until a replica has room (then any
    # replica, a new one included, can take a backlog). Without one, requests are dispatched at
    # arrival and wait in the engine they were sent to. spec.autoscaling.gateway says what a gateway
    # records, not that it holds requests (the Inference Extension's picker dispatches at arrival): off.
    gateway_holds_requests: bool = False
    # Cold-start-aware hold: once demand has come back at once (a burst) within the hold window of an
    # earlier one, keep the capacity the smaller of the two bursts needed until a hold window passes
    # without another; a burst of chat (more requests, not longer ones) is held from the first. Window =
    # max(scale-down window, burst_hold_cold_starts x time-to-ready): a replica removed and needed again
    # within it costs a whole cold start of misses.
    burst_hold: bool = True
    burst_hold_cold_starts: float = 3.0
    # An engine-reported KV capacity further than this share from the plan's is reported (status and an
    # Event) and not trusted: the smaller of the two is used.
    capacity_margin: float = 0.2
    # Learn each replica's prefill throughput from its own counters (prompt tokens per second while it
    # has a queue, i.e. while prefill is the bottleneck); the prior stands until LEARNED_AFTER samples.
    learn_prefill: bool = True
    fast_rise: bool = True  # just after a burst's start, rises in the estimates are taken at once
    transient_release: bool = True  # the scale-down window remembers the need without backlogs
    release_ended_bursts: bool = True  # the window forgets a burst once its long prompts stopped arriving
    # A long prompt: its TTFT is mostly prefill (shorter ones teach the throughput nothing), a queue of them
    # outlasts a chat prompt's TTFT objective, and while they arrive a burst's size is still being measured.
    long_prompt_tokens: float = 20_000.0
    # A prior above this multiple of the idle-replica bound (and above the busy bound) is discredited: the
    # policy plans with the measured bound instead. The idle bound understates a replica sharing its
    # prefill by about 1 - utilisation, so a right prior within the slack stands; the busy bound is tight
    # when it is loaded. (Capping the prior at the slack instead planned a prior 2x too fast at 1.25x the
    # truth: 4.4 points lost on long-context-burst seed 5.)
    learn_slack: float = 1.25
    forecast: bool = True
    # The forecast looks this much further than time-to-ready + one tick: a daily peak does not come back
    # at the same second, and replicas ready a little early cost less than a cold start of misses.
    forecast_margin_seconds: float = 300.0
    forecast_period_seconds: float = 86400.0  # the period `demand_history` reads back (spec forecast.periodSeconds)
    schedule: tuple[ScheduleWindow, ...] = ()

    @classmethod
    def from_spec(cls, autoscaling: AutoscalingSpec, plan: Plan, **overrides: Any) -> PolicyConfig:
        gpus = plan.gpus_per_replica
        per_gpu = PREFILL_TOKENS_PER_GPU_SECOND.get(str(plan.accelerator), PREFILL_TOKENS_PER_GPU_SECOND["h200"])
        efficiency = MULTI_NODE_EFFICIENCY if plan.nodes_per_replica > 1 else 1.0
        values: dict[str, Any] = {
            "kv_tokens_per_replica": float(plan.kv_cache_tokens_per_replica),
            "kv_tokens_per_rank": float(plan.kv_cache_tokens_per_rank),
            "ranks_per_replica": max(1, plan.data_parallel_size),
            "max_model_len": plan.max_model_len,
            "prefill_tokens_per_second": per_gpu * gpus * efficiency,
            "decode_step_seconds": DECODE_STEP_SECONDS.get(str(plan.accelerator), DECODE_STEP_SECONDS["h200"])
            * (MULTI_NODE_DECODE_PENALTY if plan.nodes_per_replica > 1 else 1.0),
            "acceptance_length_prior": (
                plan.speculative_decoding.acceptance_length_prior if plan.speculative_decoding else None
            ),
            "verified_per_step": (
                1.0 + plan.speculative_decoding.num_speculative_tokens if plan.speculative_decoding else 1.0
            ),
            "min_replicas": autoscaling.min_replicas,
            "max_replicas": autoscaling.max_replicas,
            "mode": str(autoscaling.mode),
            "interval_seconds": float(autoscaling.interval_seconds),
            "kv_target": autoscaling.target.kv_cache_utilization,
            "tolerance": autoscaling.tolerance,
            "scale_up_window_seconds": float(autoscaling.behavior.scale_up.stabilization_window_seconds),
            "scale_down_window_seconds": float(autoscaling.behavior.scale_down.stabilization_window_seconds),
            "max_scale_down_per_step": autoscaling.behavior.scale_down.max_replicas_per_step,
            "panic_threshold": autoscaling.panic_threshold,
            "cold_start_seconds": float(autoscaling.cold_start_seconds),
            "slo": autoscaling.slo,
            "stale_after_seconds": max(STALE_AFTER_MIN_SECONDS, STALE_AFTER_INTERVALS * autoscaling.interval_seconds),
            "forecast": autoscaling.forecast.enabled,
            "forecast_margin_seconds": float(autoscaling.forecast.margin_seconds),
            "forecast_period_seconds": float(autoscaling.forecast.period_seconds),
            "schedule": tuple(
                ScheduleWindow(
                    name=w.name,
                    start_minute=parse_hhmm(w.start),
                    end_minute=parse_hhmm(w.end),
                    min_replicas=w.min_replicas or None,
                    max_replicas=w.max_replicas or None,
                    days=tuple(WEEKDAYS.index(str(d)) for d in w.days),
                )
                for w in autoscaling.schedule
            ),
        }
        values.update(overrides)
        return cls(**values)

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))

    def forecast_look_ahead(self, time_to_ready: float | None) -> float:
        """How far ahead the forecast reads the earlier periods (give it to `demand_history`)."""
        return (time_to_ready or self.cold_start_seconds) + self.interval_seconds + self.forecast_margin_seconds

    def bounds(self, now: float) -> Bounds:
        """min/max at `now`, with the scheduled windows in force."""
        return bounds_at(now, self.min_replicas, self.max_replicas, self.schedule)

    def prefill_utilisation(self, prompt_tokens: float, per_replica: float | None = None) -> float:
        """Target prefill utilisation for prompts of this length (see `prefill_target`), at a replica
        throughput of `per_replica` prompt tokens/s (the prior when None)."""
        if self.prefill_target is not None:
            return self.prefill_target
        t = prompt_tokens / (per_replica or self.prefill_tokens_per_second)
        allowed = 1.0 - t / self.ttft_objective_seconds(prompt_tokens, t)
        return max(PREFILL_UTILISATION_FLOOR, min(self.prefill_target_cap, self.prefill_safety * allowed))

    def ttft_objective_seconds(self, prompt_tokens: float, unloaded_prefill_seconds: float) -> float:
        """The TTFT a prompt is planned to meet: the SLO's bound at its length and unloaded prefill time."""
        return self.slo.ttft_seconds(prompt_tokens, unloaded_prefill_seconds)

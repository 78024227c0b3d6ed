"""How close the policy's learned prefill throughput comes to the simulator's truth.

The policy learns each replica's prefill speed online from the engines' counters and histograms
(`policy.capacity.learned_prefill`) and plans the prefill term with it. The policy never sees the truth; the
benchmark does: the time model's unloaded prefill seconds of the long prompts that really arrived. This
module records the learned value the policy keeps while long prompts arrive and sets it against that truth,
per seed, so an estimator's bias is a printed figure rather than a guess.

`Recording` wraps the policy as the simulator runs it (composition: it delegates every tick and reads the
state the policy kept), so the measured run is the benchmark's `context-aware` run itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from m3fleet.autoscaling.policy import LEARNED_AFTER
from m3fleet.autoscaling.signals import FleetState, MetricsSnapshot
from m3fleet_simulator.whatif import ContextAware, Setup

LONG_PHASE_MARK = "long"  # scenario phases whose label has it serve the long-context mix


@dataclass
class Recording:
    """The policy, unchanged, with the learned throughput it holds at each tick inside a long-prompt phase."""

    policy: ContextAware
    setup: Setup
    learned: list[float] = field(default_factory=list)
    name: str = field(init=False)
    phases: list[tuple[float, float]] = field(init=False)  # the long-prompt phases (start, end), read once

    def __post_init__(self) -> None:
        self.name = self.policy.name
        self.phases = _long_phases(self.setup)

    def desired(self, snapshot: MetricsSnapshot, fleet: FleetState) -> int:
        replicas = self.policy.desired(snapshot, fleet)
        state = self.policy.state
        moment = fleet.now - self.setup.clock_offset
        if state.prefill_rate is not None and state.prefill_samples >= LEARNED_AFTER and _inside(self.phases, moment):
            self.learned.append(state.prefill_rate)
        return replicas


def _long_phases(setup: Setup) -> list[tuple[float, float]]:
    return [(p.start, p.end) for p in setup.scenario.phases(setup.seed) if LONG_PHASE_MARK in p.label]


def _inside(phases: list[tuple[float, float]], moment: float) -> bool:
    return any(start <= moment < end for start, end in phases)


def true_throughput(setup: Setup, long_prompt_tokens: float) -> float | None:
    """Prompt tokens per second one replica prefills, unloaded, over the long prompts that arrived in the long
    phases (work-weighted: their tokens over their prefill seconds); None when none arrived."""
    phases = _long_phases(setup)
    prompts = [r.prompt for r in setup.requests if r.prompt >= long_prompt_tokens and _inside(phases, r.arrival)]
    seconds = sum(setup.model.unloaded_prefill_seconds(p) for p in prompts)
    if not prompts or seconds <= 0:
        return None
    return sum(prompts) / seconds * max(1, setup.plan.data_parallel_size)


def learned_prefill_report(recording: Recording) -> dict[str, Any] | None:
    """Mean and peak of what the policy had learned while long prompts arrived, over the truth; None when it
    learned nothing there (no long-prompt phase, or too few observations)."""
    truth = true_throughput(recording.setup, recording.policy.config.long_prompt_tokens)
    if truth is None or not recording.learned:
        return None
    mean = sum(recording.learned) / len(recording.learned)
    peak = max(recording.learned)
    return {
        "trueTokensPerSecond": round(truth),
        "learnedMean": round(mean),
        "learnedPeak": round(peak),
        "meanOverTrue": round(mean / truth, 3),
        "peakOverTrue": round(peak / truth, 3),
        "ticks": len(recording.learned),
    }

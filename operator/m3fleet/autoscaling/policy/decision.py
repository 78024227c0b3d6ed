"""The decision a tick makes (`Decision`, written as `status.autoscaling`) and the text of its reason."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from m3fleet.api.models import AutoscalingMode
from m3fleet.autoscaling.forecast import Bounds
from m3fleet.autoscaling.policy.config import PolicyConfig
from m3fleet.autoscaling.policy.demand import Terms
from m3fleet.autoscaling.signals import FleetState
from m3fleet.text import tokens as format_tokens

MEASURED = "measured: p90 of the last replicas to become ready"
PRIOR = "prior: spec.autoscaling.coldStartSeconds (no replica measured yet)"


class Action(StrEnum):
    SCALE_UP = "scale-up"
    SCALE_DOWN = "scale-down"
    HOLD = "hold"


@dataclass(frozen=True)
class Decision:
    time: float
    mode: str
    action: Action
    desired_replicas: int
    current_replicas: int
    recommended_replicas: int  # before stabilization and step limits
    reason: str
    terms: dict[str, float] = field(default_factory=dict)
    panic: bool = False
    unservable_requests: int = 0
    bounds: Bounds | None = None  # min/max in force (the schedule applied)
    forecast: tuple[int, str] | None = None  # (floor, why) from the resource's own history
    capacity: dict[str, Any] = field(default_factory=dict)  # KV capacity: plan, reported, used, mismatch
    prefill: dict[str, Any] = field(default_factory=dict)  # prefill throughput: prior, learned, used
    # The time-to-ready the horizon is built on, and where it came from ("measured" or "prior").
    time_to_ready: tuple[float, str] | None = None
    # Warnings for Events: (reason, message), e.g. ("KVCapacityMismatch", ...). The operator emits each
    # when it first appears (compare with the previous status's `warnings`).
    warnings: tuple[tuple[str, str], ...] = ()
    # On a scale-down: each measured replica's cost of removal (its resident KV tokens), so the replicas holding
    # the least work go first; the operator hands it to a Deployment's ReplicaSet as POD_DELETION_COST.
    removal_costs: dict[str, int] = field(default_factory=dict)
    # Which term decided (`decided_by`): the need's largest (kv, bin, prefill, decode), a floor (forecast,
    # standing), a bound (minReplicas, maxReplicas), or what held the move back (scaleDownWindow, scaleUpWindow,
    # panic, missingMetrics, metricsUnavailable, releasedStarting).
    decided_by: str = ""

    @property
    def applied(self) -> bool:
        """True when the operator should write `desired_replicas` (act mode and a change)."""
        return self.mode == AutoscalingMode.ACT.value and self.desired_replicas != self.current_replicas

    def to_status(self) -> dict[str, Any]:
        """`status.autoscaling`: the last decision, every term, the reason, the time."""
        return {
            "mode": self.mode,
            "action": self.action.value,
            "desiredReplicas": self.desired_replicas,
            "currentReplicas": self.current_replicas,
            "recommendedReplicas": self.recommended_replicas,
            "applied": self.applied,
            "panic": self.panic,
            "unservableRequests": self.unservable_requests,
            "reason": self.reason,
            **({"decidedBy": self.decided_by} if self.decided_by else {}),
            "time": datetime.fromtimestamp(self.time, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "terms": {k: _round(v) for k, v in self.terms.items()},
            **(
                {
                    "bounds": {
                        "minReplicas": self.bounds.min_replicas,
                        "maxReplicas": self.bounds.max_replicas,
                        "schedule": list(self.bounds.windows),
                    }
                }
                if self.bounds is not None
                else {}
            ),
            **({"forecast": {"replicas": self.forecast[0], "reason": self.forecast[1]}} if self.forecast else {}),
            **({"capacity": self.capacity} if self.capacity else {}),
            **({"prefillThroughput": self.prefill} if self.prefill else {}),
            **(
                {"timeToReady": {"seconds": _round(self.time_to_ready[0]), "source": self.time_to_ready[1]}}
                if self.time_to_ready
                else {}
            ),
            "warnings": [{"reason": r, "message": m} for r, m in self.warnings],
        }


def _round(value: float) -> float:
    return round(value, 3) if math.isfinite(value) else 0.0


def make_decision(
    config: PolicyConfig,
    fleet: FleetState,
    desired: int,
    recommended: int,
    reason: str,
    bounds: Bounds,
    panic: bool,
    **details: Any,
) -> Decision:
    """The one place a Decision is made: what is common to holding and to deciding on the terms."""
    return Decision(
        time=fleet.now,
        mode=config.mode,
        action=_action(desired, fleet.current_replicas),
        desired_replicas=desired,
        current_replicas=fleet.current_replicas,
        recommended_replicas=recommended,
        reason=_mode_prefix(config, reason),
        panic=panic,
        bounds=bounds,
        **details,
    )


def _action(desired: int, current: int) -> Action:
    if desired > current:
        return Action.SCALE_UP
    if desired < current:
        return Action.SCALE_DOWN
    return Action.HOLD


def _mode_prefix(config: PolicyConfig, reason: str) -> str:
    return f"advisory (not applied): {reason}" if config.mode == AutoscalingMode.ADVISORY.value else reason


def explain_need(terms: Terms) -> str:
    v = terms.values
    if terms.dominant == "prefill":
        detail = (
            f"prefill needs {v['prefillReplicas']:.2f} replicas ({format_tokens(v['arrivingPromptTokensPerSecond'])}/s "
            f"prompt tokens arriving, {format_tokens(v['queuedPromptTokens'])} queued, "
            f"{format_tokens(v['prefillTokensPerSecondPerReplica'])}/s per replica)"
        )
    elif terms.dominant == "decode":
        detail = (
            f"decode needs {v['decodeReplicas']:.2f} replicas ({format_tokens(v['arrivingOutputTokensPerSecond'])}/s "
            f"output tokens arriving, {format_tokens(v['decodeTokensPerSecondPerReplica'])}/s per replica: "
            f"{v['decodeBatchPerRank']:.0f} sequences a rank within the ITL objective, {v['tokensPerDecodeStep']:g} "
            "tokens a step)"
        )
    elif terms.dominant == "bin":
        detail = (
            f"{v['longRequests']:.0f} long requests need {v['binReplicas']:.2f} replicas "
            f"(each over a third of a {format_tokens(v['binTokens'])}-token rank)"
        )
    else:
        detail = (
            f"KV demand {format_tokens(v['kvDemandTokens'])} tokens needs {v['kvReplicas']:.2f} replicas "
            f"of {format_tokens(v['kvTokensPerReplica'])}"
        )
    if terms.unservable:
        detail += f"; {terms.unservable} queued requests exceed any replica's KV and are not scaled on"
    return detail


def decided_by(
    terms: Terms, raised_by: str | None, bounds: Bounds, recommendation: int, desired: int, held_by: str | None
) -> str:
    """The one term that set this tick's replicas (see `Decision.decided_by`)."""
    if desired != recommendation and held_by is not None:
        return held_by
    if raised_by is not None:
        return raised_by
    if recommendation == bounds.min_replicas and terms.need < recommendation:
        return "minReplicas"
    if recommendation == bounds.max_replicas and terms.need > recommendation:
        return "maxReplicas"
    return terms.dominant


def action_phrase(
    config: PolicyConfig, current: int, desired: int, recommendation: int, need: int, held_by: str | None
) -> str:
    """What the tick does, and what held back a recommendation it does not follow."""
    if desired > current:
        return f"scale-up {current} -> {desired}"
    if desired < current:
        return f"scale-down {current} -> {desired}"
    if recommendation == current:
        return f"hold at {current}" + (" (within tolerance)" if need != current else "")
    if recommendation < current:
        by = held_by or f"the {config.scale_down_window_seconds:.0f}s stabilization window"
        return f"hold at {current}: scale-down to {recommendation} held by {by}"
    return f"hold at {current}: scale-up to {recommendation} held by the scale-up window"

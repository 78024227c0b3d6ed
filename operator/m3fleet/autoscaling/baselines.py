"""The autoscalers the simulator compares, all behind one interface: `desired(snapshot, fleet) -> int`.

* `ContextAware` — ours (`policy.decide`), with its state round-tripped through `to_dict` every
  tick as the operator persists it.
* `RequestCount` — an HPA on running + waiting requests per replica (KubeAI-like).
* `KvUtilization` — the common KEDA recipe: KV-cache usage 0.8 per replica, plus waiting > 5.
* `Schedule` — replays a precomputed replica count per time (the oracle).

The two HPA baselines use Kubernetes HPA semantics with its defaults: the 10% tolerance, replicas
not yet ready counted at 0 when scaling up, max(+4, +100%) per 15 s up, a 300 s scale-down
stabilization window and no scale-down rate limit; with several metrics the largest wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from m3fleet.autoscaling.policy import Behavior, PolicyConfig, PolicyState, decide, stabilize
from m3fleet.autoscaling.signals import FleetState, MetricsSnapshot, ReplicaSignals

HPA_BEHAVIOR = Behavior(scale_up_window_seconds=0.0, scale_down_window_seconds=300.0)
HPA_TOLERANCE = 0.1


@dataclass
class ContextAware:
    config: PolicyConfig
    name: str = "context-aware"
    state: PolicyState = field(default_factory=PolicyState)

    def desired(self, snapshot: MetricsSnapshot, fleet: FleetState) -> int:
        decision, state = decide(self.config, self.state, snapshot, fleet)
        self.state = PolicyState.from_dict(state.to_dict())
        return decision.desired_replicas


def hpa_recommendation(total: float, target: float, reporting: int, starting: int, current: int) -> int:
    """One HPA metric (AverageValue per pod): replicas for `total` at `target` per replica.

    Only pods reporting the metric count; when the ratio asks for more, pods still starting are
    added at 0 usage first (kubernetes replica_calculator), so they damp repeated scale-ups.
    """
    if reporting == 0:
        return current
    ratio = total / (target * reporting)
    if abs(ratio - 1.0) <= HPA_TOLERANCE:
        return current
    if ratio > 1.0 and starting:
        ratio = total / (target * (reporting + starting))
        if ratio <= 1.0 + HPA_TOLERANCE:
            return current
        return math.ceil(ratio * (reporting + starting))
    return math.ceil(ratio * reporting)


@dataclass
class HpaBaseline:
    """An HPA over per-replica metrics; `metrics` are (value of one replica, target) pairs."""

    name: str
    min_replicas: int
    max_replicas: int
    metrics: Sequence[tuple[Callable[[ReplicaSignals], float | None], float]]
    history: tuple[tuple[float, int], ...] = ()

    def desired(self, snapshot: MetricsSnapshot, fleet: FleetState) -> int:
        current = fleet.current_replicas
        recommendations = []
        for value, target in self.metrics:
            values = [v for r in snapshot.replicas if r.up and (v := value(r)) is not None]
            if values and not snapshot.error:
                recommendations.append(
                    hpa_recommendation(sum(values), target, len(values), fleet.starting_replicas, current)
                )
        if not recommendations:
            return max(self.min_replicas, min(self.max_replicas, current))  # no metrics: hold
        recommendation = max(self.min_replicas, min(self.max_replicas, max(recommendations)))
        desired, self.history = stabilize(self.history, fleet.now, recommendation, current, HPA_BEHAVIOR)
        return max(self.min_replicas, min(self.max_replicas, desired))


def _in_flight(r: ReplicaSignals) -> float | None:
    return None if r.running is None or r.waiting is None else r.running + r.waiting


def request_count(target: float, min_replicas: int, max_replicas: int) -> HpaBaseline:
    return HpaBaseline("request-count", min_replicas, max_replicas, [(_in_flight, target)])


def kv_utilization(target: float, min_replicas: int, max_replicas: int, waiting: float = 5.0) -> HpaBaseline:
    return HpaBaseline(
        "kv-utilization", min_replicas, max_replicas, [(lambda r: r.kv_usage, target), (lambda r: r.waiting, waiting)]
    )


@dataclass
class Schedule:
    """Replays a replica count per `step` seconds (the oracle's perfect-foresight plan)."""

    counts: Sequence[int]
    step: float
    name: str = "oracle"

    def desired(self, snapshot: MetricsSnapshot, fleet: FleetState) -> int:
        index = min(len(self.counts) - 1, max(0, int(fleet.now // self.step)))
        return self.counts[index]

"""The autoscalers the benchmark compares the policy with, behind the simulator's `desired(snapshot, fleet)`.

* `Hpa` — Kubernetes' HorizontalPodAutoscaler, its algorithm as the controller runs it
  (pkg/controller/podautoscaler: replica_calculator.go and horizontal.go): per metric a usage ratio
  over the pods that report it, the 10% tolerance, pods without a metric counted at the target when
  scaling down and at 0 when scaling up, pods not yet ready counted at 0 when scaling up (and a
  recomputed ratio that must still ask for more), the largest recommendation over metrics; then
  `behavior`: the highest recommendation in a 300 s scale-down stabilization window, none for
  scale-up, scale-up limited per 15 s period to max(+100%, +4 pods), scale-down to 100% per period.
  Metrics: `Pods` (AverageValue per pod) or `External` (AverageValue of a total).
* `request-count` — HPA on running + waiting requests per pod (KubeAI / production-stack style).
* `kv-utilization` — HPA on KV-cache usage per pod (the GKE/llm-d recipe without the queue term).
* `queue-length` — KEDA's Prometheus scaler on the total waiting requests (an External
  AverageValue), as KServe and vLLM production-stack wire it.
* `Fixed` — a constant fleet, no autoscaler.
* `Schedule` — replays a precomputed count per tick (the oracle).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from m3fleet.autoscaling.signals import FleetState, MetricsSnapshot, ReplicaSignals

TOLERANCE = 0.1
SCALE_DOWN_WINDOW = 300.0
SCALE_UP_PODS, SCALE_UP_PERCENT = 4, 100.0
PERIOD = 15.0

Value = Callable[[ReplicaSignals], float | None]


@dataclass(frozen=True)
class Metric:
    value: Value
    target: float
    external: bool = False  # External AverageValue: the sum over pods against target x replicas


def replica_count(metric: Metric, snapshot: MetricsSnapshot, fleet: FleetState) -> int | None:
    """One metric's recommendation (replica_calculator.go); None when no pod reports it."""
    current = fleet.current_replicas
    reporting = [v for r in snapshot.replicas if r.up and (v := metric.value(r)) is not None]
    if not reporting or snapshot.error:
        return None
    total = sum(reporting)
    if metric.external:  # GetExternalPerPodMetricReplicas: the total against target x current replicas
        ratio = total / (metric.target * max(1, current))
        if abs(ratio - 1.0) <= TOLERANCE:
            return current
        return math.ceil(total / metric.target)
    ready_with = len(reporting)
    missing = max(0, fleet.ready_replicas - ready_with)  # ready pods without the metric
    unready = fleet.starting_replicas
    ratio = total / (metric.target * ready_with)
    if abs(ratio - 1.0) <= TOLERANCE and not missing and not unready:
        return current
    scale_up = ratio > 1.0
    if not missing and not (scale_up and unready):
        if abs(ratio - 1.0) <= TOLERANCE:
            return current
        return math.ceil(ratio * ready_with)
    # Missing pods count at the target when scaling down and at 0 when scaling up; unready pods at 0
    # when scaling up. The recomputed ratio must still point the same way, beyond the tolerance.
    pods = ready_with + missing + (unready if scale_up else 0)
    padded_total = total + (0.0 if scale_up else missing * metric.target)
    new_ratio = padded_total / (metric.target * pods)
    if abs(new_ratio - 1.0) <= TOLERANCE or (new_ratio > 1.0) != scale_up:
        return current
    return math.ceil(new_ratio * pods)


@dataclass
class Hpa:
    name: str
    min_replicas: int
    max_replicas: int
    metrics: Sequence[Metric]
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    events: list[tuple[float, int]] = field(default_factory=list)  # (time, replicas changed by)

    def desired(self, snapshot: MetricsSnapshot, fleet: FleetState) -> int:
        now, current = fleet.now, fleet.current_replicas
        counts = [c for m in self.metrics if (c := replica_count(m, snapshot, fleet)) is not None]
        if not counts:
            return max(self.min_replicas, min(self.max_replicas, current))  # no metrics: no change
        recommendation = max(counts)
        self.recommendations.append((now, recommendation))
        self.recommendations = [(t, n) for t, n in self.recommendations if now - t <= SCALE_DOWN_WINDOW]
        stabilized = recommendation
        if recommendation < current:  # scale-down: the highest recommendation in the window wins
            stabilized = min(current, max(n for _, n in self.recommendations))
        desired = stabilized
        # Rate policies over the last period (selectPolicy Max): up max(+100%, +4), down 100%.
        self.events = [(t, d) for t, d in self.events if now - t < PERIOD]
        if desired > current:
            start = current - sum(d for _, d in self.events if d > 0)
            limit = max(start + SCALE_UP_PODS, math.ceil(start * (1 + SCALE_UP_PERCENT / 100)))
            desired = min(desired, limit)
        desired = max(self.min_replicas, min(self.max_replicas, desired))
        if desired != current:
            self.events.append((now, desired - current))
        return desired


def _in_flight(r: ReplicaSignals) -> float | None:
    return None if r.running is None or r.waiting is None else r.running + r.waiting


def request_count(target: float, min_replicas: int, max_replicas: int) -> Hpa:
    return Hpa("request-count", min_replicas, max_replicas, [Metric(_in_flight, target)])


def kv_utilization(target: float, min_replicas: int, max_replicas: int) -> Hpa:
    return Hpa("kv-utilization", min_replicas, max_replicas, [Metric(lambda r: r.kv_usage, target)])


def queue_length(threshold: float, min_replicas: int, max_replicas: int) -> Hpa:
    return Hpa("queue-length", min_replicas, max_replicas, [Metric(lambda r: r.waiting, threshold, external=True)])


@dataclass
class Fixed:
    replicas: int
    name: str = "fixed"

    def desired(self, snapshot: MetricsSnapshot, fleet: FleetState) -> int:
        return self.replicas


@dataclass
class Schedule:
    """Replays a replica count per `step` seconds of simulated time (the oracle's plan)."""

    counts: Sequence[int]
    step: float
    start: float  # the wall-clock time of simulated t = 0
    name: str = "oracle"

    def desired(self, snapshot: MetricsSnapshot, fleet: FleetState) -> int:
        index = min(len(self.counts) - 1, max(0, int((fleet.now - self.start) // self.step)))
        return self.counts[index]

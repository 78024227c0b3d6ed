"""The autoscaler in the operator: one tick = read -> decide (pure policy) -> record -> apply.

Per resource with `spec.autoscaling.enabled`, every `intervalSeconds`:
1. read the engine metrics from Prometheus (the adapter never raises: failures become a snapshot that
   makes the policy hold) and the fleet from Kubernetes (the workload's replicas, its serving pods'
   ages, and how long the ready ones took to become ready: the measured cold start);
2. `policy.decide(...)` — pure, time is an input;
3. record the decision in `status.autoscaling` (with the policy state, so a restarted operator keeps its
   stabilization history) — only when the decision changed, so a steady fleet causes no writes;
4. in `act` mode, a new replica count reaches the child workload through the normal reconcile, which
   renders `status.autoscaling.desiredReplicas`: one field manager owns the child, and `spec` (GitOps's)
   and `/scale` are never written. `advisory` mode stops after step 3.
"""

from __future__ import annotations

import asyncio
import calendar
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from m3fleet.api import parse_resource
from m3fleet.autoscaling.metrics import PrometheusAdapter
from m3fleet.autoscaling.policy import Decision, PolicyConfig, PolicyState, decide
from m3fleet.autoscaling.signals import FleetState, MetricsSnapshot, quantile
from m3fleet.controller import kube, metrics
from m3fleet.controller.kube import KubeApi
from m3fleet.controller.reconcile import Reconciler
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan as make_plan
from m3fleet.render import labels

# Engine series carry the pod's labels as Prometheus labels (the chart's PodMonitor, or the usual
# `labelmap` of __meta_kubernetes_pod_label_(.+) for annotation-based scraping).
FLEET_LABEL = "m3fleet_dev_name"
TIME_TO_READY_SAMPLES = 10
IDLE_RECHECK_SECONDS = 60.0  # a resource without autoscaling is looked at again once a minute


class MetricsSource(Protocol):
    def read(self, at: float | None = None) -> MetricsSnapshot: ...


AdapterFactory = Callable[[str, str, Mapping[str, str], Mapping[str, str]], MetricsSource]


def prometheus_adapter(
    engine: str, url: str, selector: Mapping[str, str], overrides: Mapping[str, str]
) -> MetricsSource:
    return PrometheusAdapter.for_engine(engine, url, selector=dict(selector), overrides=dict(overrides))


def _epoch(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    return float(calendar.timegm(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")))


def fleet_from(workload: Mapping[str, Any], pods: list[dict[str, Any]], now: float) -> FleetState:
    """Replicas from the workload; starting ages and measured time-to-ready from its serving pods."""
    spec_replicas = int((workload.get("spec") or {}).get("replicas") or 0)
    ready = int((workload.get("status") or {}).get("readyReplicas") or 0)
    starting: list[float] = []
    took: list[float] = []
    for pod in pods:
        created = _epoch(pod["metadata"].get("creationTimestamp"))
        if created is None or pod["metadata"].get("deletionTimestamp"):
            continue
        condition = next(
            (c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None
        )
        if condition and condition.get("status") == "True":
            became = _epoch(condition.get("lastTransitionTime"))
            if became is not None and became >= created:
                took.append(became - created)
        else:
            starting.append(max(0.0, now - created))
    measured = quantile(sorted(took)[-TIME_TO_READY_SAMPLES:], 0.9) if took else None
    return FleetState(
        now=now,
        current_replicas=spec_replicas,
        ready_replicas=ready,
        starting_ages=tuple(sorted(starting)[: max(0, spec_replicas - ready)]),
        time_to_ready_seconds=measured,
    )


HEARTBEAT_SECONDS = 300.0


def _worth_recording(previous: Mapping[str, Any], decision: Mapping[str, Any], now: float) -> bool:
    """Record when what is decided changes (the reason's numbers drift every tick and do not count), and
    otherwise at most every HEARTBEAT_SECONDS, so the terms shown stay current without a write per tick."""
    if not previous:
        return True
    keys = ("desiredReplicas", "action", "mode", "panic", "applied")
    if any(previous.get(k) != decision.get(k) for k in keys):
        return True
    if bool(previous.get("unservableRequests")) != bool(decision.get("unservableRequests")):
        return True
    last = _epoch(previous.get("time"))
    return last is None or now - last >= HEARTBEAT_SECONDS


@dataclass
class Autoscaler:
    api: KubeApi
    reconciler: Reconciler
    adapters: AdapterFactory = prometheus_adapter
    clock: Callable[[], float] = time.time
    _states: dict[tuple[str, str], PolicyState] = field(default_factory=dict)
    _sources: dict[tuple[str, str], tuple[tuple[Any, ...], MetricsSource]] = field(default_factory=dict)
    _intervals: dict[tuple[str, str], float] = field(default_factory=dict)

    def interval(self, namespace: str, name: str) -> float:
        """Seconds until this resource's next tick: its intervalSeconds, or a minute when autoscaling is off."""
        return self._intervals.get((namespace, name), IDLE_RECHECK_SECONDS)

    def _source(self, key: tuple[str, str], engine: str, url: str, overrides: Mapping[str, str]) -> MetricsSource:
        signature = (engine, url, tuple(sorted(overrides.items())))
        cached = self._sources.get(key)
        if cached is None or cached[0] != signature:
            selector = {"namespace": key[0], FLEET_LABEL: key[1]}
            cached = (signature, self.adapters(engine, url, selector, overrides))
            self._sources[key] = cached
        return cached[1]

    def forget(self, namespace: str, name: str) -> None:
        self._states.pop((namespace, name), None)
        self._sources.pop((namespace, name), None)
        self._intervals.pop((namespace, name), None)

    async def tick(self, namespace: str, name: str, logger: logging.Logger | Any) -> Decision | None:
        """One decision for one resource; None when there is nothing to decide on yet."""
        body = await self.api.get(kube.M3D, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        try:
            resource = parse_resource(body)
            plan = make_plan(resource.spec)
        except (SpecError, SpecErrors):
            return None  # the reconcile reports it (Degraded/InvalidSpec); nothing to scale
        scaling = resource.spec.autoscaling
        if not scaling.enabled:
            self.forget(namespace, name)
            return None
        self._intervals[(namespace, name)] = float(scaling.interval_seconds)
        workload_kind = kube.LEADER_WORKER_SET if plan.nodes_per_replica > 1 else kube.DEPLOYMENT
        workload = await self.api.get(workload_kind, namespace, name)
        if workload is None:
            return None  # not applied yet (or blocked): the reconcile owns that
        pods = await self.api.list(kube.POD, namespace, labels.serving_selector_string(name))
        key = (namespace, name)
        source = self._source(key, str(plan.engine), scaling.prometheus.url, scaling.prometheus.query_overrides)
        snapshot = await asyncio.to_thread(source.read)
        status = body.get("status") or {}
        previous = status.get("autoscaling") or {}
        state = self._states.get(key) or PolicyState.from_dict(previous.get("state") or {})
        config = PolicyConfig.from_spec(scaling, plan)
        decision, state = decide(config, state, snapshot, fleet_from(workload, pods, self.clock()))
        self._states[key] = state
        record = decision.to_status()
        metrics.AUTOSCALER_DESIRED.labels(namespace, name).set(decision.desired_replicas)
        if not _worth_recording(previous, record, decision.time):
            return decision
        metrics.AUTOSCALER_DECISIONS.labels(namespace, name, str(record.get("action", "hold"))).inc()
        await self.api.patch_status(namespace, name, {"autoscaling": {**record, "state": state.to_dict()}})
        reason = str(record.get("reason", ""))
        if decision.applied:
            self.reconciler.events.info(body, "Scaled", reason)
            logger.info("Autoscaler: %s", reason)
            await self.reconciler.reconcile_by_name(namespace, name, logger)
        elif previous.get("desiredReplicas") != record.get("desiredReplicas"):
            # Advisory mode (or a change held back): the recommendation changed, say so where people look.
            self.reconciler.events.info(body, "ScaleRecommended", reason)
        if decision.unservable_requests and not previous.get("unservableRequests"):
            self.reconciler.events.warn(body, "UnservableRequests", reason)
        return decision


TICK_SECONDS = 5.0  # how often the loop looks for resources whose interval has elapsed


async def run_forever(
    autoscaler: Autoscaler, known: set[tuple[str, str]], logger: logging.Logger, tick_seconds: float = TICK_SECONDS
) -> None:
    """Tick every known resource each `spec.autoscaling.intervalSeconds`. One operator-wide task, not a kopf
    daemon or timer: kopf puts a finalizer on every object those serve, which would block deletion while
    the operator is down. A resource without autoscaling costs one read a minute."""
    due: dict[tuple[str, str], float] = {}
    loop = asyncio.get_running_loop()
    while True:
        now = loop.time()
        for key in sorted(known):
            if due.get(key, 0.0) > now:
                continue
            try:
                await autoscaler.tick(key[0], key[1], logger)
            except Exception as exc:  # one failing resource must not stop the others
                logger.warning("Autoscaler tick for %s/%s failed: %s", key[0], key[1], exc)
            due[key] = now + autoscaler.interval(*key)
        for key in set(due) - known:
            del due[key]
            autoscaler.forget(*key)
        await asyncio.sleep(tick_seconds)

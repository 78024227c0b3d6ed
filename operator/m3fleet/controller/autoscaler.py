"""The autoscaler in the operator: one tick = read -> decide (pure policy) -> record -> apply, for each scaled group.

A fleet's groups (`autoscaling.groups.scaled_groups`) are the spec's own tier and each context tier of
spec.gateway.tiers: each is read, decided and recorded on its own (its workload, pods, engine series, plan, bounds,
policy state and demand record), the spec's own at the top of `status.autoscaling` as ever, a tier's under
`status.autoscaling.tiers.<tier>`; one status write per tick carries every group that changed. Steps 1-4 are each
group's.

The operator's scheduler ticks each resource whose spec has `autoscaling.enabled`, every
`intervalSeconds` (a resource without autoscaling is never ticked and costs nothing):
1. read the engine metrics from Prometheus (the adapter never raises: failures become a snapshot that
   makes the policy hold) and the fleet from Kubernetes (the workload's replicas, its pods' ages and
   phases, and the measured time-to-ready: the p90 of the last replicas to become ready, as
   `status.timeToReady` keeps them plus any that became ready since — `coldStartSeconds` until one has);
2. `policy.decide(...)` — pure, time is an input;
   With `autoscaling.forecast` on, the snapshot carries the resource's own demand in earlier periods, read
   from `status.autoscaling.demand` (`forecast.DemandRecord`; each tick's `demandReplicas` is folded in by
   the pure `forecast.record_demand`: one sample per 1-minute bucket, two periods kept);
3. record the decision in `status.autoscaling` (with the policy state, so a restarted operator keeps its
   stabilization history, and the demand record) — only when the decision changed or a demand sample was
   added (at most one per bucket), so a steady fleet causes few writes;
4. in `act` mode, a new replica count reaches the child workload through the normal reconcile (the
   scheduler runs one right after such a tick), which renders `status.autoscaling.desiredReplicas`: one
   field manager owns the child, and `spec` (GitOps's) and `/scale` are never written. `advisory` mode
   stops after step 3.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from m3fleet import kubeapi, permissions
from m3fleet.api.models import AutoscalingSpec, PrometheusSpec
from m3fleet.autoscaling import slo, time_to_ready
from m3fleet.autoscaling.forecast import DemandRecord, bucket_seconds, record_demand
from m3fleet.autoscaling.groups import FLEET_LABEL, ScaledGroup, scaled_groups, tier_status
from m3fleet.autoscaling.policy import (
    POD_DELETION_COST,
    Action,
    Decision,
    PolicyConfig,
    PolicyState,
    decide,
    worth_recording,
)
from m3fleet.autoscaling.policy.zero import zero_rule
from m3fleet.autoscaling.prometheus import PrometheusAdapter, PrometheusError, PrometheusHttp, Tls
from m3fleet.autoscaling.promql import Gateway, held_requests_query
from m3fleet.autoscaling.signals import HISTOGRAM_WINDOW_SECONDS, RATE_WINDOW_SECONDS, MetricsSnapshot
from m3fleet.catalog.gateway import HELD_REQUESTS_METRIC
from m3fleet.controller import metrics
from m3fleet.controller.autoscaler_roles import RoleMemory, tick_roles
from m3fleet.controller.decide import Understood
from m3fleet.controller.events import Events
from m3fleet.controller.outages import Outages, tier_part
from m3fleet.kubeapi import ApiError, KubeApi

log = logging.getLogger(__name__)
K = TypeVar("K", bound=tuple[str, ...])  # a metrics source's cache key: namespace, name, then its group or role

GroupKey = tuple[str, str, str]  # (namespace, name, tier): the tier "" is the spec's own


class MetricsSource(Protocol):
    def read(self, at: float | None = None) -> MetricsSnapshot: ...


@dataclass(frozen=True)
class SourceSpec:
    """Where and how one resource's engine metrics are read; a changed spec builds a new source."""

    engine: str
    url: str
    selector: tuple[tuple[str, str], ...]
    overrides: tuple[tuple[str, str], ...]
    tls: Tls
    gateway: Gateway | None = None
    workers_of: str | None = None  # the LeaderWorkerSet whose worker pods count for their leader
    rate_window_seconds: float = RATE_WINDOW_SECONDS


AdapterFactory = Callable[[SourceSpec], MetricsSource]


def source_spec(
    namespace: str, name: str, engine: str, scaling: AutoscalingSpec, multi_node: bool, tls: Tls
) -> SourceSpec:
    """How the resource's spec says the metrics of its pods are read (`name`: the workload's, whose LeaderWorkerSet
    names a multi-node replica's worker pods)."""
    prometheus = scaling.prometheus
    return SourceSpec(
        engine=engine,
        url=prometheus.url,
        selector=(("namespace", namespace), (FLEET_LABEL, name)),
        overrides=tuple(sorted(prometheus.query_overrides.items())),
        tls=tls,
        gateway=gateway_of(scaling),
        # A multi-node replica's worker pods are named after its LeaderWorkerSet.
        workers_of=name if multi_node else None,
        rate_window_seconds=float(prometheus.rate_window_seconds),
    )


def group_source_spec(namespace: str, group: ScaledGroup, scaling: AutoscalingSpec, tls: Tls) -> SourceSpec:
    """One scaled group's metrics: its engine series only (a context tier's by its tier label; the spec's own tier's,
    when there are tiers, by an empty one). The gateway's request sizes are the whole pool's, counted before the
    picker chose a tier: they size the spec's own (longest) tier, where a burst's long prompts go."""
    spec = source_spec(namespace, group.workload_name, str(group.plan.engine), scaling, group.multi_node, tls)
    return replace(spec, selector=group.metric_labels, gateway=None if group.tier else spec.gateway)


def prometheus_adapter(source: SourceSpec) -> MetricsSource:
    return PrometheusAdapter.for_engine(
        source.engine,
        source.url,
        selector=dict(source.selector),
        overrides=dict(source.overrides),
        tls=source.tls,
        gateway=source.gateway,
        workers_of=source.workers_of,
        rate_window=source.rate_window_seconds,
        histogram_window=histogram_window(source.rate_window_seconds),
    )


def histogram_window(rate_window_seconds: float) -> float:
    """Window of the histograms read (finished requests): at least the rate window."""
    return max(HISTOGRAM_WINDOW_SECONDS, rate_window_seconds)


def slo_status(
    scaling: AutoscalingSpec, config: PolicyConfig, terms: Mapping[str, float], snapshot: MetricsSnapshot
) -> dict[str, Any]:
    """`status.autoscaling.slo`: the SLO attainment the engines' TTFT histograms show; nothing without metrics."""
    if snapshot.error is not None or not snapshot.replicas:
        return {}
    per_replica = terms.get("prefillTokensPerSecondPerReplica") or config.prefill_tokens_per_second
    window = histogram_window(float(scaling.prometheus.rate_window_seconds))
    return {"slo": slo.measure(scaling.slo, snapshot.replicas, per_replica, window).to_status()}


def gateway_of(scaling: AutoscalingSpec) -> Gateway | None:
    spec = scaling.gateway
    return None if spec is None else Gateway(spec.request_sizes_metric, tuple(sorted(spec.match_labels.items())))


@dataclass(frozen=True)
class Unreadable:
    """A metrics source that cannot be built (the CA Secret is missing): every read says why, so the policy holds."""

    engine: str
    error: str

    def read(self, at: float | None = None) -> MetricsSnapshot:
        return MetricsSnapshot(engine=self.engine, time=time.time() if at is None else at, error=self.error)


INSECURE_MESSAGE = (
    "spec.autoscaling.prometheus.insecureSkipVerify is true: Prometheus's TLS certificate is not verified, so "
    "anyone on the network path can feed the autoscaler made-up metrics; set caSecretRef instead"
)


def ca_from_secret(secret: Mapping[str, Any] | None, name: str, key: str) -> str:
    """The PEM text under `key` of the Secret; raises ValueError with a message naming what is missing."""
    where = f"spec.autoscaling.prometheus.caSecretRef: Secret {name}"
    if secret is None:
        raise ValueError(f"{where} does not exist in the resource's namespace; create it, or fix the name")
    encoded = (secret.get("data") or {}).get(key)
    if not encoded:
        raise ValueError(f"{where} has no key {key!r}; add the CA there, or set caSecretRef.key")
    try:
        return base64.b64decode(encoded).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{where} key {key!r} is not a PEM certificate") from None


def interval_of(understood: Understood) -> float | None:
    """Seconds between ticks of this resource; None when it does not autoscale (or its spec is invalid)."""
    resource = understood.resource
    if resource is None or not resource.spec.autoscaling.enabled:
        return None
    return float(resource.spec.autoscaling.interval_seconds)


@dataclass(frozen=True)
class Tick:
    """What one tick did: the decision (None: nothing to decide on), the resource as the status write
    returned it (None: nothing recorded), whether the workload must now be reconciled to a new count, and
    whether the resource turned out to be gone."""

    decision: Decision | None = None
    status: dict[str, Any] | None = None
    scale: bool = False
    gone: bool = False


@dataclass
class Autoscaler:
    api: KubeApi
    events: Events
    adapters: AdapterFactory = prometheus_adapter
    clock: Callable[[], float] = time.time
    # Per scaled group: (namespace, name, tier), the tier "" being the spec's own.
    _states: dict[GroupKey, PolicyState] = field(default_factory=dict)
    _sources: dict[GroupKey, tuple[SourceSpec, MetricsSource]] = field(default_factory=dict)
    _demand: dict[GroupKey, DemandRecord] = field(default_factory=dict)
    _groups: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)  # the tiers each resource last had
    _outages: Outages = field(default_factory=Outages)  # parts whose metrics cannot be read
    roles: RoleMemory = field(default_factory=RoleMemory)  # a disaggregated fleet's role ticks

    async def _tls(self, namespace: str, prometheus: PrometheusSpec) -> Tls:
        """How to verify Prometheus: the CA read from the Secret the spec names (by name, each tick, so a rotated
        CA is used at once), the system CAs, or not at all. Raises ValueError when the Secret does not serve."""
        ref = prometheus.ca_secret_ref
        if ref is None:
            return Tls(insecure_skip_verify=prometheus.insecure_skip_verify)
        try:
            secret = await self.api.get(kubeapi.SECRET, namespace, ref.name)
        except ApiError as exc:
            if exc.status == 403:
                raise ValueError(
                    permissions.secrets_refused(namespace, "spec.autoscaling.prometheus.caSecretRef")
                ) from None
            raise
        return Tls(ca_pem=ca_from_secret(secret, ref.name, ref.key))

    async def _source(self, body: Mapping[str, Any], group: ScaledGroup, scaling: AutoscalingSpec) -> MetricsSource:
        key = group_key(body, group)
        return await self.cached_source(
            body,
            self._sources,
            key,
            str(group.plan.engine),
            scaling.prometheus,
            lambda tls: group_source_spec(key[0], group, scaling, tls),
            announce=not group.tier,  # said once per resource (and logged), not per tier or tick
        )

    async def cached_source(
        self,
        body: Mapping[str, Any],
        cache: dict[K, tuple[SourceSpec, MetricsSource]],
        key: K,
        engine: str,
        prometheus: PrometheusSpec,
        wanted_with: Callable[[Tls], SourceSpec],
        announce: bool,
    ) -> MetricsSource:
        """The metrics source a spec asks for (`wanted_with` the TLS its Secret gives), kept in `cache` under `key`
        until the spec changes; a source that says why when the CA Secret does not serve. `announce`: this source
        warns (Event and log) when Prometheus's certificate is not verified."""
        namespace = body["metadata"]["namespace"]
        try:
            tls = await self._tls(namespace, prometheus)
        except ValueError as exc:
            return Unreadable(engine, str(exc))
        wanted = wanted_with(tls)
        cached = cache.get(key)
        if cached is None or cached[0] != wanted:
            cached = (wanted, self.adapters(wanted))
            cache[key] = cached
            if tls.insecure_skip_verify and announce:
                self.events.warn(body, "InsecureSkipVerify", INSECURE_MESSAGE)
                log.warning("%s/%s: %s", namespace, body["metadata"]["name"], INSECURE_MESSAGE)
        return cached[1]

    def forget(self, namespace: str, name: str) -> None:
        """The resource went away, or no longer autoscales."""
        self._drop(namespace, name, keep=())
        self.roles.forget(namespace, name)
        self._outages.forget(namespace, name)
        metrics.forget(metrics.AUTOSCALER_SERIES, namespace, name)

    def _drop(self, namespace: str, name: str, keep: Collection[str]) -> None:
        """Forget the groups of the resource but those of the tiers in `keep` (a removed tier's history must not be
        resumed if a tier of that name comes back); `keep` becomes the resource's groups."""
        memories: tuple[dict[GroupKey, Any], ...] = (self._states, self._sources, self._demand)
        removed = set(self._groups.pop((namespace, name), ())) - set(keep)
        for tier in removed:
            for memory in memories:
                memory.pop((namespace, name, tier), None)
        self._outages.forget(namespace, name, parts={tier_part(tier) for tier in removed})
        if keep:
            self._groups[(namespace, name)] = tuple(keep)

    async def _mark_removal_order(
        self, body: Mapping[str, Any], pods: list[dict[str, Any]], costs: Mapping[str, int]
    ) -> None:
        """Annotate the Deployment's pods with their removal cost (pod-deletion-cost), so its ReplicaSet deletes
        the ones holding the least KV. Only on a scale-down, and only pods whose cost changed: the annotation is
        not rewritten every tick. Best effort: when a pod cannot be marked the ReplicaSet's own order stands."""
        namespace = body["metadata"]["namespace"]
        for pod in pods:
            name = pod["metadata"]["name"]
            cost = costs.get(name)
            if cost is None or (pod["metadata"].get("annotations") or {}).get(POD_DELETION_COST) == str(cost):
                continue
            patch = {"metadata": {"annotations": {POD_DELETION_COST: str(cost)}}}
            try:
                await self.api.merge_patch(kubeapi.POD, namespace, name, patch)
            except ApiError as exc:
                fix = "; grant the operator patch on pods (the chart's RBAC does)" if exc.status == 403 else ""
                message = (
                    f"could not mark pod {name} with {POD_DELETION_COST} ({exc}): the scale-down removes the "
                    f"ReplicaSet's own choice (the newest ready pod), not the one holding the least KV{fix}"
                )
                self.events.warn(body, "RemovalOrderNotSet", message)
                log.warning("%s/%s: %s", namespace, body["metadata"]["name"], message)
                return

    async def _zero(
        self,
        key: GroupKey,
        scaling: AutoscalingSpec,
        decision: Decision,
        snapshot: MetricsSnapshot,
        before: Mapping[str, Any],
    ) -> tuple[Decision, dict[str, Any]]:
        """The zero rule (policy/zero.py) over the policy's decision, with the requests the endpoint picker holds
        (read from the same Prometheus; None when unreadable) and `status.autoscaling.scaleToZero` as it was. The
        picker holds requests per pool, before it knows which context tier they fit: a held request wakes every
        tier at zero, while each tier's idle window is its own (its own pods running or queueing requests)."""
        held = await asyncio.to_thread(self._held_requests, key, scaling)
        busy = any((r.running or 0) + (r.waiting or 0) > 0 for r in snapshot.replicas)
        last_busy = before.get("lastBusyTime")
        verdict = zero_rule(
            decision.desired_replicas,
            decision.current_replicas,
            held,
            busy,
            float(last_busy) if isinstance(last_busy, int | float) else None,
            decision.time,
            float(scaling.scale_to_zero_after_seconds),
        )
        record = {"scaleToZero": {"heldRequests": held, "lastBusyTime": verdict.last_busy, "rule": verdict.rule}}
        if verdict.rule is None or verdict.replicas == decision.desired_replicas:
            return decision, record
        change = verdict.replicas - decision.current_replicas
        action = Action.SCALE_UP if change > 0 else Action.SCALE_DOWN if change < 0 else Action.HOLD
        return replace(decision, desired_replicas=verdict.replicas, action=action, reason=str(verdict.reason)), record

    def _held_requests(self, key: GroupKey, scaling: AutoscalingSpec) -> float | None:
        """Requests the fleet's endpoint picker holds, summed; None when Prometheus does not answer or has no series."""
        cached = self._sources.get(key)
        tls = cached[0].tls if cached is not None else Tls()
        query = held_requests_query(key[0], key[1], HELD_REQUESTS_METRIC)  # the pool is named after the resource
        try:
            result = PrometheusHttp(scaling.prometheus.url, tls).custom_query(query)
            return float(result[0]["value"][1]) if result else None
        except (PrometheusError, OSError, ValueError, KeyError, IndexError):
            return None

    async def tick(self, body: Mapping[str, Any], understood: Understood) -> Tick:
        """One decision for each scaled group of one resource (the spec's own tier, and each context tier of
        spec.gateway.tiers), as the watch last delivered it (`understood`: its spec parsed and planned)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if body["metadata"].get("deletionTimestamp"):
            return Tick()
        resource, plan = understood.resource, understood.plan
        if resource is None or plan is None:
            return Tick()  # the reconcile reports it (Degraded/InvalidSpec); nothing to scale
        scaling = resource.spec.autoscaling
        if not scaling.enabled:
            self.forget(namespace, name)
            return Tick()
        if plan.disaggregation is not None:  # each role on its own signal (such a fleet has no context tiers)
            done = await tick_roles(self, body, resource, plan)
            return Tick(status=done.status, scale=done.scale, gone=done.gone)
        groups = scaled_groups(resource, plan)
        self._drop(namespace, name, keep=[g.tier for g in groups])
        status = body.get("status") or {}
        decided = []
        for group in groups:
            outcome = await self._decide(body, group, status)
            if outcome is None and not group.tier:  # the spec's own workload not applied yet (or blocked): the
                # reconcile owns that; or the resource was deleted unseen, then never tick it again
                return Tick(gone=not await kubeapi.still_exists(self.api, body))
            if outcome is not None:  # a tier's workload not applied yet: decided once the reconcile made it
                decided.append(outcome)
        main = decided[0]
        metrics.AUTOSCALER_DESIRED.labels(namespace, name).set(main.decision.desired_replicas)
        changed = [o for o in decided if o.changed]
        stale = set((status.get("autoscaling") or {}).get("tiers") or {}) - {g.tier for g in groups}
        if not changed and not stale:
            return Tick(main.decision)
        for outcome in changed:
            metrics.AUTOSCALER_DECISIONS.labels(namespace, name, str(outcome.record.get("action", "hold"))).inc()
        written = await self.api.patch_status(namespace, name, {"autoscaling": status_patch(changed, stale)})
        if written is None:
            return Tick(main.decision, gone=True)
        for outcome in changed:
            self._announce(body, outcome)
        return Tick(main.decision, written, scale=any(o.decision.applied for o in changed))

    async def _decide(
        self, body: Mapping[str, Any], group: ScaledGroup, status: Mapping[str, Any]
    ) -> GroupDecision | None:
        """One group's decision on its own workload, pods, series, plan, policy state and demand record; None when
        its workload does not exist."""
        namespace = body["metadata"]["namespace"]
        kind = kubeapi.LEADER_WORKER_SET if group.multi_node else kubeapi.DEPLOYMENT
        workload = await self.api.get(kind, namespace, group.workload_name)
        if workload is None:
            return None
        pods = await self.api.list(kubeapi.POD, namespace, group.pod_selector)
        key = group_key(body, group)
        scaling = group.spec.autoscaling
        source = await self._source(body, group, scaling)
        snapshot = await asyncio.to_thread(source.read)
        self.report_readable(body, tier_part(group.tier), snapshot.error)
        previous = tier_status(status, group.tier)
        state = self._states.get(key) or PolicyState.from_dict(previous.get("state") or {})
        config = PolicyConfig.from_spec(scaling, group.plan)
        fleet = time_to_ready.fleet_from(
            workload,
            pods,
            self.clock(),
            status.get("timeToReady"),
            group.plan.nodes_per_replica,
            config.cold_start_seconds,
        )
        period = config.forecast_period_seconds
        demand = self._demand.get(key) or DemandRecord.from_status(previous.get("demand"), bucket_seconds(period))
        look_ahead = config.forecast_look_ahead(fleet.time_to_ready_seconds)
        if config.forecast:
            snapshot = replace(snapshot, demand_history=demand.history(fleet.now, period, look_ahead))
        decision, state = decide(config, state, snapshot, fleet)
        self._states[key] = state
        zero: dict[str, Any] = {}
        if group.spec.gateway is not None and scaling.min_replicas == 0:
            decision, zero = await self._zero(key, scaling, decision, snapshot, previous.get("scaleToZero") or {})
        if config.forecast:
            demand = record_demand(demand, fleet.now, decision.terms.get("demandReplicas"), period, look_ahead)
            self._demand[key] = demand
        if decision.applied and decision.action is Action.SCALE_DOWN and kind is kubeapi.DEPLOYMENT:
            # Before the new count is written: the ReplicaSet must find the marks when it picks whom to delete.
            await self._mark_removal_order(body, pods, decision.removal_costs)
        record = {**decision.to_status(), **slo_status(scaling, config, decision.terms, snapshot), **zero}
        changed = worth_recording(previous, record, decision.time) or demand.worth_saving(previous.get("demand"))
        return GroupDecision(group, decision, record, state, demand, previous, changed)

    def report_readable(self, body: Mapping[str, Any], part: str, error: str | None) -> None:
        """An Event and a log line when the metrics of a resource's part ("" the whole fleet, "tier long", "prefill
        workers") become unreadable and when they are back (`Outages`)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        notice = self._outages.observe((namespace, name, part), error, self.clock())
        if notice is None:
            return
        if notice.warning:
            self.events.warn(body, notice.reason, notice.message)
            log.warning("%s/%s: metrics unavailable: %s", namespace, name, notice.message)
        else:
            self.events.info(body, notice.reason, notice.message)
            log.info("%s/%s: %s", namespace, name, notice.message)

    def _announce(self, body: Mapping[str, Any], outcome: GroupDecision) -> None:
        """The Events of a recorded decision; a context tier's name the tier."""
        decision, record, previous = outcome.decision, outcome.record, outcome.previous
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        reason = str(record.get("reason", ""))
        if outcome.group.tier:
            reason = f"tier {outcome.group.tier} ({outcome.group.workload_name}): {reason}"
        if decision.decided_by:  # the Event says which term decided, as status.autoscaling.decidedBy does
            reason = f"{reason} [decided by {decision.decided_by}]"
        if decision.applied:
            self.events.info(body, "Scaled", reason)
            log.info("%s/%s: %s", namespace, name, reason)
        elif previous.get("desiredReplicas") != record.get("desiredReplicas"):
            # Advisory mode (or a change held back): the recommendation changed, say so where people look.
            self.events.info(body, "ScaleRecommended", reason)
        if decision.unservable_requests and not previous.get("unservableRequests"):
            self.events.warn(body, "UnservableRequests", reason)


def group_key(body: Mapping[str, Any], group: ScaledGroup) -> GroupKey:
    return (body["metadata"]["namespace"], body["metadata"]["name"], group.tier)


@dataclass(frozen=True)
class GroupDecision:
    """One group's decision in a tick, what it records and whether that is worth a status write."""

    group: ScaledGroup
    decision: Decision
    record: dict[str, Any]
    state: PolicyState
    demand: DemandRecord
    previous: Mapping[str, Any]
    changed: bool

    def to_status(self) -> dict[str, Any]:
        return {**self.record, "state": self.state.to_dict(), "demand": self.demand.to_status()}


def status_patch(changed: Collection[GroupDecision], stale: Collection[str]) -> dict[str, Any]:
    """The merge patch of status.autoscaling: the spec's own tier's decision at its top (where it always was), each
    context tier's under tiers.<tier>, and tiers no longer in the spec removed."""
    patch: dict[str, Any] = {}
    tiers: dict[str, Any] = {tier: None for tier in sorted(stale)}
    for outcome in changed:
        if outcome.group.tier:
            tiers[outcome.group.tier] = outcome.to_status()
        else:
            patch.update(outcome.to_status())
    return {**patch, "tiers": tiers} if tiers else patch

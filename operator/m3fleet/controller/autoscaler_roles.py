"""A disaggregated fleet's tick (spec.disaggregation with autoscaling.enabled): each role on its own signal.

Called by `Autoscaler.tick` for a resource whose plan is disaggregated (such a fleet has no context tiers: the CRD
refuses spec.gateway with spec.disaggregation). One tick = read -> decide (autoscaling/policy/roles.py, pure) ->
record -> act through the reconcile:

1. read: each role's running workers from its workload (renderAs pods: the Deployment or LeaderWorkerSet
   `<name>-prefill` and `<name>-decode`; renderAs DynamoGraphDeployment: the graph's `prefill` and `decode`
   components), and each role's engine metrics from Prometheus over that role's pods only: the adapter's selector adds
   ROLE_LABEL, the pod label `m3fleet.dev/dynamo-role` as the chart's PodMonitor (or the usual labelmap of
   `__meta_kubernetes_pod_label_*`) carries it onto the series. Dynamo's workers pass their engine's own metrics
   through on Dynamo's system port, which the worker pods are scraped on (Dynamo 1.6.1: `dynamo/vllm/main.py` and
   `dynamo/sglang/publisher.py` register the engine's `vllm:` and `sglang:` families with
   `register_engine_metrics_callback`; `dynamo/trtllm/metrics.py` the `trtllm_` ones), so the names are the
   engines' (catalog/engine_metrics.py): prompt-token counters, waiting requests, KV gauges, TTFT and
   time-per-output-token histograms;
2. decide: `role_signals` -> `decide_tick` with a `Stabilizer` (the spec's scale-down window, per role);
3. record `status.autoscaling`: `roles.{prefill,decode}` (replicas, need, reason, decidedBy), `roles.ratio`,
   `roles.history` (each role's recent recommendations, so a restarted operator keeps its window) and, for readers
   of the aggregated shape (the render's `replicas_to_apply`, `kubectl get`), `desiredReplicas` = the decode count;
   only when a count or a reason's decider changed, or every RECORD_HEARTBEAT_SECONDS;
4. act mode: the reconcile that follows renders `role_replicas_to_apply` (each role's workload, or the graph's
   components). Advisory mode records only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from m3fleet import kubeapi
from m3fleet.api.models import AutoscalingMode, AutoscalingSpec, MiniMaxM3Deployment, Plan, RenderAs
from m3fleet.autoscaling.policy import RECORD_HEARTBEAT_SECONDS
from m3fleet.autoscaling.policy.config import STALE_AFTER_INTERVALS, STALE_AFTER_MIN_SECONDS
from m3fleet.autoscaling.policy.roles import (
    History,
    RoleDecision,
    Stabilizer,
    behavior_of,
    decide_tick,
    history_from,
    role_signals,
    roles_record,
    targets_for,
)
from m3fleet.autoscaling.signals import MetricsSnapshot
from m3fleet.controller import metrics
from m3fleet.disaggregation import ROLES, Role
from m3fleet.render.dynamo import DYNAMO_ROLE

if TYPE_CHECKING:
    from m3fleet.autoscaling.prometheus import Tls
    from m3fleet.controller.autoscaler import Autoscaler, MetricsSource, SourceSpec

ROLE_LABEL = DYNAMO_ROLE.replace(".", "_").replace("/", "_").replace("-", "_")  # m3fleet_dev_dynamo_role

log = logging.getLogger(__name__)


def role_workload(name: str, role: Role, plan: Plan) -> tuple[kubeapi.Kind, str]:
    """The workload that runs a role's workers when m3fleet runs them itself (renderAs pods)."""
    d = plan.disaggregation
    nodes = (d.prefill if role == "prefill" else d.decode).nodes_per_worker if d is not None else 1
    return (kubeapi.LEADER_WORKER_SET if nodes > 1 else kubeapi.DEPLOYMENT), f"{name}-{role}"


def running_counts(
    workloads: Mapping[Role, Mapping[str, Any] | None], graph: Mapping[str, Any] | None
) -> dict[Role, int]:
    """Each role's workers as its workload is set now (spec.replicas), or the graph's components'."""
    if graph is not None:
        components = (graph.get("spec") or {}).get("components") or []
        return {role: sum(int(c.get("replicas") or 0) for c in components if c.get("type") == role) for role in ROLES}
    return {role: int(((workloads.get(role) or {}).get("spec") or {}).get("replicas") or 0) for role in ROLES}


def changed(previous: Mapping[str, Any], record: Mapping[str, Any], now: float) -> bool:
    """Write when a role's count or decider changed, the mode did, or the heartbeat is due (numbers drift)."""
    before, after = previous.get("roles") or {}, record["roles"]
    for role in ROLES:
        old, new = before.get(role) or {}, after[role]
        if (old.get("replicas"), old.get("decidedBy")) != (new["replicas"], new["decidedBy"]):
            return True
    if previous.get("mode") != record["mode"]:
        return True
    written = previous.get("time")
    try:
        age = now - datetime.strptime(str(written), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return True
    return age >= RECORD_HEARTBEAT_SECONDS


def status_record(
    mode: str,
    decisions: tuple[RoleDecision, RoleDecision],
    running: Mapping[Role, int],
    history: Mapping[Role, History],
    now: float,
) -> dict[str, Any]:
    prefill, decode = decisions
    applied = mode == AutoscalingMode.ACT.value and (prefill.replicas, decode.replicas) != (
        running["prefill"],
        running["decode"],
    )
    moves = [
        f"{role} {running[role]} -> {d.replicas}" if d.replicas != running[role] else f"{role} holds {d.replicas}"
        for role, d in zip(ROLES, decisions, strict=True)
    ]
    action = "scale" if (prefill.replicas, decode.replicas) != (running["prefill"], running["decode"]) else "hold"
    return {
        "mode": mode,
        "action": action,
        "applied": applied,
        "desiredReplicas": decode.replicas,  # what spec.replicas counts for a disaggregated fleet: decode workers
        "currentReplicas": running["decode"],
        "reason": f"{'; '.join(moves)} (prefill: {prefill.reason}; decode: {decode.reason})",
        "decidedBy": f"prefill {prefill.decided_by}, decode {decode.decided_by}",
        "time": datetime.fromtimestamp(now, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "roles": {
            **roles_record(prefill, decode),
            "history": {role: [list(e) for e in history[role]] for role in ROLES},
        },
    }


@dataclass(frozen=True)
class RoleTick:
    """What one role tick did: the resource as the status write returned it (None: nothing recorded), whether the
    role workloads must now be reconciled to new counts, whether the resource turned out to be gone."""

    status: dict[str, Any] | None = None
    scale: bool = False
    gone: bool = False


@dataclass
class RoleMemory:
    """What the role ticks keep per resource: each role's metrics source (a changed spec builds a new one) and each
    role's recent recommendations (the scale-down window's; status keeps those of the last write, for a restart)."""

    cached: dict[tuple[str, str, Role], tuple[SourceSpec, MetricsSource]] = field(default_factory=dict)
    history: dict[tuple[str, str], dict[Role, History]] = field(default_factory=dict)

    async def source(
        self, scaler: Autoscaler, body: Mapping[str, Any], engine: str, scaling: AutoscalingSpec, role: Role, lws: bool
    ) -> MetricsSource:
        from m3fleet.controller.autoscaler import source_spec

        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]

        def wanted_with(tls: Tls) -> SourceSpec:
            base = source_spec(namespace, name, engine, scaling, False, tls)
            # The role's pods only; a multi-node role's worker pods are named after its LeaderWorkerSet.
            return replace(
                base, selector=(*base.selector, (ROLE_LABEL, role)), workers_of=f"{name}-{role}" if lws else None
            )

        return await scaler.cached_source(
            body,
            self.cached,
            (namespace, name, role),
            engine,
            scaling.prometheus,
            wanted_with,
            announce=role == "prefill",  # said once per spec, not per role or tick
        )

    def forget(self, namespace: str, name: str) -> None:
        self.history.pop((namespace, name), None)
        for role in ROLES:
            self.cached.pop((namespace, name, role), None)


async def tick_roles(
    scaler: Autoscaler, body: Mapping[str, Any], resource: MiniMaxM3Deployment, plan: Plan
) -> RoleTick:
    """One decision for both roles of a disaggregated resource (see the module docstring)."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    d = plan.disaggregation
    if d is None:
        raise ValueError("tick_roles needs a disaggregated plan")
    spec, scaling = resource.spec, resource.spec.autoscaling
    graph: dict[str, Any] | None = None
    workloads: dict[Role, dict[str, Any] | None] = {}
    if d.render_as == RenderAs.DYNAMO_GRAPH_DEPLOYMENT:
        graph = await scaler.api.get(kubeapi.DYNAMO_GRAPH_DEPLOYMENT, namespace, name)
        present = graph is not None
    else:
        for role in ROLES:
            kind, workload = role_workload(name, role, plan)
            workloads[role] = await scaler.api.get(kind, namespace, workload)
        present = all(w is not None for w in workloads.values())
    if not present:  # not applied yet (the reconcile owns that), or deleted unseen: then never tick it again
        return RoleTick(gone=not await kubeapi.still_exists(scaler.api, body))
    running = running_counts(workloads, graph)
    snapshots: dict[Role, MetricsSnapshot] = {}
    for role in ROLES:
        multi_node = role_workload(name, role, plan)[0] is kubeapi.LEADER_WORKER_SET
        source = await scaler.roles.source(scaler, body, str(plan.engine), scaling, role, multi_node)
        snapshots[role] = await asyncio.to_thread(source.read)
        scaler.report_readable(body, f"{role} workers", snapshots[role].error)
    now = scaler.clock()
    status = body.get("status") or {}
    previous = status.get("autoscaling") or {}
    stale_after = max(STALE_AFTER_MIN_SECONDS, STALE_AFTER_INTERVALS * scaling.interval_seconds)  # the policy's rule
    reading = role_signals(snapshots, running, d, scaling.slo, stale_after)
    key = (namespace, name)
    history = scaler.roles.history.get(key) or history_from((previous.get("roles") or {}).get("history"))
    window = Stabilizer(dict(history), running, now, behavior_of(spec))
    decisions = decide_tick(targets_for(spec, d), reading, running, window)
    history = scaler.roles.history[key] = window.history
    record = status_record(str(scaling.mode), decisions, running, history, now)
    metrics.AUTOSCALER_DESIRED.labels(namespace, name).set(decisions[1].replicas)
    if not changed(previous, record, now):
        return RoleTick()
    metrics.AUTOSCALER_DECISIONS.labels(namespace, name, str(record["action"])).inc()
    written = await scaler.api.patch_status(namespace, name, {"autoscaling": record})
    if written is None:
        return RoleTick(gone=True)
    reason = f"{record['reason']} [decided by {record['decidedBy']}]"
    if record["applied"]:
        scaler.events.info(body, "Scaled", reason)
        log.info("%s/%s: %s", namespace, name, reason)
    elif (previous.get("roles") or {}).get("ratio") != record["roles"]["ratio"] and record["action"] == "scale":
        scaler.events.info(body, "ScaleRecommended", reason)
    return RoleTick(written, scale=bool(record["applied"]))

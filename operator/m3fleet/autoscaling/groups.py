"""The groups of replicas one fleet scales, each on its own demand: the spec's own tier and each context tier of
spec.gateway.tiers. Pure: the autoscaler's tick (controller/autoscaler.py) loops over them, and the reconcile
renders each tier's workload at the count its group last decided.

A group is everything the autoscaler needs to size it alone: its spec (the tier's context, parallelism and replica
bounds: `planner.tier_spec`), its plan (KV tokens and prefill throughput at its context), its workload, its pods and
its engine series in Prometheus (a tier's pods carry the tier label, which Prometheus's labelmap turns into
`m3fleet_dev_tier`; the spec's own tier's pods have none, so its series have it empty).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from m3fleet.api.models import MiniMaxM3Deployment, MiniMaxM3DeploymentSpec, Plan
from m3fleet.api.spec_gateway import MAIN_TIER
from m3fleet.autoscaling.policy import replicas_to_apply
from m3fleet.planner import plan_tier, tier_spec
from m3fleet.render import labels, workload_kind

# Engine series carry the pod's labels as Prometheus labels (the chart's PodMonitor, or the usual `labelmap` of
# __meta_kubernetes_pod_label_(.+) for annotation-based scraping).
FLEET_LABEL = "m3fleet_dev_name"
TIER_LABEL = "m3fleet_dev_tier"  # a context tier's pods (spec.gateway.tiers); empty on the spec's own tier's


@dataclass(frozen=True)
class ScaledGroup:
    """One set of replicas scaled on its own demand. `tier` is "" for the spec's own tier (whose decision stays at
    the top of status.autoscaling), else the context tier's name (status.autoscaling.tiers.<tier>)."""

    tier: str
    spec: MiniMaxM3DeploymentSpec  # the group's spec: its replica bounds are its spec.autoscaling's
    plan: Plan
    workload_kind: str  # Deployment, or LeaderWorkerSet when a replica spans nodes
    workload_name: str
    pod_selector: str  # the group's pods, and no other group's
    metric_labels: tuple[tuple[str, str], ...]  # Prometheus label matchers selecting the group's engine series

    @property
    def label(self) -> str:
        """How status and Events name the group: the tier's name, `main` for the spec's own."""
        return self.tier or MAIN_TIER

    @property
    def multi_node(self) -> bool:
        return self.plan.nodes_per_replica > 1


def scaled_groups(resource: MiniMaxM3Deployment, plan: Plan) -> list[ScaledGroup]:
    """The fleet's groups, the spec's own tier first. Without context tiers there is one group, selecting exactly
    what the autoscaler selected before tiers existed (no tier matchers)."""
    meta, spec = resource.metadata, resource.spec
    owned = labels.owned_selector(meta.name)
    fleet = (("namespace", meta.namespace), (FLEET_LABEL, meta.name))
    tiers = spec.gateway.tiers if spec.gateway is not None else []
    main = ScaledGroup(
        tier="",
        spec=spec,
        plan=plan,
        workload_kind=workload_kind(plan),
        workload_name=meta.name,
        pod_selector=f"{owned},!{labels.TIER}" if tiers else owned,
        metric_labels=(*fleet, (TIER_LABEL, "")) if tiers else fleet,
    )
    return [main] + [
        ScaledGroup(
            tier=tier.name,
            spec=tier_spec(spec, tier),
            plan=tier_plan,
            workload_kind=workload_kind(tier_plan),
            workload_name=f"{meta.name}-{tier.name}",
            pod_selector=f"{owned},{labels.TIER}={tier.name}",
            metric_labels=(*fleet, (TIER_LABEL, tier.name)),
        )
        for i, tier in enumerate(tiers)
        for tier_plan in (plan_tier(spec, i),)
    ]


def tier_status(status: Mapping[str, Any], tier: str) -> dict[str, Any]:
    """The status a group's decisions live in, shaped as the resource's: the spec's own tier's is the resource's
    status.autoscaling, a context tier's is status.autoscaling.tiers.<tier>."""
    autoscaling = status.get("autoscaling") or {}
    if not tier:
        return dict(autoscaling)
    return dict((autoscaling.get("tiers") or {}).get(tier) or {})


def tier_replicas_to_apply(spec: MiniMaxM3DeploymentSpec, status: Mapping[str, Any]) -> dict[str, int]:
    """Each context tier's replica count: its `replicas`, unless the built-in autoscaler acts, then its last
    decision within its bounds (as `replicas_to_apply` is for the spec's own tier)."""
    tiers = spec.gateway.tiers if spec.gateway is not None else []
    return {
        tier.name: replicas_to_apply(tier_spec(spec, tier), {"autoscaling": tier_status(status, tier.name)})
        for tier in tiers
    }

"""Plan + spec -> every Kubernetes object of one MiniMaxM3Deployment. Pure and deterministic.

Order: ConfigMap (engine config), ComputeDomain (GB200 multi-node), the workload (a Deployment
when a replica fits one node, a LeaderWorkerSet group per replica when it spans nodes), NetworkPolicy
(unless spec.network.ingressPolicy is false), Service.
Owner references are not set here: the controller adds them with `set_owner` (the one hook).

Names: the workload is `<name>`, the Service `<name>-api` (never `<name>`: the LeaderWorkerSet
controller creates its own headless Service `<name>`, which LWS_LEADER_ADDRESS resolves through), the
rest `<name>-<suffix>`. The CRD's root CEL rules on metadata.name
(`m3fleet.api.models.RESOURCE_VALIDATIONS`) keep every one of them valid.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from m3fleet.api.cache import MiniMaxM3ModelCache, node_label_key
from m3fleet.api.models import MiniMaxM3Deployment, ModelCacheRef, NodeAffinityMode, Plan, RenderAs
from m3fleet.engines import Context, EngineLaunch, Role, launch
from m3fleet.engines.base import CacheMount
from m3fleet.errors import SpecError
from m3fleet.planner import plan_tier, role_plans, tier_spec
from m3fleet.render import labels
from m3fleet.render.dynamo import render_pods, worker_secrets
from m3fleet.render.dynamo_graph import render_graph
from m3fleet.render.gateway import gateway_objects
from m3fleet.render.pod import pod_template
from m3fleet.render.workloads import (
    COMPUTE_DOMAIN_API,
    LWS_API,
    NETWORK_POLICY_SUFFIX,
    POD_SECURITY_ANNOTATION,
    PROGRESS_DEADLINE_SECONDS,
    SERVICE_SUFFIX,
    compute_domain,
    config_digest,
    config_map,
    deployment,
    disruption_budget,
    leader_worker_set,
    network_policy,
    service,
    service_name,
    workload_meta,
)


def context_for(resource: MiniMaxM3Deployment, plan: Plan, cache: CacheMount | None = None) -> Context:
    return Context(resource.metadata.name, resource.metadata.namespace, resource.spec, plan, cache)


def tier_contexts(resource: MiniMaxM3Deployment, cache: CacheMount | None = None) -> list[Context]:
    """The context tiers of spec.gateway besides the spec's own: each planned and rendered as the spec at the
    tier's context, as its own workload `<name>-<tier>`."""
    gateway = resource.spec.gateway
    if gateway is None:
        return []
    meta = resource.metadata
    return [
        Context(
            meta.name, meta.namespace, tier_spec(resource.spec, tier), plan_tier(resource.spec, i), cache, tier.name
        )
        for i, tier in enumerate(gateway.tiers)
    ]


def _deployment(ctx: Context, engine: EngineLaunch, replicas: int) -> dict[str, Any]:
    container = engine.containers[Role.SINGLE]
    template = pod_template(ctx, Role.SINGLE, container, config_digest(engine.config_files), None)
    metadata = workload_meta(ctx, ctx.workload_name, engine.containers.values())
    selector = {**labels.workload_selector(ctx), labels.ROLE: Role.SINGLE.value}
    return deployment(ctx, metadata, template, replicas, selector)


def _leader_worker_set(ctx: Context, engine: EngineLaunch, replicas: int) -> dict[str, Any]:
    ssh = engine.ssh_secret
    config = config_digest(engine.config_files)
    leader = pod_template(ctx, Role.LEADER, engine.containers[Role.LEADER], config, ssh)
    worker = pod_template(ctx, Role.WORKER, engine.containers[Role.WORKER], config, ssh)
    metadata = workload_meta(ctx, ctx.workload_name, engine.containers.values())
    return leader_worker_set(ctx, metadata, leader, worker, replicas)


def workload_kind(plan: Plan) -> str:
    """The child that runs the replicas: a Deployment when a replica fits one node, else a LeaderWorkerSet
    (one leader/worker group per replica)."""
    return "LeaderWorkerSet" if plan.nodes_per_replica > 1 else "Deployment"


def replacement_notice(running: str, plan: Plan, was_disaggregated: bool = False) -> str | None:
    """What a spec change does to a fleet whose replicas run in a `running` (the workload kind) when the new
    plan puts them in the other kind, or switches between aggregated replicas and disaggregated Dynamo workers
    (the webhook warns with it, the operator's Event repeats it); None when the kind stays. The two are separate
    objects with separate rollouts, so rollout.maxSurge and maxUnavailable cannot bridge them."""
    d = plan.disaggregation
    gap = (
        "its replicas are deleted once the new workloads exist, not once they are ready: the fleet serves nothing "
        "until the new ones are ready (rollout.maxSurge and maxUnavailable do not apply across the two)"
    )
    if d is not None and not was_disaggregated:
        return (
            f"spec.disaggregation replaces the aggregated {running} with NVIDIA Dynamo's frontend, "
            f"{d.prefill.replicas} prefill and {d.decode.replicas} decode workers ({d.ratio}, as {d.render_as}): {gap}"
        )
    if d is None and was_disaggregated:
        return (
            f"removing spec.disaggregation replaces the disaggregated fleet (Dynamo frontend, prefill and decode "
            f"workers; its {running}) with aggregated replicas in a {workload_kind(plan)}: {gap}"
        )
    if d is not None:
        return None  # between disaggregated shapes each role's workload rolls on its own
    after = workload_kind(plan)
    if running == after:
        return None
    return (
        f"each replica now spans {plan.nodes_per_replica} node(s): the {running} is replaced by a {after}, and its "
        f"replicas are deleted once the {after} exists, not once it is ready: the fleet serves nothing until the "
        "new replicas are ready (rollout.maxSurge and maxUnavailable do not apply across the two)"
    )


def _workload(ctx: Context, count: int) -> list[dict[str, Any]]:
    """One workload and the engine-config ConfigMap it mounts (if its engine needs one)."""
    engine = launch(ctx)
    objects = [config_map(ctx, engine.config_files)] if engine.config_files else []
    if workload_kind(ctx.plan) == "LeaderWorkerSet":
        objects.append(_leader_worker_set(ctx, engine, count))
    else:
        objects.append(_deployment(ctx, engine, count))
    return objects


def render(
    resource: MiniMaxM3Deployment,
    plan: Plan,
    replicas: int | None = None,
    cache: CacheMount | None = None,
    tier_replicas: Mapping[str, int] | None = None,
    role_replicas: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Every child object. `replicas` overrides spec.replicas (the autoscaler's decision), `tier_replicas` a context
    tier's replicas by tier name, `role_replicas` a disaggregated fleet's prefill and decode workers (the autoscaler's
    per-role decision); `cache` is the MiniMaxM3ModelCache that spec.model.cacheRef names (needed when it is set)."""
    if resource.spec.model.cache_ref is not None and cache is None:
        cache_mount(resource, None)  # raises: which cache is missing, and the fix
    count = resource.spec.replicas if replicas is None else replicas
    if plan.disaggregation is not None:
        roles = role_replicas or {}
        return _render_disaggregated(resource, plan, roles.get("decode", count), cache, roles.get("prefill"))
    ctx = context_for(resource, plan, cache)
    tiers = tier_contexts(resource, cache)
    *config_map, workload = _workload(ctx, count)
    objects = list(config_map)
    if any(c.multi_node and c.accelerator.nvlink_spans_nodes for c in (ctx, *tiers)):
        objects.append(compute_domain(ctx))  # one IMEX domain for every multi-node workload of the resource
    objects.append(workload)
    for tier in tiers:
        objects += _workload(tier, (tier_replicas or {}).get(tier.tier, tier.spec.replicas))
    if resource.spec.network.ingress_policy:
        objects.append(network_policy(ctx, ctx.engine.port))  # before the Service exposes the pods
    objects.append(disruption_budget(ctx))
    objects.append(service(ctx, ctx.engine.port))
    objects += gateway_objects(resource, plan, ctx.engine.port)
    return objects


def _render_disaggregated(
    resource: MiniMaxM3Deployment,
    plan: Plan,
    decode_replicas: int,
    cache: CacheMount | None,
    prefill_replicas: int | None,
) -> list[dict[str, Any]]:
    """spec.disaggregation: Dynamo's frontend and workers as pods, or one DynamoGraphDeployment."""
    roles = role_plans(resource.spec)
    if plan.disaggregation is not None and plan.disaggregation.render_as == RenderAs.DYNAMO_GRAPH_DEPLOYMENT:
        return render_graph(resource, plan, roles, decode_replicas, cache, prefill_replicas)
    return render_pods(resource, plan, roles, decode_replicas, cache, prefill_replicas)


def cache_mount(resource: MiniMaxM3Deployment, cache: MiniMaxM3ModelCache | None) -> CacheMount | None:
    """What the pods need of the MiniMaxM3ModelCache that spec.model.cacheRef names; None without a cacheRef.
    Raises SpecError when the resource names a cache that is not there."""
    ref = resource.spec.model.cache_ref
    if ref is None:
        return None
    namespace = resource.metadata.namespace
    if cache is None or cache.metadata.name != ref.name or cache.metadata.namespace != namespace:
        raise SpecError(
            "spec.model.cacheRef.name",
            f"MiniMaxM3ModelCache {ref.name} does not exist in namespace {namespace}",
            f"create it (kubectl get m3cache -n {namespace} lists them) or correct the name; for m3fleet render, "
            "put the cache in the same input",
        )
    return _mount(namespace, ref, cache.spec.path)


def _mount(namespace: str, ref: ModelCacheRef, path: str) -> CacheMount:
    """The pods' view of the cache `ref` names, its copy in the node directory `path`."""
    label = node_label_key(namespace, ref.name)
    return CacheMount(ref.name, path, label, ref.node_affinity == NodeAffinityMode.REQUIRED)


# The node-local directory a cache named by spec.model.cacheRef is assumed to hold when it is not at hand (`check`).
STAND_IN_CACHE_PATH = "/var/lib/m3fleet/model-cache"


def check(resource: MiniMaxM3Deployment, plan: Plan, cache: MiniMaxM3ModelCache | None = None) -> None:
    """Raise what `render` would refuse (flags and env the plan owns, ...), also when the MiniMaxM3ModelCache that
    spec.model.cacheRef names is not at hand (`cache` None): that one may be applied after the resource, and the
    operator reports it missing in status (ModelCacheNotFound). For `m3fleet plan` and the admission webhook."""
    ref = resource.spec.model.cache_ref
    if ref is None or cache is not None:
        render(resource, plan, cache=cache_mount(resource, cache))
    else:
        render(resource, plan, cache=_mount(resource.metadata.namespace, ref, STAND_IN_CACHE_PATH))


def required_secrets(resource: MiniMaxM3Deployment, plan: Plan) -> list[str]:
    """Secrets the controller must generate (never rendered: their content is not in the spec)."""
    if plan.disaggregation is not None:
        if plan.disaggregation.render_as == RenderAs.DYNAMO_GRAPH_DEPLOYMENT:
            return []  # the Dynamo operator makes its own
        return worker_secrets(resource, role_plans(resource.spec))
    ctx = context_for(resource, plan)
    secret = launch(ctx).ssh_secret
    return [secret] if secret is not None else []


def set_owner(obj: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """The owner-reference hook: a copy of `obj` controlled by `owner` (apiVersion, kind, name, uid)."""
    child = copy.deepcopy(obj)
    child["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return child


__all__ = [
    "COMPUTE_DOMAIN_API",
    "LWS_API",
    "NETWORK_POLICY_SUFFIX",
    "POD_SECURITY_ANNOTATION",
    "PROGRESS_DEADLINE_SECONDS",
    "SERVICE_SUFFIX",
    "cache_mount",
    "check",
    "context_for",
    "labels",
    "render",
    "replacement_notice",
    "required_secrets",
    "service_name",
    "set_owner",
    "workload_kind",
]

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
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from m3fleet.api.cache import MiniMaxM3ModelCache, node_label_key
from m3fleet.api.models import Accelerator, MiniMaxM3Deployment, ModelCacheRef, NodeAffinityMode, Plan
from m3fleet.engines import Context, EngineLaunch, Role, launch
from m3fleet.engines.base import SERVING_PORT, CacheMount
from m3fleet.errors import SpecError
from m3fleet.planner import plan_tier, tier_spec
from m3fleet.render import labels
from m3fleet.render.gateway import gateway_objects
from m3fleet.render.pod import pod_security_level, pod_template

LWS_API = "leaderworkerset.x-k8s.io/v1"
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"
PROGRESS_DEADLINE_SECONDS = 2 * 60 * 60  # a rollout includes pulling a large image and loading 427B weights
SERVICE_SUFFIX = "api"
NETWORK_POLICY_SUFFIX = "ingress"
POD_SECURITY_ANNOTATION = "m3fleet.dev/pod-security-level"  # the Pod Security Standard the engine pods meet


def service_name(resource_name: str) -> str:
    """The engine's ClusterIP Service: `<name>-api` (the LeaderWorkerSet controller owns `<name>`)."""
    return f"{resource_name}-{SERVICE_SUFFIX}"


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


def _meta(ctx: Context, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": ctx.namespace, "labels": labels.object_labels(ctx), **extra}


def _config_map(ctx: Context, engine: EngineLaunch) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(ctx, ctx.config_map_name),
        "data": dict(sorted(engine.config_files.items())),
    }


def _config_digest(engine: EngineLaunch) -> str | None:
    """What identifies the engine-config ConfigMap's data (None: the engine needs none)."""
    if not engine.config_files:
        return None
    data = json.dumps(engine.config_files, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def _compute_domain(ctx: Context) -> dict[str, Any]:
    # One IMEX domain per resource; every group's pods claim its channel (DRA). numNodes 0: the driver
    # follows the pods (recommended with IMEXDaemonsWithDNSNames).
    return {
        "apiVersion": COMPUTE_DOMAIN_API,
        "kind": "ComputeDomain",
        "metadata": _meta(ctx, ctx.resource_name("compute-domain")),
        "spec": {
            "numNodes": 0,
            "channel": {"resourceClaimTemplate": {"name": ctx.resource_name("compute-domain-channel")}},
        },
    }


def _security_annotation(ctx: Context, engine: EngineLaunch) -> dict[str, str]:
    """Which `pod-security.kubernetes.io/enforce` level the namespace may have for these pods to be admitted."""
    return {POD_SECURITY_ANNOTATION: pod_security_level(ctx, list(engine.containers.values())).value}


def _workload_meta(ctx: Context, engine: EngineLaunch) -> dict[str, Any]:
    """The Deployment's or LeaderWorkerSet's metadata: spec.podTemplate's labels and annotations go here too, where
    the integrations read them on the workload object itself. Kueue (kueue.sigs.k8s.io, "Run LeaderWorkerSet")
    admits a LeaderWorkerSet group as one Workload from `kueue.x-k8s.io/queue-name` in the LeaderWorkerSet's
    metadata.labels; "Run Deployment" reads it from the pod template (the pod integration), where pod_template
    puts it on every engine pod as well."""
    passthrough = ctx.spec.pod_template.metadata
    meta = _meta(ctx, ctx.workload_name, annotations={**passthrough.annotations, **_security_annotation(ctx, engine)})
    meta["labels"] = {**passthrough.labels, **meta["labels"]}
    return meta


def _rolling(ctx: Context) -> dict[str, int]:
    # maxSurge 0 by default: replace a replica in place rather than needing a spare GPU node.
    return {"maxSurge": ctx.spec.rollout.max_surge, "maxUnavailable": ctx.spec.rollout.max_unavailable}


def _deployment(ctx: Context, engine: EngineLaunch, replicas: int) -> dict[str, Any]:
    container = engine.containers[Role.SINGLE]
    template = pod_template(ctx, Role.SINGLE, container, _config_digest(engine), None)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _workload_meta(ctx, engine),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {**labels.workload_selector(ctx), labels.ROLE: Role.SINGLE.value}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": _rolling(ctx)},
            "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
            "template": template,
        },
    }


def _leader_worker_set(ctx: Context, engine: EngineLaunch, replicas: int) -> dict[str, Any]:
    ssh = engine.ssh_secret
    config = _config_digest(engine)
    leader = pod_template(ctx, Role.LEADER, engine.containers[Role.LEADER], config, ssh)
    worker = pod_template(ctx, Role.WORKER, engine.containers[Role.WORKER], config, ssh)
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": _workload_meta(ctx, engine),
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": _rolling(ctx)},
            "leaderWorkerTemplate": {
                "size": ctx.plan.nodes_per_replica,
                # One rank dying breaks the collective: restart the whole group.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def _service(ctx: Context) -> dict[str, Any]:
    port = ctx.engine.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(ctx, service_name(ctx.name)),
        "spec": {
            "type": "ClusterIP",
            "selector": labels.serving_selector(ctx.name),
            "ports": [{"name": SERVING_PORT, "port": port, "targetPort": SERVING_PORT, "protocol": "TCP"}],
        },
    }


def _disruption_budget(ctx: Context) -> dict[str, Any]:
    """Evictions (a node drain, a cluster upgrade) take at most one engine pod at a time, so at most one replica is
    down while it reloads hundreds of GB of weights: in a LeaderWorkerSet the evicted pod's group restarts, and its
    pods then count as unavailable until it is back. One replica's pod can still go (a drain never waits on a fleet
    of one), and an unready pod can always go (a pod that never loads holds no drain)."""
    selector = {labels.NAME: ctx.name, "app.kubernetes.io/component": "engine"}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(ctx, ctx.name),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _network_policy(ctx: Context) -> dict[str, Any]:
    """Ingress to the resource's pods: its own pods on every port (a multi-node group's rendezvous, NCCL, MPI and
    SSH traffic), this namespace's pods and spec.network.allowFrom on the API port, spec.network.metricsFrom
    (Prometheus) on the metrics port, which is the API port for every engine. Egress is not restricted (weights and
    the chat template may come from the Hugging Face hub)."""
    network = ctx.spec.network

    def port() -> list[dict[str, Any]]:  # a fresh list per rule: YAML output must not share anchors
        return [{"protocol": "TCP", "port": ctx.engine.port}]

    def own() -> dict[str, Any]:
        return {"podSelector": {"matchLabels": {labels.NAME: ctx.name}}}

    ingress: list[dict[str, Any]] = [
        {"from": [own()]},
        {"from": [{"podSelector": {}}, *copy.deepcopy(network.allow_from)], "ports": port()},
    ]
    if network.metrics_from:
        ingress.append({"from": copy.deepcopy(network.metrics_from), "ports": port()})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(ctx, ctx.resource_name(NETWORK_POLICY_SUFFIX)),
        "spec": {"podSelector": own()["podSelector"], "policyTypes": ["Ingress"], "ingress": ingress},
    }


def workload_kind(plan: Plan) -> str:
    """The child that runs the replicas: a Deployment when a replica fits one node, else a LeaderWorkerSet
    (one leader/worker group per replica)."""
    return "LeaderWorkerSet" if plan.nodes_per_replica > 1 else "Deployment"


def replacement_notice(running: str, plan: Plan) -> str | None:
    """What a spec change does to a fleet whose replicas run in a `running` (the workload kind) when the new
    plan puts them in the other kind (the webhook warns with it, the operator's Event repeats it); None when
    the kind stays. The two kinds are separate objects with separate rollouts, so rollout.maxSurge and
    maxUnavailable cannot bridge them."""
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
    objects = [_config_map(ctx, engine)] if engine.config_files else []
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
) -> list[dict[str, Any]]:
    """Every child object. `replicas` overrides spec.replicas (the autoscaler's decision), `tier_replicas` a context
    tier's replicas by tier name; `cache` is the MiniMaxM3ModelCache that spec.model.cacheRef names (needed when it
    is set)."""
    if resource.spec.model.cache_ref is not None and cache is None:
        cache_mount(resource, None)  # raises: which cache is missing, and the fix
    ctx = context_for(resource, plan, cache)
    count = resource.spec.replicas if replicas is None else replicas
    tiers = tier_contexts(resource, cache)
    *config_map, workload = _workload(ctx, count)
    objects = list(config_map)
    if any(c.multi_node and c.plan.accelerator == Accelerator.GB200 for c in (ctx, *tiers)):
        objects.append(_compute_domain(ctx))  # one IMEX domain for every multi-node workload of the resource
    objects.append(workload)
    for tier in tiers:
        objects += _workload(tier, (tier_replicas or {}).get(tier.tier, tier.spec.replicas))
    if resource.spec.network.ingress_policy:
        objects.append(_network_policy(ctx))  # before the Service exposes the pods
    objects.append(_disruption_budget(ctx))
    objects.append(_service(ctx))
    objects += gateway_objects(resource, plan, ctx.engine.port)
    return objects


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

"""What one reconcile of a MiniMaxM3Deployment does, decided from what it observed. Pure: no I/O, no clock.

A reconcile (controller/reconcile.py) reads as three steps, like the model cache's (controller/cache.py with
cache/plan.py):

1. observe: the resource as the watch delivered it, parsed and planned once per version (`understand`), the
   model cache it names, what the spec asks for (`want`: the children rendered, the Secrets to generate),
   which child kinds the cluster serves, the live children (listed, and looked up by name when a listing
   misses one), and the generated Secrets;
2. decide (`decide`): a `Work` record — stop and say why (`Blocked`: an invalid spec, a missing API, a name
   held by an object the resource does not control, Secrets not granted), or the children to apply, the
   children and Secrets to prune, the Secrets to generate, what to say when a workload of the other kind is
   pruned, and every field of the status but the workload's own report;
3. act: apply, prune, generate, emit the Events; then report: the status describes the workload as the apply
   left it (a spec change bumps its generation, so it reports a rollout, not the replicas that were ready),
   and `conditions` in controller/status.py turns that report into conditions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from m3fleet.api import parse_resource
from m3fleet.api.conditions import READY, DeploymentReason
from m3fleet.api.models import MiniMaxM3Deployment, Plan
from m3fleet.api.parse import parse_cache
from m3fleet.autoscaling.groups import tier_replicas_to_apply
from m3fleet.autoscaling.policy import replicas_to_apply
from m3fleet.autoscaling.policy.roles import role_replicas_to_apply
from m3fleet.catalog.gateway import ROUTE_API
from m3fleet.controller.status import (
    Blocked,
    GatewayReport,
    PodFailure,
    TierReport,
    Workload,
    cache_not_ready,
    model_cache_record,
)
from m3fleet.engines.base import CacheMount
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.permissions import SECRETS_REFUSED, SECRETS_RETRY_SECONDS, secrets_refused
from m3fleet.planner import plan as make_plan
from m3fleet.render import cache_mount, labels, render, replacement_notice, required_secrets, set_owner, tier_contexts
from m3fleet.render.gateway import EPP_COMPONENT, ROUTE_COMPONENT
from m3fleet.render.ownership import NameConflict, conflict, conflict_message, controlled_by

Key = tuple[str, str, str]  # apiVersion, kind, name
WORKLOAD_KINDS = frozenset({"Deployment", "LeaderWorkerSet", "DynamoGraphDeployment"})
SERVED_TTL_SECONDS = 30.0  # discovery is asked again this often: an API installed later is noticed within it
CONFLICT_RETRY_SECONDS = 10.0  # a name held by a foreign object is looked at again this often (it sends no event)
MODEL_CACHE_FIELD = "spec.model.cacheRef.name"

MISSING_API = {
    "LeaderWorkerSet": (
        DeploymentReason.LEADER_WORKER_SET_NOT_INSTALLED,
        "a replica spans {nodes} nodes and needs the LeaderWorkerSet API (leaderworkerset.x-k8s.io/v1), which this "
        "cluster does not serve: install LeaderWorkerSet v0.9 or newer, or plan a replica that fits one node",
    ),
    "DynamoGraphDeployment": (
        DeploymentReason.DYNAMO_NOT_INSTALLED,
        "spec.disaggregation.renderAs DynamoGraphDeployment needs the Dynamo operator's DynamoGraphDeployment API "
        "(nvidia.com/v1beta1), which this cluster does not serve: install NVIDIA Dynamo's platform chart, or set "
        "renderAs pods to let m3fleet run the frontend and workers itself",
    ),
    "ComputeDomain": (
        DeploymentReason.COMPUTE_DOMAIN_NOT_INSTALLED,
        "multi-node GB200 replicas need the NVIDIA DRA driver's ComputeDomain API (resource.nvidia.com/v1beta1), "
        "which this cluster does not serve: install the NVIDIA DRA driver for GPUs with ComputeDomain support",
    ),
}


# The serving path's custom APIs (spec.gateway): without them the rest of the fleet is applied all the same.
SERVING_PATH_APIS = {
    "InferencePool": "inferencepools.inference.networking.k8s.io/v1",
    "HTTPRoute": "httproutes.gateway.networking.k8s.io/v1",
}
SERVING_PATH_COMPONENTS = frozenset({EPP_COMPONENT, ROUTE_COMPONENT})
GATEWAY_RETRY_SECONDS = 30.0  # a Gateway created later sends us no event: look again this often


def key_of(obj: Mapping[str, Any]) -> Key:
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def serving_path_served(
    objects: list[dict[str, Any]], served: frozenset[str]
) -> tuple[list[dict[str, Any]], str | None]:
    """The children the cluster can take, and the serving-path API it lacks (None: all served). Without the
    InferencePool API nothing of the serving path is applied (a picker with no pool to serve would crash-loop);
    without HTTPRoute everything but the route. Never a reason to hold back the engines."""
    if "InferencePool" not in served:
        kept = [
            o
            for o in objects
            if o["metadata"]["labels"].get("app.kubernetes.io/component") not in SERVING_PATH_COMPONENTS
        ]
        return kept, SERVING_PATH_APIS["InferencePool"] if len(kept) < len(objects) else None
    if "HTTPRoute" not in served and any(o["kind"] == "HTTPRoute" for o in objects):
        return [o for o in objects if o["kind"] != "HTTPRoute"], SERVING_PATH_APIS["HTTPRoute"]
    return objects, None


@dataclass(frozen=True)
class Understood:
    """One version of a resource, parsed and planned once: the reconcile, the autoscaler's tick, the time-to-ready
    measurement and the scheduler all read this, never the resource again. `error`: why it cannot be planned."""

    uid: str
    generation: int
    resource: MiniMaxM3Deployment | None = None
    plan: Plan | None = None
    error: SpecError | SpecErrors | None = None

    def of(self, body: Mapping[str, Any]) -> bool:
        """Whether this is the understanding of `body`'s spec (a status write changes neither uid nor generation)."""
        meta = body["metadata"]
        return (str(meta.get("uid") or ""), int(meta.get("generation") or 0)) == (self.uid, self.generation)


def understand(body: Mapping[str, Any]) -> Understood:
    meta = body["metadata"]
    uid, generation = str(meta.get("uid") or ""), int(meta.get("generation") or 0)
    try:
        resource = parse_resource(dict(body))
        return Understood(uid, generation, resource, make_plan(resource.spec))
    except (SpecError, SpecErrors) as exc:
        return Understood(uid, generation, error=exc)


@dataclass(frozen=True)
class Wanted:
    """What the spec asks for: the children, rendered (not yet owned), and the Secrets to generate; or why it
    cannot be rendered (`blocked`: an invalid spec, or a model cache that is not there)."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    mount: CacheMount | None = None
    blocked: Blocked | None = None


def _invalid(exc: SpecError | SpecErrors) -> Blocked:
    no_cache = isinstance(exc, SpecError) and exc.field == MODEL_CACHE_FIELD
    return Blocked(DeploymentReason.MODEL_CACHE_NOT_FOUND if no_cache else DeploymentReason.INVALID_SPEC, str(exc))


def want(understood: Understood, cache: Mapping[str, Any] | None, status: Mapping[str, Any]) -> Wanted:
    """The children of `understood` with the model cache `cache` (as stored; None: none named, or not there), at the
    replica counts the autoscaler's last decisions in `status` set (the spec's own tier's and each context tier's),
    or spec.replicas and each tier's replicas."""
    resource, plan = understood.resource, understood.plan
    if resource is None or plan is None:
        return Wanted(blocked=_invalid(understood.error or SpecError("spec", "cannot be planned", "fix the spec")))
    try:
        mount = cache_mount(resource, parse_cache(dict(cache)) if cache is not None else None)
        replicas = replicas_to_apply(resource.spec, status)
        objects = render(
            resource,
            plan,
            replicas,
            mount,
            tier_replicas=tier_replicas_to_apply(resource.spec, status),
            role_replicas=role_replicas_to_apply(resource.spec, status),
        )
    except (SpecError, SpecErrors) as exc:
        return Wanted(blocked=_invalid(exc))
    return Wanted(objects, required_secrets(resource, plan), mount)


@dataclass(frozen=True)
class Observed:
    """What observe read for one reconcile (every read, before anything is decided)."""

    body: Mapping[str, Any]
    understood: Understood
    cache: Mapping[str, Any] | None  # the model cache spec.model.cacheRef names, as stored
    wanted: Wanted
    served: frozenset[str]  # the child kinds the cluster serves
    live: dict[Key, dict[str, Any]]  # children listed by the owned-label selector, and ours found by name
    named: dict[Key, dict[str, Any]] = field(default_factory=dict)  # wanted names a listing missed, held by others
    secrets: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # the wanted Secrets, by name
    secrets_forbidden: bool = False  # the API server refused them: the operator is granted none here
    gateway_found: bool = True  # the Gateway spec.gateway.gatewayRef names exists (or cannot be looked at)


@dataclass(frozen=True)
class Prune:
    """A child of ours no longer wanted: deleted exactly as seen (uid precondition)."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class StatusDraft:
    """Everything of the status but the workload's own report (see `controller.status.status_update`)."""

    plan: dict[str, Any] | None = None
    selector: str = ""
    secrets: list[str] | None = None
    model_cache: dict[str, Any] | None = None
    autoscaling: bool | None = None
    cache_hint: str | None = None  # when pods wait, a model cache they require that is not ready
    gateway: GatewayReport | None = None  # spec.gateway's path as decided; completed from the live children


@dataclass(frozen=True)
class Work:
    """What one reconcile does. Blocked: report why (with the workload as it runs) and touch no child."""

    status: StatusDraft
    blocked: Blocked | None = None
    blocked_report: Workload | None = None
    retry_after: float | None = None
    apply: list[dict[str, Any]] = field(default_factory=list)  # owned, in order; each unless the server holds it
    prune: list[Prune] = field(default_factory=list)
    generate: list[str] = field(default_factory=list)  # Secrets to create (their content is made when acting)
    prune_secrets: list[str] = field(default_factory=list)  # generated Secrets no longer needed (if ours)
    replaced: dict[str, str] = field(default_factory=dict)  # workload kind -> what pruning it costs, said then
    workload: dict[str, Any] | None = None  # the workload child applied: its report is the status's basis
    owner: dict[str, Any] = field(default_factory=dict)  # the owner reference's source, for generated Secrets
    resource: MiniMaxM3Deployment | None = None  # the spec the work was decided from


def missing_api(objects: list[dict[str, Any]], served: set[str] | frozenset[str], nodes: int) -> Blocked | None:
    """Why the children cannot be applied when the cluster does not serve one of their kinds (LeaderWorkerSet,
    ComputeDomain), else None."""
    for obj in objects:
        missing = MISSING_API.get(obj["kind"])
        if missing and obj["kind"] not in served:
            reason, message = missing
            return Blocked(reason, message.format(nodes=nodes))
    return None


def conflicts(seen: Observed) -> list[NameConflict]:
    """Every child name (rendered objects and generated Secrets) held by an object this resource does not control."""
    meta = seen.body["metadata"]
    found = []
    for obj in seen.wanted.objects:
        key = key_of(obj)
        problem = conflict(obj["kind"], seen.live.get(key) or seen.named.get(key), meta["uid"], meta["name"])
        if problem is not None:
            found.append(problem)
    for secret in seen.secrets.values():
        problem = conflict("Secret", secret, meta["uid"], meta["name"])
        if problem is not None:
            found.append(problem)  # never mounted: the pods would trust a key someone else holds
    return found


def running_workload(live: Mapping[Key, Mapping[str, Any]], uid: str, name: str) -> Workload:
    """What our own workload `name` reports (a foreign one with our labels is not this fleet; a context tier's or the
    endpoint picker's is another workload): for a blocked status."""
    ours = next(
        (
            o
            for o in live.values()
            if o["kind"] in WORKLOAD_KINDS and o["metadata"]["name"] == name and controlled_by(o, uid)
        ),
        None,
    )
    desired = int(((ours or {}).get("spec") or {}).get("replicas") or 0)
    return Workload.from_live(desired, None if ours is None else dict(ours))


def decide(seen: Observed) -> Work:
    """The work of one reconcile, from what it observed."""
    body, wanted, resource, plan = seen.body, seen.wanted, seen.understood.resource, seen.understood.plan
    meta = body["metadata"]
    name, uid = meta["name"], meta["uid"]
    planned = StatusDraft(
        plan=plan.model_dump(by_alias=True, mode="json", exclude_none=True) if plan is not None else None,
        selector=labels.serving_selector_string(name),
    )

    def blocked(why: Blocked, retry_after: float | None = None, draft: StatusDraft = planned) -> Work:
        return Work(draft, why, running_workload(seen.live, uid, name), retry_after)

    if wanted.blocked is not None or resource is None or plan is None:  # the last two: only with wanted.blocked
        why = wanted.blocked or Blocked(DeploymentReason.INVALID_SPEC, "the resource cannot be planned")
        return blocked(why, draft=StatusDraft(selector=planned.selector))
    objects, path_missing = serving_path_served(wanted.objects, seen.served)
    unserved = missing_api(objects, seen.served, plan.nodes_per_replica)
    if unserved is not None:  # installing the API sends us no event: look again once discovery is asked again
        return blocked(unserved, SERVED_TTL_SECONDS)
    if seen.secrets_forbidden:  # not granted in this namespace (the chart's default): say how, look again later
        message = secrets_refused(meta["namespace"], "the TensorRT-LLM multi-node SSH key")
        return blocked(Blocked(SECRETS_REFUSED, message), SECRETS_RETRY_SECONDS)
    held = conflicts(seen)
    if held:  # a name we would take is held by an object we do not control: touch nothing
        return blocked(Blocked(DeploymentReason.NAME_CONFLICT, conflict_message(held)), CONFLICT_RETRY_SECONDS)

    owner = {"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": {"name": name, "uid": uid}}
    wanted_keys = {key_of(obj) for obj in objects}
    prune = [
        Prune(key[0], key[1], key[2], obj["metadata"]["uid"])
        for key, obj in sorted(seen.live.items())
        if key not in wanted_keys and controlled_by(obj, uid)
    ]
    replaced = {}
    for gone in prune:
        if gone.kind in WORKLOAD_KINDS and gone.kind not in replaced:
            # A workload named other than the resource is a disaggregated fleet's (<name>-prefill, -decode, ...).
            was_disaggregated = gone.name != name or gone.kind == "DynamoGraphDeployment"
            notice = replacement_notice(gone.kind, plan, was_disaggregated)
            if notice is not None:
                replaced[gone.kind] = notice
    status = body.get("status") or {}
    ref = resource.spec.model.cache_ref
    required = ref is not None and ref.node_affinity == "Required"
    return Work(
        status=StatusDraft(
            plan=planned.plan,
            selector=planned.selector,
            secrets=sorted(wanted.secrets),
            model_cache=model_cache_record(ref, wanted.mount),
            autoscaling=resource.spec.autoscaling.enabled,
            cache_hint=cache_not_ready(seen.cache) if required else None,
            gateway=planned_gateway(resource, path_missing, seen.gateway_found),
        ),
        apply=[set_owner(obj, owner) for obj in objects],
        prune=prune,
        generate=[s for s in wanted.secrets if seen.secrets.get(s) is None],
        prune_secrets=[s for s in status.get("generatedSecrets") or [] if s not in wanted.secrets],
        replaced=replaced,
        workload=next(o for o in objects if o["kind"] in WORKLOAD_KINDS),
        owner=owner,
        resource=resource,
    )


def planned_gateway(resource: MiniMaxM3Deployment, missing: str | None, found: bool) -> GatewayReport | None:
    """What is known of spec.gateway's path before the children report (None: no spec.gateway)."""
    gateway = resource.spec.gateway
    if gateway is None:
        return None
    ref = gateway.gateway_ref
    where = f"{ref.namespace or resource.metadata.namespace}/{ref.name}"
    return GatewayReport(where, resource.metadata.name, missing_api=missing, gateway_found=found)


def gateway_report(
    draft: GatewayReport, resource: MiniMaxM3Deployment, live: Mapping[Key, Mapping[str, Any]], main_ready: int
) -> GatewayReport:
    """`draft` completed from the children as the apply left them: the route's Accepted condition from this Gateway,
    the ready endpoints (a ready replica serves from one pod) and each context tier's replicas."""
    ref = resource.spec.gateway.gateway_ref if resource.spec.gateway is not None else None
    route = live.get((ROUTE_API, "HTTPRoute", resource.metadata.name)) or {}
    accepted = None
    for parent in (route.get("status") or {}).get("parents") or []:
        parent_ref = parent.get("parentRef") or {}
        namespace = parent_ref.get("namespace") or resource.metadata.namespace
        if ref is not None and parent_ref.get("name") == ref.name and namespace == draft.gateway.split("/")[0]:
            accepted = next((c for c in parent.get("conditions") or [] if c.get("type") == "Accepted"), None)
    tiers = []
    for ctx in tier_contexts(resource):
        found = next((o for (_, kind, n), o in live.items() if kind in WORKLOAD_KINDS and n == ctx.workload_name), {})
        ready = int((found.get("status") or {}).get("readyReplicas") or 0)
        desired = int((found.get("spec") or {}).get("replicas") or 0)
        tiers.append(TierReport(ctx.tier, ctx.workload_name, desired, ready))
    endpoints = main_ready + sum(t.ready for t in tiers)
    return replace(draft, accepted=accepted, endpoints=endpoints, tiers=tuple(tiers))


def failure_to_tell(body: Mapping[str, Any], report: Workload) -> PodFailure | None:
    """Why engine pods fail, when that is news: they start failing, or fail for another reason (an Event then, not
    again on every reconcile)."""
    failure = report.failure
    if failure is None:
        return None
    conditions: list[dict[str, Any]] = (body.get("status") or {}).get("conditions") or []
    before: dict[str, Any] = next((c for c in conditions if c.get("type") == READY), {})
    return failure if before.get("reason") != failure.reason else None

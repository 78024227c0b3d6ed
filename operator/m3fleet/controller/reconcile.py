"""One level-triggered reconcile: validate -> plan -> render -> apply -> prune -> status.

It computes from the world as it is (the resource as the watch delivered it, the children as the API
lists them), so calling it twice is harmless. Quiet at rest: a child is applied only when the API server
holds something other than our intent, status is written only when it changes, and nothing is written
for an unchanged resource. Bad input never tears anything down: an invalid spec or a missing API only
sets `Degraded` and leaves every child exactly as it was.

Drift: whether a child holds our intent is asked of the API server, not of memory or of
metadata.generation (ConfigMaps and Services have none). A server-side-apply dry run of the intent
answers with what the child would become; when that equals the live child on every field that matters,
nothing is applied. Such a verdict is remembered only for the exact live content it was made on, so any
edit, by anyone, is looked at again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from m3fleet import kubeapi, permissions
from m3fleet.api import parse_resource
from m3fleet.api.conditions import READY, DeploymentReason
from m3fleet.api.models import MiniMaxM3Deployment, Plan
from m3fleet.api.parse import parse_cache
from m3fleet.autoscaling.policy import replicas_to_apply
from m3fleet.controller import metrics
from m3fleet.controller.events import Events, KopfEvents
from m3fleet.controller.secrets import ssh_key_secret
from m3fleet.controller.status import (
    Blocked,
    Workload,
    cache_not_ready,
    create_failure,
    model_cache_record,
    pods_per_replica,
    status_update,
)
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.kubeapi import ApiError, Kind, KubeApi
from m3fleet.planner import plan as make_plan
from m3fleet.render import cache_mount, labels, render, replacement_notice, required_secrets, set_owner
from m3fleet.render.ownership import NameConflict, conflict, conflict_message, controlled_by

Key = tuple[str, str, str]  # apiVersion, kind, name
REJECTED = (400, 403, 404, 422)  # the API server refuses our intent (not a transient failure)
SERVED_TTL_SECONDS = 30.0
WORKLOAD_KINDS = frozenset({kubeapi.DEPLOYMENT.kind, kubeapi.LEADER_WORKER_SET.kind})
CONFLICT_RETRY_SECONDS = 10.0  # a name held by a foreign object is looked at again this often (it sends no event)
PODS_MISSING_RETRY_SECONDS = 30.0  # while a rollout lacks pods: a refusal to create them is only an Event
FAILED_CREATE_EVENTS = f"reason={DeploymentReason.FAILED_CREATE}"

log = logging.getLogger(__name__)


class SecretsForbidden(Exception):
    """The API server refused a Secret of the plan: the operator is granted none in this namespace."""


def digest(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


def what_matters(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a child that drift is judged on: labels, annotations, owner references and every
    top-level field but metadata and status (spec, data, ...). Server bookkeeping (resourceVersion,
    generation, managedFields) and the child controller's status do not count."""
    meta = obj.get("metadata") or {}
    return {
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
        "ownerReferences": meta.get("ownerReferences") or [],
        **{k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")},
    }


def owned(obj: dict[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    return set_owner(obj, dict(owner))


def key_of(obj: Mapping[str, Any]) -> Key:
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Outcome:
    """What one reconcile did (for logs, tests and the benchmark)."""

    applied: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    created_secrets: list[str] = field(default_factory=list)
    status: dict[str, Any] | None = None  # the resource as the status write returned it (None: not written)
    gone: bool = False  # the resource no longer exists
    blocked: str | None = None
    retry_after: float | None = None  # reconcile again after this many seconds (nothing would announce the fix)


MISSING_API = {
    kubeapi.LEADER_WORKER_SET.kind: (
        DeploymentReason.LEADER_WORKER_SET_NOT_INSTALLED,
        "a replica spans {nodes} nodes and needs the LeaderWorkerSet API (leaderworkerset.x-k8s.io/v1), which this "
        "cluster does not serve: install LeaderWorkerSet v0.9 or newer, or plan a replica that fits one node",
    ),
    kubeapi.COMPUTE_DOMAIN.kind: (
        DeploymentReason.COMPUTE_DOMAIN_NOT_INSTALLED,
        "multi-node GB200 replicas need the NVIDIA DRA driver's ComputeDomain API (resource.nvidia.com/v1beta1), "
        "which this cluster does not serve: install the NVIDIA DRA driver for GPUs with ComputeDomain support",
    ),
}


def missing_api(objects: list[dict[str, Any]], served: set[str], nodes: int) -> Blocked | None:
    """Why the children cannot be applied when the cluster does not serve one of their kinds (LeaderWorkerSet,
    ComputeDomain), else None."""
    for obj in objects:
        missing = MISSING_API.get(obj["kind"])
        if missing and obj["kind"] not in served:
            reason, message = missing
            return Blocked(reason, message.format(nodes=nodes))
    return None


class Reconciler:
    def __init__(self, api: KubeApi, events: Events | None = None, clock: Callable[[], str] = utc_now) -> None:
        self.api = api
        self.clock = clock
        self.events: Events = events or KopfEvents()
        # Per resource, per child: (digest of our intent, digest of the live child) found to agree.
        self._agreed: dict[tuple[str, str], dict[Key, tuple[str, str]]] = {}
        self._served: tuple[float, set[str]] | None = None  # (when asked, child kinds served)

    def forget(self, namespace: str, name: str) -> None:
        self._agreed.pop((namespace, name), None)

    async def reconcile(self, body: Mapping[str, Any]) -> Outcome:
        """Raises ApiError when the API failed us (after reporting a rejection in status): retry later."""
        started = time.monotonic()
        try:
            outcome = await self._reconcile(body)
        except Exception:
            metrics.RECONCILES.labels("error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        metrics.RECONCILES.labels("blocked" if outcome.blocked else "ok").inc()
        for action, names in (("apply", outcome.applied), ("prune", outcome.pruned)):
            for item in names:
                metrics.CHILD_WRITES.labels(item.split("/", 1)[0], action).inc()
        return outcome

    async def _reconcile(self, body: Mapping[str, Any]) -> Outcome:
        meta = body["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
        status = body.get("status") or {}
        outcome = Outcome()
        if meta.get("deletionTimestamp"):
            return outcome  # children go by garbage collection through their owner references
        try:
            resource = parse_resource(dict(body))
            plan = make_plan(resource.spec)
            cache_body = await self._model_cache(resource)
            mount = cache_mount(resource, parse_cache(cache_body) if cache_body is not None else None)
            objects = render(resource, plan, replicas_to_apply(resource.spec, status), mount)
        except (SpecError, SpecErrors) as exc:
            no_cache = isinstance(exc, SpecError) and exc.field == "spec.model.cacheRef.name"
            why = DeploymentReason.MODEL_CACHE_NOT_FOUND if no_cache else DeploymentReason.INVALID_SPEC
            return await self._blocked(body, outcome, Blocked(why, str(exc)), None)
        served = await self._served_kinds()
        unserved = missing_api(objects, served, plan.nodes_per_replica)
        if unserved is not None:  # installing the API sends us no event: look again once discovery is asked again
            outcome.retry_after = SERVED_TTL_SECONDS
            return await self._blocked(body, outcome, unserved, plan)

        owner = {"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": {"name": name, "uid": uid}}
        live = await self._live_children(namespace, name, served)
        agreed = self._agreed.setdefault((namespace, name), {})
        # A child we applied is gone: perhaps with its owner (garbage collection), deleted while the watch was down.
        # Re-creating the children of a deleted owner would fight the garbage collector: never bring them back.
        gone = any(key in agreed and key not in live for key in map(key_of, objects))
        if gone and not await kubeapi.still_exists(self.api, body):
            outcome.gone = True
            return outcome
        present: set[str] = set()  # generated Secrets that exist (and are ours)
        try:
            conflicts = await self._foreign(
                objects, required_secrets(resource, plan), live, present, (namespace, name, uid)
            )
        except SecretsForbidden:  # not granted in this namespace (the chart's default): say how, look again later
            outcome.retry_after = permissions.SECRETS_RETRY_SECONDS
            message = permissions.secrets_refused(namespace, "the TensorRT-LLM multi-node SSH key")
            return await self._blocked(body, outcome, Blocked(permissions.SECRETS_REFUSED, message), plan)
        if conflicts:  # a name we would take is held by an object we do not control: touch nothing
            outcome.retry_after = CONFLICT_RETRY_SECONDS
            return await self._blocked(
                body, outcome, Blocked(DeploymentReason.NAME_CONFLICT, conflict_message(conflicts)), plan
            )
        try:
            secrets = await self._generated_secrets(resource, plan, owner, outcome, present)
            await self._apply_and_prune([owned(obj, owner) for obj in objects], live, agreed, outcome, (namespace, uid))
            # Only once the workload that no longer mounts them is applied: if the API server refuses it, the old
            # workload keeps running and still needs its Secret.
            await self._prune_secrets(namespace, uid, secrets, status, outcome)
        except ApiError as exc:
            if exc.status in REJECTED:  # the cluster refuses our intent: say so, then retry like any failure
                blocked = Blocked(DeploymentReason.APPLY_FAILED, f"the API server rejected a child: {exc}")
                await self._blocked(body, outcome, blocked, plan)
            raise
        finally:  # what was done is said, also when a later step failed
            for reason, done in (("Applied", outcome.applied), ("Pruned", outcome.pruned)):
                if done:
                    self.events.info(body, reason, ", ".join(done))
                    log.info("%s/%s: %s %s", namespace, name, reason.lower(), ", ".join(done))
            self._say_replaced(body, outcome, plan)
        required = (
            resource.spec.model.cache_ref is not None and resource.spec.model.cache_ref.node_affinity == "Required"
        )
        report = await self._workload_report(
            objects, live, namespace, name, cache_not_ready(cache_body) if required else None
        )
        if report.pods_missing:  # a refusal to create pods announces itself by no event we watch: look again
            outcome.retry_after = PODS_MISSING_RETRY_SECONDS
        cache_record = model_cache_record(resource.spec.model.cache_ref, mount)
        await self._write_status(
            body, outcome, report, None, plan, secrets, cache_record, resource.spec.autoscaling.enabled
        )
        self._say_failure(body, outcome, report)
        return outcome

    async def _apply_and_prune(
        self,
        desired: list[dict[str, Any]],
        live: dict[Key, dict[str, Any]],
        agreed: dict[Key, tuple[str, str]],
        outcome: Outcome,
        where: tuple[str, str],
    ) -> None:
        """Apply each desired child the API server does not already hold, then delete our children no longer
        desired (only those we control). `where`: the namespace and this resource's uid."""
        namespace, uid = where
        for child in desired:
            key = key_of(child)
            applied = await self._converge(child, live.get(key), agreed)
            if applied is not None:
                live[key] = applied
                outcome.applied.append(f"{child['kind']}/{child['metadata']['name']}")
        wanted = {key_of(child) for child in desired}
        for key, obj in sorted(live.items()):
            if key not in wanted and controlled_by(obj, uid):
                await self.api.delete(kubeapi.BY_KIND[(key[0], key[1])], namespace, key[2], obj["metadata"]["uid"])
                agreed.pop(key, None)
                outcome.pruned.append(f"{key[1]}/{key[2]}")

    def _say_replaced(self, body: Mapping[str, Any], outcome: Outcome, plan: Plan) -> None:
        """A pruned workload of the other kind means the replicas moved between a Deployment and a
        LeaderWorkerSet: say what that costs (the webhook warned at apply time; not everyone runs it)."""
        for kind in sorted({item.split("/", 1)[0] for item in outcome.pruned} & WORKLOAD_KINDS):
            notice = replacement_notice(kind, plan)
            if notice is not None:
                self.events.warn(body, "WorkloadReplaced", notice)

    async def _workload_report(
        self,
        objects: list[dict[str, Any]],
        live: dict[Key, dict[str, Any]],
        namespace: str,
        name: str,
        cache_hint: str | None = None,
    ) -> Workload:
        """What the workload child reports; during a rollout also why pods wait (at rest this reads nothing), with
        `cache_hint` when pods wait and a model cache they require is not ready."""
        workload = next(o for o in objects if o["kind"] in WORKLOAD_KINDS)
        report = Workload.from_live(
            workload["spec"]["replicas"], live.get(key_of(workload)), pods_per_replica(workload)
        )
        if not report.all_ready:
            pods = await self.api.list(kubeapi.POD, namespace, labels.owned_selector(name))
            refused = None
            if report.missing_pods(pods):  # pods the workload controller has not created: perhaps it may not
                events = await self.api.list(kubeapi.EVENT, namespace, field_selector=FAILED_CREATE_EVENTS)
                refused = create_failure(events, workload["metadata"]["name"], self.clock())
            report = report.with_pods(pods, cache_hint, refused)
        metrics.DESIRED_REPLICAS.labels(namespace, name).set(report.desired)
        metrics.READY_REPLICAS.labels(namespace, name).set(report.ready)
        return report

    def _say_failure(self, body: Mapping[str, Any], outcome: Outcome, report: Workload) -> None:
        """An Event when engine pods start failing, or fail for another reason (not again on every reconcile)."""
        failure = report.failure
        if failure is None or outcome.status is None:
            return
        conditions: list[dict[str, Any]] = (body.get("status") or {}).get("conditions") or []
        before: dict[str, Any] = next((c for c in conditions if c.get("type") == READY), {})
        if before.get("reason") != failure.reason:
            self.events.warn(body, failure.reason, failure.message)
            meta = body["metadata"]
            log.warning("%s/%s: %s: %s", meta["namespace"], meta["name"], failure.reason, failure.message)

    async def _converge(
        self,
        desired: dict[str, Any],
        current: Mapping[str, Any] | None,
        agreed: dict[Key, tuple[str, str]],
    ) -> dict[str, Any] | None:
        """Apply `desired` unless the API server already holds it; the applied child, or None."""
        key, intent = key_of(desired), digest(desired)
        if current is not None:
            seen = digest(what_matters(current))
            if agreed.get(key) == (intent, seen):
                return None
            would_be = await self.api.apply(desired, dry_run=True)
            if digest(what_matters(would_be)) == seen:
                agreed[key] = (intent, seen)
                return None
        applied = await self.api.apply(desired)
        agreed[key] = (intent, digest(what_matters(applied)))
        return applied

    async def _foreign(
        self,
        objects: list[dict[str, Any]],
        secret_names: list[str],
        live: dict[Key, dict[str, Any]],
        present: set[str],
        whose: tuple[str, str, str],
    ) -> list[NameConflict]:
        """Every child name (rendered objects and generated Secrets) held by an object this resource does not
        control. A child the owned-label listing did not find is looked up by name, so an object made by hand
        or by another tool (without our labels) is found before anything is applied over it. A child found by
        name that turns out to be ours (someone removed its labels) is put back into `live`; the generated
        Secrets that exist and are ours go into `present`. `whose`: this resource's namespace, name and uid."""
        namespace, name, uid = whose
        found: list[NameConflict] = []
        for obj in objects:
            key = key_of(obj)
            existing = live.get(key)
            if existing is None:
                existing = await self.api.get(kubeapi.BY_KIND[(key[0], key[1])], namespace, key[2])
                if existing is not None and controlled_by(existing, uid):
                    existing = {"apiVersion": key[0], "kind": key[1], **existing}
                    live[key] = existing
            problem = conflict(obj["kind"], existing, uid, name)
            if problem is not None:
                found.append(problem)
        for secret_name in secret_names:
            try:
                secret = await self.api.get(kubeapi.SECRET, namespace, secret_name)
            except ApiError as exc:
                if exc.status == 403:
                    raise SecretsForbidden(namespace) from None
                raise
            problem = conflict(kubeapi.SECRET.kind, secret, uid, name)
            if problem is not None:
                found.append(problem)  # never mounted: the pods would trust a key someone else holds
            elif secret is not None:
                present.add(secret_name)
        return found

    async def _model_cache(self, resource: MiniMaxM3Deployment) -> dict[str, Any] | None:
        """The MiniMaxM3ModelCache that spec.model.cacheRef names, as stored (None: none named, or not there)."""
        ref = resource.spec.model.cache_ref
        if ref is None:
            return None
        return await self.api.get(kubeapi.CACHE, resource.metadata.namespace, ref.name)

    async def _generated_secrets(
        self,
        resource: MiniMaxM3Deployment,
        plan: Plan,
        owner: Mapping[str, Any],
        outcome: Outcome,
        present: set[str],
    ) -> list[str]:
        """Create the Secrets the plan needs (once; `present`: those that exist already, checked to be ours).
        Returns the names now generated, for status.generatedSecrets."""
        namespace, name, uid = resource.metadata.namespace, resource.metadata.name, owner["metadata"]["uid"]
        needed = required_secrets(resource, plan)
        for secret_name in needed:
            if secret_name not in present:
                secret = ssh_key_secret(namespace, secret_name, labels.object_labels_for(name))
                await self._create_if_absent(owned(secret, owner), uid)
                outcome.created_secrets.append(secret_name)
        return sorted(needed)

    async def _prune_secrets(
        self, namespace: str, uid: str, needed: list[str], status: Mapping[str, Any], outcome: Outcome
    ) -> None:
        """Delete the generated Secrets the plan no longer needs and we control; by name (from
        status.generatedSecrets), never listed."""
        for secret_name in status.get("generatedSecrets") or []:
            if secret_name in needed:
                continue
            existing = await self.api.get(kubeapi.SECRET, namespace, secret_name)
            if existing is not None and controlled_by(existing, uid):
                await self.api.delete(kubeapi.SECRET, namespace, secret_name, existing["metadata"]["uid"])
                outcome.pruned.append(f"Secret/{secret_name}")

    async def _served_kinds(self) -> set[str]:
        """The child kinds this cluster serves. Discovery is asked at most every SERVED_TTL_SECONDS (not twice
        per reconcile): an API installed later (LeaderWorkerSet, the DRA driver) is noticed within that."""
        now = time.monotonic()
        if self._served is not None and now - self._served[0] < SERVED_TTL_SECONDS:
            return self._served[1]
        optional = (kubeapi.LEADER_WORKER_SET, kubeapi.COMPUTE_DOMAIN)
        flags = await asyncio.gather(*(self.api.served(k) for k in optional))
        served = {k.kind for k in kubeapi.CHILD_KINDS if k not in optional} | {
            k.kind for k, ok in zip(optional, flags, strict=True) if ok
        }
        self._served = (now, served)
        return served

    async def _live_children(self, namespace: str, name: str, served: set[str]) -> dict[Key, dict[str, Any]]:
        kinds: list[Kind] = [k for k in kubeapi.CHILD_KINDS if k.kind in served]
        selector = labels.owned_selector(name)
        found = await asyncio.gather(*(self.api.list(k, namespace, selector) for k in kinds))
        return {key_of(obj): obj for items in found for obj in items}

    async def _create_if_absent(self, obj: dict[str, Any], uid: str) -> None:
        """Create a generated object; if it already exists (a lost response, a restart), keep the existing one,
        if it is ours: one made by someone else since we looked fails this reconcile (the retry reports it)."""
        try:
            await self.api.create(obj)
        except ApiError as exc:
            if exc.status != 409:
                raise
            meta = obj["metadata"]
            existing = await self.api.get(
                kubeapi.BY_KIND[(obj["apiVersion"], obj["kind"])], meta["namespace"], meta["name"]
            )
            if existing is not None and not controlled_by(existing, uid):
                raise ApiError(409, "Conflict", f"{obj['kind']} {meta['name']} was created by someone else") from None

    async def _blocked(self, body: Mapping[str, Any], outcome: Outcome, blocked: Blocked, plan: Plan | None) -> Outcome:
        """Report and stop: children are read (for Available) but never touched."""
        meta = body["metadata"]
        outcome.blocked = blocked.reason
        workload_kinds = {kubeapi.DEPLOYMENT.kind}
        if await self.api.served(kubeapi.LEADER_WORKER_SET):
            workload_kinds.add(kubeapi.LEADER_WORKER_SET.kind)
        live = await self._live_children(meta["namespace"], meta["name"], workload_kinds)
        # Only our own workload speaks for Available: a foreign one with our labels is not this fleet.
        workload_obj = next((o for o in live.values() if controlled_by(o, meta["uid"])), None)
        desired = int(((workload_obj or {}).get("spec") or {}).get("replicas") or 0)
        report = Workload.from_live(desired, workload_obj)
        await self._write_status(body, outcome, report, blocked, plan)
        if outcome.status is not None:
            self.events.warn(body, blocked.reason, blocked.message)
            log.warning("%s/%s: %s: %s", meta["namespace"], meta["name"], blocked.reason, blocked.message)
        return outcome

    async def _write_status(
        self,
        body: Mapping[str, Any],
        outcome: Outcome,
        workload: Workload,
        blocked: Blocked | None,
        plan: Plan | None,
        secrets: list[str] | None = None,
        model_cache: dict[str, Any] | None = None,
        autoscaling: bool | None = None,
    ) -> None:
        meta = body["metadata"]
        plan_status = plan.model_dump(by_alias=True, mode="json", exclude_none=True) if plan is not None else None
        selector = labels.serving_selector_string(meta["name"])
        new = status_update(
            body, self.clock(), workload, blocked, plan_status, selector, secrets, model_cache, autoscaling
        )
        if new is None:
            return
        outcome.status = await self.api.patch_status(meta["namespace"], meta["name"], new)
        outcome.gone = outcome.status is None

"""One level-triggered reconcile: validate -> plan -> render -> apply -> prune -> status.

Called for create, update, resume, the periodic resync and child events; it computes from the world as it
is, so calling it twice is harmless. Quiet at rest: a child is re-applied only when the hash of our
intent (recorded on the child) differs, status is written only when it changes, and nothing at all is
written for an unchanged resource. Bad input never tears anything down: an invalid spec or a missing
API only sets `Degraded` and leaves every child exactly as it was.
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

import kopf

from m3fleet.api import parse_resource
from m3fleet.api.models import AutoscalingMode, MiniMaxM3Deployment, Plan
from m3fleet.controller import kube, metrics
from m3fleet.controller.events import Events, KopfEvents
from m3fleet.controller.kube import ApiError, Kind, KubeApi
from m3fleet.controller.secrets import ssh_key_secret
from m3fleet.controller.status import Blocked, Workload, conditions
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan as make_plan
from m3fleet.render import labels, render, required_secrets, set_owner

INTENT_ANNOTATION = "m3fleet.dev/intent-hash"
Key = tuple[str, str, str]  # apiVersion, kind, name


def intent_hash(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


def stamped(obj: dict[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    """Our full intent for a child: owner reference plus the hash of that intent."""
    child = set_owner(obj, dict(owner))
    child["metadata"].setdefault("annotations", {})[INTENT_ANNOTATION] = intent_hash(child)
    return child


def key_of(obj: Mapping[str, Any]) -> Key:
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("controller") and r.get("uid") == uid for r in refs)


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def retry_later(exc: ApiError) -> kopf.TemporaryError:
    """A transient API failure (409/429/5xx, or any read): let kopf retry soon, honouring Retry-After."""
    return kopf.TemporaryError(str(exc), delay=exc.retry_after or 5)


@dataclass
class Outcome:
    """What one reconcile did (for logs, tests and the benchmark)."""

    applied: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    created_secrets: list[str] = field(default_factory=list)
    status_written: bool = False
    blocked: str | None = None


def desired_replicas(resource: MiniMaxM3Deployment, status: Mapping[str, Any]) -> int:
    """spec.replicas, unless the built-in autoscaler acts: then its last decision (GitOps keeps spec)."""
    scaling = resource.spec.autoscaling
    if not scaling.enabled or scaling.mode != AutoscalingMode.ACT:
        return resource.spec.replicas
    decided = (status.get("autoscaling") or {}).get("desiredReplicas")
    count = int(decided) if isinstance(decided, int | float) else resource.spec.replicas
    return max(scaling.min_replicas, min(scaling.max_replicas, count))


MISSING_API = {
    kube.LEADER_WORKER_SET.kind: (
        "LeaderWorkerSetNotInstalled",
        "a replica spans {nodes} nodes and needs the LeaderWorkerSet API (leaderworkerset.x-k8s.io/v1), which this "
        "cluster does not serve: install LeaderWorkerSet v0.6 or newer, or plan a replica that fits one node",
    ),
    kube.COMPUTE_DOMAIN.kind: (
        "ComputeDomainNotInstalled",
        "multi-node GB200 replicas need the NVIDIA DRA driver's ComputeDomain API (resource.nvidia.com/v1beta1), "
        "which this cluster does not serve: install the NVIDIA DRA driver for GPUs with ComputeDomain support",
    ),
}


class Reconciler:
    def __init__(self, api: KubeApi, clock: Callable[[], str] = utc_now, events: Events | None = None) -> None:
        self.api = api
        self.clock = clock
        self.events: Events = events or KopfEvents()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._applied_generation: dict[tuple[str, str, str, str], int] = {}

    def _lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault((namespace, name), asyncio.Lock())

    async def reconcile_by_name(self, namespace: str, name: str, logger: logging.Logger | Any) -> Outcome | None:
        async with self._lock(namespace, name):
            # Always the freshest body: another reconcile of the same resource may just have written status.
            try:
                body = await self.api.get(kube.M3D, namespace, name)
            except ApiError as exc:
                raise retry_later(exc) from exc
            if body is None:
                return None
            started = time.monotonic()
            try:
                outcome = await self._reconcile(body, logger)
            except ApiError as exc:  # a read or the status write failed (child writes are mapped inside)
                metrics.RECONCILES.labels("error").inc()
                raise retry_later(exc) from exc
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

    async def reconcile(self, body: Mapping[str, Any], logger: logging.Logger | Any) -> Outcome | None:
        meta = body["metadata"]
        return await self.reconcile_by_name(meta["namespace"], meta["name"], logger)

    async def _reconcile(self, body: Mapping[str, Any], logger: logging.Logger | Any) -> Outcome:
        meta = body["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
        status = body.get("status") or {}
        outcome = Outcome()
        if meta.get("deletionTimestamp"):
            return outcome  # children go by garbage collection through their owner references
        try:
            resource = parse_resource(dict(body))
            plan = make_plan(resource.spec)
            objects = render(resource, plan, desired_replicas(resource, status))
        except (SpecError, SpecErrors) as exc:
            blocked = Blocked("InvalidSpec", str(exc))
            return await self._blocked(body, outcome, blocked, None, logger)

        served = await self._served_kinds()
        for obj in objects:
            missing = MISSING_API.get(obj["kind"])
            if missing and obj["kind"] not in served:
                reason, message = missing
                blocked = Blocked(reason, message.format(nodes=plan.nodes_per_replica))
                return await self._blocked(body, outcome, blocked, plan, logger)

        owner = {"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": {"name": name, "uid": uid}}
        live = await self._live_children(namespace, name, served)
        wanted: set[Key] = set()
        try:
            secrets = await self._generated_secrets(resource, plan, owner, status, outcome)
            for obj in objects:
                desired = stamped(obj, owner)
                key = key_of(desired)
                wanted.add(key)
                current = live.get(key)
                annotations = (current or {}).get("metadata", {}).get("annotations") or {}
                if (
                    current
                    and controlled_by(current, uid)
                    and annotations.get(INTENT_ANNOTATION) == desired["metadata"]["annotations"][INTENT_ANNOTATION]
                    and not self._edited_since_applied(namespace, key, current)
                ):
                    continue
                live[key] = await self.api.apply(desired)
                self._remember_generation(namespace, key, live[key])
                outcome.applied.append(f"{desired['kind']}/{desired['metadata']['name']}")
            for key, obj in sorted(live.items()):
                if key not in wanted and controlled_by(obj, uid):
                    kind = kube.BY_KIND[(key[0], key[1])]
                    await self.api.delete(kind, namespace, key[2], obj["metadata"]["uid"])
                    outcome.pruned.append(f"{key[1]}/{key[2]}")
        except ApiError as exc:
            if exc.status in (400, 403, 404, 422):  # the cluster rejects our intent: say so, retry slowly
                blocked = Blocked("ApplyFailed", f"the API server rejected a child: {exc}")
                await self._blocked(body, outcome, blocked, plan, logger)
                raise kopf.TemporaryError(str(exc), delay=300) from exc
            raise retry_later(exc) from exc

        if outcome.applied:
            self.events.info(body, "Applied", ", ".join(outcome.applied))
            logger.info("Applied %s", ", ".join(outcome.applied))
        if outcome.pruned:
            self.events.info(body, "Pruned", ", ".join(outcome.pruned))
            logger.info("Pruned %s", ", ".join(outcome.pruned))
        workload = next(o for o in objects if o["kind"] in (kube.DEPLOYMENT.kind, kube.LEADER_WORKER_SET.kind))
        report = Workload.from_live(workload["spec"]["replicas"], live.get(key_of(workload)))
        metrics.DESIRED_REPLICAS.labels(namespace, name).set(report.desired)
        metrics.READY_REPLICAS.labels(namespace, name).set(report.ready)
        outcome.status_written = await self._write_status(body, report, None, plan, secrets)
        return outcome

    def _remember_generation(self, namespace: str, key: Key, applied: Mapping[str, Any]) -> None:
        generation = (applied.get("metadata") or {}).get("generation")
        if generation is not None:
            self._applied_generation[(namespace, *key)] = int(generation)

    def _edited_since_applied(self, namespace: str, key: Key, live: Mapping[str, Any]) -> bool:
        """Someone changed the child's spec after our last apply (its generation moved), though our intent
        did not change: apply again. Known only for children this process applied; status updates by the
        child's own controller do not move the generation."""
        recorded = self._applied_generation.get((namespace, *key))
        generation = (live.get("metadata") or {}).get("generation")
        return recorded is not None and generation is not None and int(generation) != recorded

    async def _generated_secrets(
        self,
        resource: MiniMaxM3Deployment,
        plan: Plan,
        owner: Mapping[str, Any],
        status: Mapping[str, Any],
        outcome: Outcome,
    ) -> list[str]:
        """Create the Secrets the plan needs (once), delete the ones it no longer needs; by name, never listed.
        Returns the names now generated, for status.generatedSecrets."""
        namespace, name, uid = resource.metadata.namespace, resource.metadata.name, owner["metadata"]["uid"]
        needed = required_secrets(resource, plan)
        for secret_name in needed:
            if await self.api.get(kube.SECRET, namespace, secret_name) is None:
                secret = ssh_key_secret(namespace, secret_name, labels.object_labels_for(name))
                await self._create_if_absent(set_owner(secret, dict(owner)))
                outcome.created_secrets.append(secret_name)
        for secret_name in status.get("generatedSecrets") or []:
            if secret_name in needed:
                continue
            existing = await self.api.get(kube.SECRET, namespace, secret_name)
            if existing is not None and controlled_by(existing, uid):
                await self.api.delete(kube.SECRET, namespace, secret_name, existing["metadata"]["uid"])
                outcome.pruned.append(f"Secret/{secret_name}")
        return sorted(needed)

    async def _served_kinds(self) -> set[str]:
        optional = (kube.LEADER_WORKER_SET, kube.COMPUTE_DOMAIN)
        flags = await asyncio.gather(*(self.api.served(k) for k in optional))
        return {k.kind for k in kube.CHILD_KINDS if k not in optional} | {
            k.kind for k, ok in zip(optional, flags, strict=True) if ok
        }

    async def _live_children(self, namespace: str, name: str, served: set[str]) -> dict[Key, dict[str, Any]]:
        kinds: list[Kind] = [k for k in kube.CHILD_KINDS if k.kind in served]
        selector = labels.owned_selector(name)
        found = await asyncio.gather(*(self.api.list(k, namespace, selector) for k in kinds))
        return {key_of(obj): obj for items in found for obj in items}

    async def _create_if_absent(self, obj: dict[str, Any]) -> None:
        """Create a generated object; if it already exists (a lost response, a restart), keep the existing one."""
        try:
            await self.api.create(obj)
        except ApiError as exc:
            if exc.status != 409:
                raise

    async def _blocked(
        self, body: Mapping[str, Any], outcome: Outcome, blocked: Blocked, plan: Plan | None, logger: Any
    ) -> Outcome:
        """Report and stop: children are read (for Available) but never touched."""
        meta = body["metadata"]
        outcome.blocked = blocked.reason
        workload_kinds = {kube.DEPLOYMENT.kind}
        if await self.api.served(kube.LEADER_WORKER_SET):
            workload_kinds.add(kube.LEADER_WORKER_SET.kind)
        live = await self._live_children(meta["namespace"], meta["name"], workload_kinds)
        workload_obj = next(iter(live.values()), None)
        desired = int(((workload_obj or {}).get("spec") or {}).get("replicas") or 0)
        report = Workload.from_live(desired, workload_obj)
        outcome.status_written = await self._write_status(body, report, blocked, plan)
        if outcome.status_written:
            self.events.warn(body, blocked.reason, blocked.message)
            logger.warning("%s: %s", blocked.reason, blocked.message)
        return outcome

    async def _write_status(
        self,
        body: Mapping[str, Any],
        workload: Workload,
        blocked: Blocked | None,
        plan: Plan | None,
        secrets: list[str] | None = None,
    ) -> bool:
        meta = body["metadata"]
        current = dict(body.get("status") or {})
        generation = int(meta.get("generation") or 0)
        new = {
            "observedGeneration": generation,
            "conditions": conditions(current.get("conditions") or [], generation, self.clock(), workload, blocked),
            "plan": plan.model_dump(by_alias=True, mode="json") if plan is not None else current.get("plan"),
            "replicas": workload.replicas,
            "readyReplicas": workload.ready,
            "selector": labels.serving_selector_string(meta["name"]),
        }
        if secrets is not None and (secrets or current.get("generatedSecrets")):
            new["generatedSecrets"] = secrets  # None (blocked): leave the record as it is
        if all(current.get(k) == v for k, v in new.items()):
            return False
        await self.api.patch_status(meta["namespace"], meta["name"], new)
        return True

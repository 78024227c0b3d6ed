"""One level-triggered reconcile of a MiniMaxM3Deployment: observe -> decide (pure: controller/decide.py) -> act.

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

from m3fleet import kubeapi
from m3fleet.api.conditions import DeploymentReason
from m3fleet.controller import metrics
from m3fleet.controller.decide import (
    SERVED_TTL_SECONDS,
    Key,
    Observed,
    StatusDraft,
    Understood,
    Work,
    decide,
    failure_to_tell,
    key_of,
    running_workload,
    want,
)
from m3fleet.controller.events import Events, KopfEvents
from m3fleet.controller.secrets import ssh_key_secret
from m3fleet.controller.status import (
    Blocked,
    Workload,
    create_failure,
    desired_replicas,
    pods_per_replica,
    status_update,
)
from m3fleet.kubeapi import ApiError, Kind, KubeApi
from m3fleet.render import labels, set_owner
from m3fleet.render.ownership import controlled_by

REJECTED = (400, 403, 404, 422)  # the API server refuses our intent (not a transient failure)
PODS_MISSING_RETRY_SECONDS = 30.0  # while a rollout lacks pods: a refusal to create them is only an Event
FAILED_CREATE_EVENTS = f"reason={DeploymentReason.FAILED_CREATE}"

log = logging.getLogger(__name__)


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

    async def reconcile(self, body: Mapping[str, Any], understood: Understood) -> Outcome:
        """Reconcile `body` (`understood`: its spec parsed and planned). Raises ApiError when the API failed us
        (after reporting a rejection in status): retry later."""
        started = time.monotonic()
        try:
            outcome = await self._reconcile(body, understood)
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

    async def _reconcile(self, body: Mapping[str, Any], understood: Understood) -> Outcome:
        if body["metadata"].get("deletionTimestamp"):
            return Outcome()  # children go by garbage collection through their owner references
        seen = await self._observe(body, understood)
        if seen is None:
            return Outcome(gone=True)
        work = decide(seen)
        return await self._act(body, work, seen.live)

    # -- observe ------------------------------------------------------------------------------------

    async def _observe(self, body: Mapping[str, Any], understood: Understood) -> Observed | None:
        """Every read the decision needs; None when the resource turns out to be gone."""
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        cache = await self._model_cache(understood, namespace)
        wanted = want(understood, cache, body.get("status") or {})
        served = await self._served_kinds()
        live = await self._live_children(namespace, name, served)
        # A child we applied is gone: perhaps with its owner (garbage collection), deleted while the watch was down.
        # Re-creating the children of a deleted owner would fight the garbage collector: never bring them back.
        agreed = self._agreed.setdefault((namespace, name), {})
        gone = any(key in agreed and key not in live for key in map(key_of, wanted.objects))
        if gone and not await kubeapi.still_exists(self.api, body):
            return None
        # A child the owned-label listing did not find is looked up by name, so an object made by hand or by another
        # tool (without our labels) is found before anything is applied over it; one that turns out to be ours
        # (someone removed its labels) is live.
        named: dict[Key, dict[str, Any]] = {}
        for obj in wanted.objects:
            key = key_of(obj)
            if key in live or obj["kind"] not in served:
                continue
            existing = await self.api.get(kubeapi.BY_KIND[(key[0], key[1])], namespace, key[2])
            if existing is not None:
                existing = {"apiVersion": key[0], "kind": key[1], **existing}
                (live if controlled_by(existing, uid) else named)[key] = existing
        secrets: dict[str, dict[str, Any] | None] = {}
        for secret_name in wanted.secrets:  # by name: Secrets are never listed
            try:
                secrets[secret_name] = await self.api.get(kubeapi.SECRET, namespace, secret_name)
            except ApiError as exc:
                if exc.status != 403:
                    raise
                return Observed(body, understood, cache, wanted, frozenset(served), live, named, secrets_forbidden=True)
        return Observed(body, understood, cache, wanted, frozenset(served), live, named, secrets)

    async def _model_cache(self, understood: Understood, namespace: str) -> dict[str, Any] | None:
        """The MiniMaxM3ModelCache that spec.model.cacheRef names, as stored (None: none named, or not there)."""
        ref = understood.resource.spec.model.cache_ref if understood.resource is not None else None
        if ref is None:
            return None
        return await self.api.get(kubeapi.CACHE, namespace, ref.name)

    async def _served_kinds(self) -> set[str]:
        """The child kinds this cluster serves. Discovery is asked at most every SERVED_TTL_SECONDS (not twice
        per reconcile): an API installed later (LeaderWorkerSet, the DRA driver) is noticed within that."""
        now = time.monotonic()
        if self._served is not None and now - self._served[0] < SERVED_TTL_SECONDS:
            return self._served[1]
        optional = (kubeapi.LEADER_WORKER_SET, kubeapi.COMPUTE_DOMAIN, kubeapi.DYNAMO_GRAPH_DEPLOYMENT)
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

    # -- act ----------------------------------------------------------------------------------------

    async def _act(self, body: Mapping[str, Any], work: Work, live: dict[Key, dict[str, Any]]) -> Outcome:
        """Do the work, then report: the status describes the workload as the apply left it."""
        outcome = Outcome()
        if work.blocked is not None:
            outcome.retry_after = work.retry_after
            await self._report_blocked(body, outcome, work.blocked, work.blocked_report, work.status)
            return outcome
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        try:
            await self._generate_secrets(work, outcome, namespace, name, uid)
            await self._apply_and_prune(work, live, outcome, namespace, name)
            # Only once the workload that no longer mounts them is applied: if the API server refuses it, the old
            # workload keeps running and still needs its Secret.
            await self._prune_secrets(namespace, uid, work.prune_secrets, outcome)
        except ApiError as exc:
            if exc.status in REJECTED:  # the cluster refuses our intent: say so, then retry like any failure
                blocked = Blocked(DeploymentReason.APPLY_FAILED, f"the API server rejected a child: {exc}")
                draft = StatusDraft(plan=work.status.plan, selector=work.status.selector)
                await self._report_blocked(body, outcome, blocked, running_workload(live, uid), draft)
            raise
        finally:  # what was done is said, also when a later step failed
            for reason, done in (("Applied", outcome.applied), ("Pruned", outcome.pruned)):
                if done:
                    self.events.info(body, reason, ", ".join(done))
                    log.info("%s/%s: %s %s", namespace, name, reason.lower(), ", ".join(done))
            # A pruned workload of the other kind: the replicas moved between a Deployment and a LeaderWorkerSet.
            for kind, notice in work.replaced.items():
                if any(item.split("/", 1)[0] == kind for item in outcome.pruned):
                    self.events.warn(body, "WorkloadReplaced", notice)
        report = await self._workload_report(work, live, namespace, name)
        if report.pods_missing:  # a refusal to create pods announces itself by no event we watch: look again
            outcome.retry_after = PODS_MISSING_RETRY_SECONDS
        await self._write_status(body, outcome, report, None, work.status)
        failure = failure_to_tell(body, report)
        if failure is not None and outcome.status is not None:
            self.events.warn(body, failure.reason, failure.message)
            log.warning("%s/%s: %s: %s", namespace, name, failure.reason, failure.message)
        return outcome

    async def _generate_secrets(self, work: Work, outcome: Outcome, namespace: str, name: str, uid: str) -> None:
        """Create the Secrets the plan needs and that do not exist yet (their keys are made here, once)."""
        for secret_name in work.generate:
            secret = ssh_key_secret(namespace, secret_name, labels.object_labels_for(name))
            await self._create_if_absent(set_owner(secret, work.owner), uid)
            outcome.created_secrets.append(secret_name)

    async def _apply_and_prune(
        self, work: Work, live: dict[Key, dict[str, Any]], outcome: Outcome, namespace: str, name: str
    ) -> None:
        """Apply each wanted child the API server does not already hold, then delete the children decided."""
        agreed = self._agreed.setdefault((namespace, name), {})
        for child in work.apply:
            key = key_of(child)
            applied = await self._converge(child, live.get(key), agreed)
            if applied is not None:
                live[key] = applied
                outcome.applied.append(f"{child['kind']}/{child['metadata']['name']}")
        for gone in work.prune:
            await self.api.delete(kubeapi.BY_KIND[(gone.api_version, gone.kind)], namespace, gone.name, gone.uid)
            agreed.pop((gone.api_version, gone.kind, gone.name), None)
            outcome.pruned.append(f"{gone.kind}/{gone.name}")

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

    async def _prune_secrets(self, namespace: str, uid: str, names: list[str], outcome: Outcome) -> None:
        """Delete the generated Secrets no longer needed, those we control; by name (from status.generatedSecrets),
        never listed."""
        for secret_name in names:
            existing = await self.api.get(kubeapi.SECRET, namespace, secret_name)
            if existing is not None and controlled_by(existing, uid):
                await self.api.delete(kubeapi.SECRET, namespace, secret_name, existing["metadata"]["uid"])
                outcome.pruned.append(f"Secret/{secret_name}")

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

    # -- report -------------------------------------------------------------------------------------

    async def _workload_report(
        self, work: Work, live: Mapping[Key, dict[str, Any]], namespace: str, name: str
    ) -> Workload:
        """What the workload child reports; during a rollout also why pods wait (at rest this reads nothing), with
        the model cache's words when pods wait and a model cache they require is not ready."""
        workload = work.workload
        if workload is None:
            raise ValueError("a reconcile that is not blocked applies a workload")
        report = Workload.from_live(desired_replicas(workload), live.get(key_of(workload)), pods_per_replica(workload))
        if not report.all_ready:
            pods = await self.api.list(kubeapi.POD, namespace, labels.owned_selector(name))
            refused = None
            if report.missing_pods(pods):  # pods the workload controller has not created: perhaps it may not
                events = await self.api.list(kubeapi.EVENT, namespace, field_selector=FAILED_CREATE_EVENTS)
                refused = create_failure(events, workload["metadata"]["name"], self.clock())
            report = report.with_pods(pods, work.status.cache_hint, refused)
        metrics.DESIRED_REPLICAS.labels(namespace, name).set(report.desired)
        metrics.READY_REPLICAS.labels(namespace, name).set(report.ready)
        return report

    async def _report_blocked(
        self,
        body: Mapping[str, Any],
        outcome: Outcome,
        blocked: Blocked,
        report: Workload | None,
        draft: StatusDraft,
    ) -> None:
        """Report and stop: children are read (for Available) but never touched."""
        meta = body["metadata"]
        outcome.blocked = blocked.reason
        await self._write_status(body, outcome, report or Workload(0), blocked, draft)
        if outcome.status is not None:
            self.events.warn(body, blocked.reason, blocked.message)
            log.warning("%s/%s: %s: %s", meta["namespace"], meta["name"], blocked.reason, blocked.message)

    async def _write_status(
        self, body: Mapping[str, Any], outcome: Outcome, workload: Workload, blocked: Blocked | None, draft: StatusDraft
    ) -> None:
        meta = body["metadata"]
        new = status_update(
            body,
            self.clock(),
            workload,
            blocked,
            draft.plan,
            draft.selector,
            draft.secrets,
            draft.model_cache,
            draft.autoscaling,
        )
        if new is None:
            return
        outcome.status = await self.api.patch_status(meta["namespace"], meta["name"], new)
        outcome.gone = outcome.status is None

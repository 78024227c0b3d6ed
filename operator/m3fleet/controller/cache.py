"""The MiniMaxM3ModelCache shell: read the world, call `m3fleet.cache.plan.plan_cache`, apply, report.

One reconcile reads the cache's nodes (all nodes: the pool is decided in the plan), its Jobs (and, for a failed
one, its pod's termination message), the engine images of the deployments that name it and whether its token
Secret exists (metadata only: the token is never read); then, in this order, it sets/removes node labels (a
label goes before a Job that rewrites the copy is created), deletes and creates Jobs, applies or deletes the
pre-pull DaemonSet, writes status, and drops its finalizer once a deleted cache is cleaned up.

`CacheManager` runs these from a work queue like the deployments' `Manager`: a cache is due when first seen,
when its generation, labels or deletion change (or another cache's: they may share a directory), when one of its
Jobs or its DaemonSet changes, when a node is added, removed, relabelled or (un)cordoned, when a deployment naming
it changes, and when an engine pod mounting a node directory goes; a failed reconcile is retried after 1 s doubling
up to 60 s; the plan's own `requeue_after` (a Job's next attempt, a Secret looked for again, a cleanup under way)
schedules the next look.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from m3fleet import __version__, kubeapi, permissions
from m3fleet.api import parse_resource
from m3fleet.api.cache import CACHE_KIND, DEFAULT_PATH_PREFIXES, MiniMaxM3ModelCache, node_label_key
from m3fleet.api.conditions import CacheReason
from m3fleet.api.parse import parse_cache
from m3fleet.cache.plan import (
    ACTION_LABEL,
    ATTEMPT_ANNOTATION,
    BAD_SOURCE_EXIT_CODE,
    CACHE_LABEL,
    CLEAN,
    CONTENT_LABEL,
    FINALIZER,
    MANAGED_BY,
    MANAGER,
    NODE_ANNOTATION,
    Inputs,
    JobView,
    NodeView,
    OtherCache,
    Verdict,
    Work,
    plan_cache,
    refusal,
    written_path,
)
from m3fleet.controller.events import Events, KopfEvents
from m3fleet.controller.manager import backoff, key_of, newer
from m3fleet.controller.queue import WorkQueue
from m3fleet.controller.reconcile import digest, utc_now
from m3fleet.controller.status import condition
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.kubeapi import ApiError, KubeApi
from m3fleet.planner import plan as make_plan
from m3fleet.render.ownership import controlled_by, controller_of

Key = tuple[str, str]
DEFAULT_STAGER_IMAGE = f"ghcr.io/m3fleet/operator:{__version__}"  # the operator image of this release
STAGER_IMAGE_VARIABLE = "M3FLEET_STAGER_IMAGE"  # the chart sets it to the operator's own image
# The admin's rules (chart values modelCache.allowedPathPrefixes, modelCache.allowedStagerImages), comma-separated.
PATH_PREFIXES_VARIABLE = "M3FLEET_CACHE_PATH_PREFIXES"
STAGER_IMAGES_VARIABLE = "M3FLEET_STAGER_IMAGES"
TRIGGERS = ("uid", "generation", "labels", "deletionTimestamp")

log = logging.getLogger(__name__)


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def job_view(job: Mapping[str, Any], pods: list[dict[str, Any]]) -> JobView:
    """What the plan needs of a Job: its state from the job controller's conditions, and for a failure the
    staging program's own words (the pod's termination message) and whether it rejected the source."""
    meta = job["metadata"]
    conditions = (job.get("status") or {}).get("conditions") or []
    ended = {c["type"]: c for c in conditions if c.get("status") == "True" and c.get("type") in ("Complete", "Failed")}
    state = "Complete" if "Complete" in ended else "Failed" if "Failed" in ended else "Active"
    done = ended.get(state, {})
    message, bad_source = str(done.get("message") or ""), done.get("reason") == "PodFailurePolicy"
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated") or {}
            if terminated.get("exitCode") not in (None, 0):
                message = str(terminated.get("message") or message or terminated.get("reason") or "")
                bad_source = bad_source or terminated.get("exitCode") == BAD_SOURCE_EXIT_CODE
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return JobView(
        name=meta["name"],
        uid=meta.get("uid", ""),
        node=annotations.get(NODE_ANNOTATION, ""),
        content=labels.get(CONTENT_LABEL, ""),
        action=labels.get(ACTION_LABEL, ""),
        attempt=int(annotations.get(ATTEMPT_ANNOTATION) or 1),
        state=state,
        finished_at=_epoch(done.get("lastTransitionTime")),
        bad_source=bad_source and state == "Failed",
        message=message[:1000],
        path=written_path(job),
        stopping=bool(meta.get("deletionTimestamp")),
    )


def node_view(node: Mapping[str, Any], now: float) -> NodeView:
    """A node as the plan sees it; not Ready since its Ready condition last changed (a node that reports no
    Ready condition yet is taken as Ready: it has just registered)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    not_ready_since = None
    if ready is not None and ready.get("status") != "True":
        not_ready_since = _epoch(ready.get("lastTransitionTime")) or _epoch(ready.get("lastHeartbeatTime")) or now
    return NodeView(
        node["metadata"]["name"],
        dict(node["metadata"].get("labels") or {}),
        not (node.get("spec") or {}).get("unschedulable", False),
        not_ready_since,
    )


def mounts_of(pods: list[dict[str, Any]]) -> dict[str, list[str]]:
    """node -> the hostPath directories the running engine pods there mount (the cache's own Job pods aside)."""
    mounts: dict[str, list[str]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or CACHE_LABEL in (pod["metadata"].get("labels") or {}):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            if (host := (volume.get("hostPath") or {}).get("path")) is not None:
                mounts.setdefault(node, []).append(str(host))
    return mounts


def _readiness(body: Mapping[str, Any]) -> tuple[str, str]:
    """A cache's Ready condition as (status, reason)."""
    conditions = (body.get("status") or {}).get("conditions") or []
    ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    return str(ready.get("status") or ""), str(ready.get("reason") or "")


def ready_nodes(body: Mapping[str, Any]) -> frozenset[str]:
    """The nodes where a cache's status says its copy is Ready, when that status is of its current spec (after a
    spec change the old Ready entries say nothing about the new path)."""
    status = body.get("status") or {}
    if int(status.get("observedGeneration") or -1) != int(body["metadata"].get("generation") or 0):
        return frozenset()
    return frozenset(str(n.get("name")) for n in status.get("nodes") or [] if n.get("phase") == "Ready")


def other_caches(caches: list[dict[str, Any]], namespace: str, name: str) -> list[OtherCache]:
    """Every cache listed but this one, with its spec.path (also when the rest of its spec does not parse: its
    directory is still never cleaned)."""
    others = []
    for body in caches:
        meta, path = body["metadata"], (body.get("spec") or {}).get("path")
        if (meta["namespace"], meta["name"]) == (namespace, name) or not isinstance(path, str) or not path:
            continue
        try:
            parsed: MiniMaxM3ModelCache | None = parse_cache(dict(body))
        except (SpecError, SpecErrors):
            parsed = None
        key = f"{meta['namespace']}/{meta['name']}"
        others.append(OtherCache(key, path, str(meta.get("creationTimestamp") or ""), parsed, ready_nodes(body)))
    return others


def of_other_caches(jobs: list[dict[str, Any]], caches: list[dict[str, Any]], uid: str) -> list[dict[str, Any]]:
    """The Jobs another live cache controls (its uid, in its namespace): only those say a directory is being emptied.
    A look-alike carrying the same labels (made by hand, in any namespace) is no one's cleanup and changes nothing."""
    live = {c["metadata"].get("uid"): c["metadata"]["namespace"] for c in caches if c["metadata"].get("uid") != uid}
    ours = []
    for job in jobs:
        owner = controller_of(job)
        if owner is None or owner.get("kind") != CACHE_KIND:
            continue
        if live.get(owner.get("uid")) == job["metadata"].get("namespace"):
            ours.append(job)
    return ours


def images_for(cache: MiniMaxM3ModelCache, deployments: list[dict[str, Any]]) -> list[str]:
    """Engine images of the deployments in the cache's namespace whose cacheRef names it (invalid ones skipped:
    their own status says why)."""
    images = []
    for body in deployments:
        try:
            resource = parse_resource(body)
            ref = resource.spec.model.cache_ref
            if ref is not None and ref.name == cache.metadata.name:
                images.append(make_plan(resource.spec).image)
        except (SpecError, SpecErrors):
            continue
    return sorted(set(images))


def namespace_terminating(exc: ApiError) -> bool:
    """The apiserver's NamespaceLifecycle refusal of a create in a namespace being deleted (403, cause
    NamespaceTerminating; its message is the part our error keeps)."""
    return exc.status == 403 and "because it is being terminated" in exc.message


@dataclass
class CacheOutcome:
    status: dict[str, Any] | None = None
    requeue_after: float | None = None
    gone: bool = False


class CacheReconciler:
    def __init__(
        self,
        api: KubeApi,
        stager_image: str,
        events: Events | None = None,
        clock: Callable[[], str] = utc_now,
        scope: str | None = None,
        allowed_prefixes: Sequence[str] = DEFAULT_PATH_PREFIXES,
        allowed_images: Sequence[str] = (),
    ) -> None:
        self.api = api
        self.stager_image = stager_image
        self.allowed_prefixes, self.allowed_images = tuple(allowed_prefixes), tuple(allowed_images)
        self.scope = scope  # the namespace the operator watches (None: all): where it may list other caches
        self.events: Events = events or KopfEvents()
        self.clock = clock
        # Per DaemonSet: (digest of our intent, the generation the apply returned). Quiet at rest: applied again
        # only when the intent changes or someone changed its spec (a new generation).
        self._applied: dict[tuple[str, str], tuple[str, int]] = {}
        self._unchecked_tokens: set[str] = set()  # namespaces where the token check was refused (warned once)

    async def reconcile(self, body: Mapping[str, Any]) -> CacheOutcome:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        deleting = bool(meta.get("deletionTimestamp"))
        try:
            cache = parse_cache(dict(body))
        except (SpecError, SpecErrors) as exc:  # admission checks the same: only an older CRD lets this through
            if deleting:  # its label names no node directory any more: off every node (files: the spec is unreadable)
                await self._unlabel_all(namespace, name)
                return await self._release(body)
            return CacheOutcome(await self._write_status(body, {}, refusal(CacheReason.INVALID_SPEC, str(exc))))
        if not deleting and FINALIZER not in (meta.get("finalizers") or []):
            patch = {
                "metadata": {
                    "finalizers": [*(meta.get("finalizers") or []), FINALIZER],
                    "resourceVersion": meta.get("resourceVersion"),
                }
            }
            if await self.api.merge_patch(kubeapi.CACHE, namespace, name, patch) is None:
                return CacheOutcome(gone=True)

        selector = f"{CACHE_LABEL}={name},{MANAGED_BY}={MANAGER}"
        nodes, jobs, daemonsets, deployments, caches, cleans, running = await asyncio.gather(
            self.api.list(kubeapi.NODE, None, ""),
            self.api.list(kubeapi.JOB, namespace, selector),
            self.api.list(kubeapi.DAEMON_SET, namespace, selector),
            self.api.list(kubeapi.M3D, namespace, ""),
            self.api.list(kubeapi.CACHE, self.scope, ""),  # where the operator watches (all namespaces, or its own)
            self.api.list(kubeapi.JOB, self.scope, f"{ACTION_LABEL}={CLEAN},{MANAGED_BY}={MANAGER}"),
            self.api.list(kubeapi.POD, namespace, f"{MANAGED_BY}={MANAGER}"),
        )
        # A look-alike DaemonSet is not ours to delete or overwrite: only its name is kept, to stay off it.
        taken = {d["metadata"]["name"] for d in daemonsets if not controlled_by(d, meta["uid"])}
        daemonsets = [d for d in daemonsets if controlled_by(d, meta["uid"])]
        views = []
        for job in jobs:
            if not controlled_by(job, meta["uid"]):
                continue  # a deleted namesake's Job, not yet collected: its copy may already be cleaned away
            failed = any(
                c.get("type") == "Failed" and c.get("status") == "True"
                for c in (job.get("status") or {}).get("conditions") or []
            )
            pods = (
                await self.api.list(kubeapi.POD, namespace, f"batch.kubernetes.io/job-name={job['metadata']['name']}")
                if failed
                else []
            )
            views.append(job_view(job, pods))
        missing = None
        hf = cache.spec.source.hugging_face
        secret = hf.token_secret_ref if hf is not None and not deleting else None
        if secret is not None and not await self._token_exists(body, secret.name):
            missing = secret.name
        now = time.time()
        work = plan_cache(
            Inputs(
                cache=cache,
                uid=meta["uid"],
                nodes=[node_view(n, now) for n in nodes],
                jobs=views,
                images=images_for(cache, deployments),
                now=now,
                stager_image=self.stager_image,
                secret_missing=missing,
                daemonset_exists=bool(daemonsets),
                deleting=deleting,
                reported_nodes=(body.get("status") or {}).get("nodes") or [],
                created=str(meta.get("creationTimestamp") or ""),
                others=other_caches(caches, namespace, name),
                foreign_cleans=[job_view(j, []) for j in of_other_caches(cleans, caches, meta["uid"])],
                mounts=mounts_of(running),
                allowed_prefixes=self.allowed_prefixes,
                allowed_images=self.allowed_images,
            )
        )
        if work.daemonset is not None and work.daemonset["metadata"]["name"] in taken:
            log.warning(
                "%s/%s: DaemonSet %s exists and is not the cache's: not pre-pulling",
                namespace,
                name,
                work.daemonset["metadata"]["name"],
            )
            work.daemonset = None
        try:
            await self._apply(cache, work, namespace, daemonsets)
        except ApiError as exc:
            if not (deleting and namespace_terminating(exc)):
                raise
            # The namespace is being deleted: the apiserver admits no new object in it, so no cleanup Job can run,
            # and waiting for one would hold the namespace's deletion forever on our finalizer. Unlabel, release,
            # and say where the files stay (in the log: no Event can be posted there either).
            await self._unlabel_all(namespace, name)
            left = sorted({job["metadata"]["annotations"][NODE_ANNOTATION] for job in work.create})
            log.warning(
                "%s/%s: namespace being deleted, no cleanup Job can run in it: the files in %s stay on %s",
                namespace, name, cache.spec.path, ", ".join(left),
            )  # fmt: skip
            return await self._release(body)
        if deleting and work.release:
            released = await self._release(body)
            for message in work.left_behind:  # the resource goes with its status: the Event is what stays
                self.events.warn(body, "CopyLeftOnNode", message)
                log.warning("%s/%s: %s", namespace, name, message)
            return released
        status = {**work.status, "nodes": work.nodes}
        return CacheOutcome(await self._write_status(body, status, work.conditions), work.requeue_after)

    async def _apply(
        self, cache: MiniMaxM3ModelCache, work: Work, namespace: str, daemonsets: list[dict[str, Any]]
    ) -> None:
        label = work.status["nodeLabel"].split("=", 1)[0]
        for node, value in work.labels.items():  # first: a node being rewritten is unlabelled before its Job
            await self.api.merge_patch(kubeapi.NODE, None, node, {"metadata": {"labels": {label: value}}})
            log.info(
                "%s/%s: node %s %s",
                namespace,
                cache.metadata.name,
                node,
                f"labelled {label}={value}" if value else f"unlabelled {label}",
            )
        for job in work.delete:
            # Foreground: the Job stays listed (and counts as writing) until its pods are gone.
            await self.api.delete(kubeapi.JOB, namespace, job.name, job.uid, propagation="Foreground")
        for obj in work.create:
            try:
                await self.api.create(obj)
            except ApiError as exc:
                if exc.status != 409:  # 409: created already (a lost answer, a restart)
                    raise
            log.info("%s/%s: created Job %s", namespace, cache.metadata.name, obj["metadata"]["name"])
        if work.daemonset is not None:
            key, intent = (namespace, work.daemonset["metadata"]["name"]), digest(work.daemonset)
            live = next((d for d in daemonsets if d["metadata"]["name"] == key[1]), None)
            generation = int((live or {}).get("metadata", {}).get("generation") or 0)
            if live is None or self._applied.get(key) != (intent, generation):
                applied = await self.api.apply(work.daemonset)
                self._applied[key] = (intent, int(applied["metadata"].get("generation") or 0))
        elif work.delete_daemonset:
            for ds in daemonsets:
                await self.api.delete(kubeapi.DAEMON_SET, namespace, ds["metadata"]["name"], ds["metadata"]["uid"])
                self._applied.pop((namespace, ds["metadata"]["name"]), None)

    async def _token_exists(self, body: Mapping[str, Any], name: str) -> bool:
        """Whether the token Secret exists (metadata only). Where the operator is granted no Secrets the check is
        skipped, said once as a Warning: the kubelet then reports a missing Secret on the staging pod."""
        namespace = body["metadata"]["namespace"]
        try:
            return await self.api.exists(kubeapi.SECRET, namespace, name)
        except ApiError as exc:
            if exc.status != 403:
                raise
        if namespace not in self._unchecked_tokens:
            self._unchecked_tokens.add(namespace)
            message = permissions.secrets_refused(namespace, "checking spec.source.huggingFace.tokenSecretRef")
            self.events.warn(body, permissions.SECRETS_REFUSED, message)
            log.warning("%s/%s: %s", namespace, body["metadata"]["name"], message)
        return True

    async def _unlabel_all(self, namespace: str, name: str) -> None:
        label = node_label_key(namespace, name)
        unlabel = {"metadata": {"labels": {label: None}}}
        for node in await self.api.list(kubeapi.NODE, None, label):  # a bare key selects the nodes that carry it
            await self.api.merge_patch(kubeapi.NODE, None, node["metadata"]["name"], unlabel)

    async def _release(self, body: Mapping[str, Any]) -> CacheOutcome:
        meta = body["metadata"]
        rest = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        patch = {"metadata": {"finalizers": rest or None, "resourceVersion": meta.get("resourceVersion")}}
        await self.api.merge_patch(kubeapi.CACHE, meta["namespace"], meta["name"], patch)
        return CacheOutcome(gone=True)

    async def _write_status(
        self, body: Mapping[str, Any], fields: dict[str, Any], verdicts: list[Verdict]
    ) -> dict[str, Any] | None:
        meta = body["metadata"]
        current = dict(body.get("status") or {})
        generation = int(meta.get("generation") or 0)
        previous = current.get("conditions") or []
        now = self.clock()
        new = {
            "observedGeneration": generation,
            **fields,
            "conditions": [
                condition(previous, v.type, v.status, v.reason, v.message, generation, now) for v in verdicts
            ],
        }
        if all(current.get(k) == v for k, v in new.items()):
            return None
        return await self.api.merge_patch(kubeapi.CACHE, meta["namespace"], meta["name"], {"status": new}, "status")


class CacheManager:
    """The caches' work queue (the same design as the deployments' Manager, one key per cache)."""

    def __init__(self, reconciler: CacheReconciler, on_change: Callable[[str, str], None] | None = None) -> None:
        self.reconciler = reconciler
        self.on_change = on_change  # a cache's spec changed: the deployments naming it re-render
        self.queue: WorkQueue[Key] = WorkQueue(self._process, workers=4)
        self._bodies: dict[Key, dict[str, Any]] = {}
        self._failures: dict[Key, int] = {}
        self._nodes: dict[str, tuple[tuple[tuple[str, str], ...], bool]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.queue.run(), name="m3fleet cache queue")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def cache_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        if event_type == "DELETED":
            self._bodies.pop(key, None)
            self.queue.forget(key)
            self._others_look_again(key)
            if self.on_change is not None:
                self.on_change(*key)
            return
        self._observe(body)

    def _others_look_again(self, key: Key) -> None:
        """A cache came, went or changed its spec: a directory it held may be free, or one another stages taken."""
        for other in self._bodies:
            if other != key:
                self.queue.add(other)

    def _observe(self, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        old = self._bodies.get(key)
        if old is not None and not newer(body, old):
            return
        self._bodies[key] = copy.deepcopy(dict(body))
        if old is None or any(old["metadata"].get(k) != body["metadata"].get(k) for k in TRIGGERS):
            self.queue.add(key)
            self._others_look_again(key)
            if self.on_change is not None:
                self.on_change(*key)
        elif self.on_change is not None and _readiness(old) != _readiness(body):
            self.on_change(*key)  # the deployments that require its nodes say why their pods wait

    def child_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A Job or the DaemonSet of a cache changed."""
        name = ((body.get("metadata") or {}).get("labels") or {}).get(CACHE_LABEL)
        key = (body["metadata"].get("namespace", ""), name or "")
        if event_type is not None and key in self._bodies:
            self.queue.add(key)

    def node_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A node joined, left, or changed labels or schedulability: every cache looks at its pool again. Status
        heartbeats (most node events) change neither and are ignored."""
        name = body["metadata"]["name"]
        seen = (
            tuple(sorted((body["metadata"].get("labels") or {}).items())),
            bool((body.get("spec") or {}).get("unschedulable")),
        )
        if event_type == "DELETED":
            self._nodes.pop(name, None)
        elif self._nodes.get(name) == seen:
            return
        else:
            self._nodes[name] = seen
        for key in self._bodies:
            self.queue.add(key)

    def pod_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """An engine pod that mounted a node directory went: a cache of its namespace may have been waiting for it to
        empty that directory (the plan looks again every MOUNT_RECHECK_SECONDS too; this is sooner)."""
        meta = body.get("metadata") or {}
        if event_type != "DELETED" or CACHE_LABEL in (meta.get("labels") or {}):
            return
        if not any("hostPath" in v for v in (body.get("spec") or {}).get("volumes") or []):
            return
        for key in self._bodies:
            if key[0] == meta.get("namespace"):
                self.queue.add(key)

    def deployment_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A deployment naming a cache changed: its engine image may be one to pre-pull."""
        ref = (((body.get("spec") or {}).get("model") or {}).get("cacheRef") or {}).get("name")
        key = (body["metadata"].get("namespace", ""), str(ref or ""))
        if ref and key in self._bodies:
            self.queue.add(key)

    async def _process(self, key: Key) -> None:
        body = self._bodies.get(key)
        if body is None:
            return
        try:
            outcome = await self.reconciler.reconcile(body)
        except Exception as exc:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay = backoff(failures, exc.retry_after if isinstance(exc, ApiError) else None)
            if isinstance(exc, ApiError):
                log.warning("%s/%s: cache reconcile failed: %s; retrying in %.0f s", *key, exc, delay)
            else:
                log.exception("%s/%s: cache reconcile failed; retrying in %.0f s", *key, delay)
            self.queue.add(key, delay)
            return
        self._failures.pop(key, None)
        if outcome.gone:
            self._bodies.pop(key, None)
            return
        if outcome.status is not None:
            self._observe(outcome.status)
        if outcome.requeue_after is not None:
            self.queue.add(key, outcome.requeue_after)

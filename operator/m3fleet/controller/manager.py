"""The operator's one scheduler: what the watches deliver goes in, reconciles and autoscaler ticks come out.

kopf's handlers only hand events to the `Manager`; everything the operator does runs from its work queue,
one resource at a time:

* Resources are cached as the watch delivers them (and as our own status writes return them, never going
  back to an older resourceVersion), so a reconcile starts from the cache and reads no parent.
* A reconcile is due when a resource is first seen (so every resource reconciles when the operator starts),
  when its generation, labels, annotations or deletion change, and when one of its children is added,
  changed or deleted. Status-only changes (our own writes among them) are not a reason: no loops.
* A failed reconcile is retried after 1 s, doubling up to 60 s, or after the server's Retry-After if
  longer; any new event for the resource makes it due at once.
* A reconcile that is blocked by something no watch announces the end of (a child's name held by an object
  the operator does not control, and so does not watch) asks to be retried after a fixed delay.
* Resources whose spec has autoscaling enabled are ticked every `intervalSeconds`; the others are never
  looked at between events. There is no periodic resync: drift shows up as a child event.
* A time-to-ready measurement (time_to_ready_recorder.py) is due when a watched engine pod is ready and not yet counted
  in the resource's `status.timeToReady`, also for the pods kopf lists at start; at rest nothing is due.
* With peering, the queue stands still whenever kopf's peering would pause kopf, and whenever this peer does not
  hold the write Lease (see peering.py).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from m3fleet import kubeapi
from m3fleet.controller import metrics
from m3fleet.controller.autoscaler import Autoscaler, interval_of
from m3fleet.controller.decide import Understood, understand
from m3fleet.controller.peering import LeaseGate, PeeringGate
from m3fleet.controller.queue import WorkQueue
from m3fleet.controller.reconcile import Reconciler
from m3fleet.controller.time_to_ready_recorder import TimeToReadyRecorder, counted
from m3fleet.kubeapi import ApiError
from m3fleet.render.labels import NAME

Key = tuple[str, str]  # namespace, name
BACKOFF = (1.0, 60.0)  # first retry after a failure, and the longest wait
WORKERS = 8  # resources reconciled at once
# Metadata whose change makes a resource due for a reconcile (anything but status).
TRIGGERS = ("uid", "generation", "labels", "annotations", "deletionTimestamp")

log = logging.getLogger(__name__)


def key_of(body: Mapping[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]


def newer(body: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    """Whether `body` is a later version than `than` (resourceVersions compare as numbers when both are)."""
    new, old = (str(b["metadata"].get("resourceVersion") or "") for b in (body, than))
    if new.isdigit() and old.isdigit():
        return int(new) > int(old)
    return new != old


def worth_reconciling(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    if old is None:
        return True
    return any(old["metadata"].get(k) != new["metadata"].get(k) for k in TRIGGERS)


def controller_owner(child: Mapping[str, Any]) -> str | None:
    for ref in child.get("metadata", {}).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == kubeapi.M3D.kind
            and ref.get("apiVersion") == kubeapi.M3D.api_version
        ):
            name: str = ref["name"]
            return name
    return None


def backoff(failures: int, retry_after: float | None) -> float:
    first, longest = BACKOFF
    return max(min(longest, first * 2.0 ** max(0, failures - 1)), retry_after or 0.0)


@dataclass
class Work:
    """When a resource is next due for each kind of work (loop time; None: not due)."""

    reconcile_at: float | None = None
    tick_at: float | None = None
    ticked_at: float | None = None
    measure_at: float | None = None
    failures: int = 0


class Manager:
    def __init__(
        self, reconciler: Reconciler, autoscaler: Autoscaler, time_to_ready: TimeToReadyRecorder, workers: int = WORKERS
    ) -> None:
        self.reconciler = reconciler
        self.autoscaler = autoscaler
        self.time_to_ready = time_to_ready
        self._unmeasured: set[Key] = set()  # a ready pod not yet counted was seen before its resource
        self.queue: WorkQueue[Key] = WorkQueue(self._process, workers)
        self.gates: tuple[PeeringGate, LeaseGate] | None = None  # peering: who may run, and who may write
        self._bodies: dict[Key, dict[str, Any]] = {}
        self._understood: dict[Key, Understood] = {}  # each resource's spec, parsed and planned once per version
        self._seen: dict[str, str] = {}  # uid of a child or engine pod: the resourceVersion last delivered
        self._work: dict[Key, Work] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # -- what kopf hands over -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the queue (and the peering gates). Called from a kopf handler, so that the tasks inherit
        kopf's context, which posting Events (kopf.info) needs. Idempotent."""
        if self._tasks:
            return
        if self.gates is not None:
            self.queue.pause()  # until the gates have looked at the peering object and the Lease
            for gate in self.gates:
                self._tasks.append(asyncio.create_task(gate.run(), name=f"m3fleet {type(gate).__name__}"))
        self._tasks.append(asyncio.create_task(self.queue.run(), name="m3fleet work queue"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def resource_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        if event_type == "DELETED":
            self._drop(key_of(body))
        else:
            self._observe(body)

    def _news(self, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """Whether a child or pod event says something not seen yet. kopf lists (type None) when it starts and again
        after a watch was lost (410 Gone, a peering pause): a listed object is news only in a version not seen
        before, since the listing is then the only word of what changed meanwhile."""
        meta = body.get("metadata") or {}
        key, version = str(meta.get("uid")), str(meta.get("resourceVersion") or "")
        if event_type == "DELETED":
            self._seen.pop(key, None)
            return True
        seen, self._seen[key] = self._seen.get(key), version
        return event_type is not None or seen != version

    def child_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A child was added, changed or deleted (or listed in a version not seen before): its owner is due."""
        owner = controller_owner(body)
        if owner is None or not self._news(event_type, body):
            return
        key = (body["metadata"]["namespace"], owner)
        if key in self._bodies:
            self._reconcile_soon(key)

    def pod_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """An engine pod changed (scheduled, became ready, went away) or was listed in a version not seen before
        (`_news`): its resource is due; and a ready pod not yet counted makes a time-to-ready measurement due."""
        name = ((body.get("metadata") or {}).get("labels") or {}).get(NAME)
        if not name:
            return
        key = (body["metadata"]["namespace"], name)
        cached = self._bodies.get(key)
        if event_type != "DELETED" and not counted(cached or {}, body):
            if cached is None:
                self._unmeasured.add(key)
            else:
                self._work.setdefault(key, Work()).measure_at = self._now()
                self.queue.add(key)
        if self._news(event_type, body) and cached is not None:
            self._reconcile_soon(key)

    def cache_changed(self, namespace: str, cache: str) -> None:
        """A MiniMaxM3ModelCache appeared, changed or went away: the resources that name it render again."""
        for key, body in self._bodies.items():
            ref = (((body.get("spec") or {}).get("model") or {}).get("cacheRef") or {}).get("name")
            if key[0] == namespace and ref == cache:
                self._reconcile_soon(key)

    # -- the cache ----------------------------------------------------------------------------------

    def _observe(self, body: Mapping[str, Any], *, ours: bool = False) -> None:
        """Cache a version of a resource: from the watch, or as our own write returned it (`ours`: only while
        the resource is still known, so a write that raced its deletion does not bring it back)."""
        key = key_of(body)
        old = self._bodies.get(key)
        if (old is None and ours) or (old is not None and not newer(body, old)):
            return  # gone meanwhile, or a version we already have (our write's answer came first), or older
        self._bodies[key] = copy.deepcopy(dict(body))
        if old is None and key in self._unmeasured:
            self._unmeasured.discard(key)
            self._work.setdefault(key, Work()).measure_at = self._now()
        if worth_reconciling(old, body):
            self._reconcile_soon(key)

    def _drop(self, key: Key) -> None:
        self._bodies.pop(key, None)
        self._understood.pop(key, None)
        self._work.pop(key, None)
        self._unmeasured.discard(key)
        self.queue.forget(key)
        self.reconciler.forget(*key)
        self.autoscaler.forget(*key)
        metrics.forget(metrics.RESOURCE_SERIES, *key)

    def _understanding(self, key: Key) -> Understood:
        """The cached resource's spec parsed and planned: once per version of it (uid and generation), whatever
        the reconciles, ticks and measurements that read it, and the status writes between them."""
        body = self._bodies[key]
        understood = self._understood.get(key)
        if understood is None or not understood.of(body):
            understood = self._understood[key] = understand(body)
        return understood

    def _reconcile_soon(self, key: Key) -> None:
        self._work.setdefault(key, Work()).reconcile_at = self._now()
        self.queue.add(key)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    # -- the work -----------------------------------------------------------------------------------

    async def _process(self, key: Key) -> None:
        work = self._work.get(key)
        if work is None or key not in self._bodies:
            return
        now = self._now()
        if work.tick_at is not None and work.tick_at <= now:  # first: a new count is applied right after
            work.tick_at, work.ticked_at = None, now
            await self._tick(key, work)
        if work.reconcile_at is not None and work.reconcile_at <= now and key in self._bodies:
            work.reconcile_at = None
            await self._reconcile(key, work)
        if work.measure_at is not None and work.measure_at <= now and key in self._bodies:
            work.measure_at = None
            await self._measure(key, work)
        if key in self._bodies:
            self._schedule(key, work)

    async def _tick(self, key: Key, work: Work) -> None:
        try:
            tick = await self.autoscaler.tick(self._bodies[key], self._understanding(key))
        except Exception as exc:  # the next tick tries again; one failure must not stop the others
            log.warning("%s/%s: autoscaler tick failed: %s", *key, exc)
            return
        if tick.gone:
            self._drop(key)
            return
        if tick.status is not None:
            self._observe(tick.status, ours=True)
        if tick.scale:
            work.reconcile_at = self._now()

    async def _measure(self, key: Key, work: Work) -> None:
        try:
            written = await self.time_to_ready.measure(self._bodies[key], self._understanding(key))
        except Exception as exc:  # measured again later; a failure never blocks reconciles
            work.measure_at = self._now() + BACKOFF[1]
            log.warning("%s/%s: time-to-ready measurement failed (retrying in %.0f s): %s", *key, BACKOFF[1], exc)
            return
        if written is not None:
            self._observe(written, ours=True)

    async def _reconcile(self, key: Key, work: Work) -> None:
        try:
            outcome = await self.reconciler.reconcile(self._bodies[key], self._understanding(key))
        except Exception as exc:
            work.failures += 1
            delay = backoff(work.failures, exc.retry_after if isinstance(exc, ApiError) else None)
            if work.reconcile_at is None:  # an event that came meanwhile has made it due already
                work.reconcile_at = self._now() + delay
            metrics.RETRIES.inc()
            if isinstance(exc, ApiError):
                log.warning("%s/%s: %s; retrying in %.0f s", *key, exc, delay)
            else:  # a bug: say where
                log.exception("%s/%s: reconcile failed; retrying in %.0f s", *key, delay)
            return
        work.failures = 0
        if outcome.gone:
            self._drop(key)
            return
        if outcome.status is not None:
            self._observe(outcome.status, ours=True)
        if outcome.retry_after is not None and work.reconcile_at is None:  # e.g. a name held by a foreign object
            work.reconcile_at = self._now() + outcome.retry_after

    def _schedule(self, key: Key, work: Work) -> None:
        now = self._now()
        interval = interval_of(self._understanding(key))
        if interval is None:
            work.tick_at = work.ticked_at = None
            self.autoscaler.forget(*key)
        elif work.tick_at is None:
            work.tick_at = now if work.ticked_at is None else work.ticked_at + interval
        due = [t for t in (work.reconcile_at, work.tick_at, work.measure_at) if t is not None]
        if due:
            self.queue.add(key, min(due) - now)

"""Standby replicas: our scheduler pauses exactly when kopf pauses its own watchers and handlers.

kopf's peering pauses an operator while another live peer in the peering object has a higher priority,
or the same one (kopf/_core/engines/peering.py, process_peering_event). It pauses only what kopf runs:
our scheduler's retries and autoscaler ticks would go on writing. kopf exposes no pause state, and a kopf
handler on the peering object is paused along with everything else (it could miss the very event that
pauses it), so `PeeringGate` follows the peering object with a watch of its own and applies kopf's rule,
with the identity and priority the operator hands to `kopf.run`. Until the first look at the object the
gate stays closed: a standby that starts next to an active operator never writes.

kopf's peering cannot fence. A peer decides to pause only from the peering events it receives, and its
keep-alive is a blind patch: an active peer cut off from the apiserver receives nothing, so it never pauses;
its standby resumes once the silent peer's record expires, and when the cut-off peer comes back both are
active until the standby sees the returning keep-alive (the work each retries meanwhile lands then).
So writing takes a second key, `LeaseGate`: a coordination.k8s.io Lease, renewed as client-go's leader
election does. A peer writes only while kopf's rule lets it run *and* it holds the Lease; a holder that has
not renewed within `RENEW_SECONDS` stops writing before anyone else may take the Lease (`LEASE_SECONDS`),
and a peer that comes back finds the Lease held and stays paused until it can take it in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from m3fleet.controller import metrics
from m3fleet.kubeapi import CLUSTER_PEERING, LEASE, PEERING, ApiError, KubeApi

log = logging.getLogger(__name__)

LEASE_NAME = "m3fleet-leader"
LEASE_SECONDS = 15  # how long a holder's claim stands, unrenewed, before another peer may take the Lease
RENEW_SECONDS = 10  # a holder that has not renewed for this long stops writing (< LEASE_SECONDS: fenced first)
RETRY_SECONDS = 2.0  # how often the Lease is renewed, or looked at by a peer that wants it


@dataclass(frozen=True)
class Verdict:
    paused: bool
    blockers: tuple[str, ...] = ()  # the live peers we give way to
    recheck_in: float | None = None  # seconds until the first of them expires


def verdict(peering: Mapping[str, Any] | None, identity: str, priority: int, now: datetime) -> Verdict:
    """kopf's rule on one peering object: pause while a live peer other than us has a priority >= ours."""
    blockers: list[tuple[str, float]] = []
    for peer, info in ((peering or {}).get("status") or {}).items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        try:
            seen = info.get("lastseen")
            lastseen = now if seen is None else datetime.fromisoformat(str(seen))  # kopf: absent means now
            lifetime = float(info.get("lifetime", 60))
            rank = int(info.get("priority", 0))
        except (TypeError, ValueError):
            continue  # not a peer record kopf would understand either
        if lastseen.tzinfo is None:
            lastseen = lastseen.replace(tzinfo=UTC)
        left = (lastseen + timedelta(seconds=lifetime) - now).total_seconds()
        if left > 0 and rank >= priority:
            blockers.append((peer, left))
    if not blockers:
        return Verdict(paused=False)
    return Verdict(paused=True, blockers=tuple(sorted(p for p, _ in blockers)), recheck_in=min(t for _, t in blockers))


class PeeringGate:
    """Follows the peering object and calls `pause()`/`resume()` as kopf's rule says."""

    def __init__(
        self,
        api: KubeApi,
        *,
        name: str,
        namespace: str | None,
        identity: str,
        priority: int,
        pause: Callable[[], None],
        resume: Callable[[], None],
    ) -> None:
        self.api = api
        self.name = name
        self.namespace = namespace  # None: cluster-wide, a ClusterKopfPeering
        self.identity = identity
        self.priority = priority
        self._pause = pause
        self._resume = resume
        self._peering: Mapping[str, Any] | None = None
        self._recheck: asyncio.TimerHandle | None = None
        self.paused: bool | None = None

    async def run(self) -> None:
        self._set(Verdict(paused=True))
        kind = PEERING if self.namespace is not None else CLUSTER_PEERING
        try:
            async for peering in self.api.follow(kind, self.namespace, self.name):
                self._peering = peering
                self._evaluate()
        finally:
            if self._recheck is not None:
                self._recheck.cancel()

    def _evaluate(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        decided = verdict(self._peering, self.identity, self.priority, datetime.now(UTC))
        self._set(decided)
        if decided.recheck_in is not None:  # a silent peer expires without any event: look again then
            self._recheck = asyncio.get_running_loop().call_later(decided.recheck_in + 0.5, self._evaluate)

    def _set(self, decided: Verdict) -> None:
        if decided.paused == self.paused:
            return
        self.paused = decided.paused
        metrics.PAUSED.set(1 if decided.paused else 0)
        me = f"{self.identity} (priority {self.priority})"
        if decided.paused:
            blockers = ", ".join(decided.blockers)
            log.info("Standing by: %s", f"{blockers} take precedence over {me}" if blockers else "peering not read yet")
            self._pause()
        else:
            log.info("Active: no live peer takes precedence over %s", me)
            self._resume()


def micro_time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseGate:
    """Resumes the queues only while this peer holds the Lease, and pauses them once it may no longer be sure it
    does. `contend()` / `stand_down()` say whether kopf's peering rule lets this peer run at all."""

    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        identity: str,
        pause: Callable[[], None],
        resume: Callable[[], None],
        name: str = LEASE_NAME,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._pause = pause
        self._resume = resume
        self._wanted = False
        self._renewed: float | None = None  # monotonic time a successful renewal was sent
        self._observed: tuple[str, float] | None = None  # another holder's record, and when we first saw it
        self._wake = asyncio.Event()
        self._deadline: asyncio.TimerHandle | None = None
        self.leading = False

    def contend(self) -> None:
        self._wanted = True
        self._wake.set()

    def stand_down(self) -> None:
        self._wanted = False
        self._evaluate()
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                self._wake.clear()
                try:
                    if self._wanted:
                        await asyncio.wait_for(self._try(), RENEW_SECONDS / 2)
                    elif self._renewed is not None:
                        await asyncio.wait_for(self._release(), RENEW_SECONDS / 2)
                except (ApiError, TimeoutError) as exc:
                    log.warning("Lease %s/%s: %s", self.namespace, self.name, exc or "no answer in time")
                self._evaluate()
                with contextlib.suppress(TimeoutError):  # woken early by contend() / stand_down()
                    await asyncio.wait_for(self._wake.wait(), RETRY_SECONDS)
        finally:
            if self._deadline is not None:
                self._deadline.cancel()
            if self._renewed is not None:  # a clean stop (kopf withdraws its record too): the standby need not wait
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._release(), RETRY_SECONDS)

    async def _try(self) -> None:
        """Take the Lease if it is free, expired or ours; renew it if ours. Conditional on the resourceVersion
        read, so of two peers racing for it exactly one wins (the other gets 409)."""
        sent = time.monotonic()
        now = datetime.now(UTC)
        lease = await self.api.get(LEASE, self.namespace, self.name)
        if lease is None:
            await self.api.create(self._lease({}, now, transitions=0))
            self._renewed = sent
            return
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity:
            # Expiry is judged on our own clock from when we first saw this record, not on the holder's renewTime:
            # peers' clocks may differ (client-go does the same).
            record = f"{holder}/{spec.get('renewTime')}"
            if self._observed is None or self._observed[0] != record:
                self._observed = (record, sent)
            duration = float(spec.get("leaseDurationSeconds") or LEASE_SECONDS)
            if sent - self._observed[1] < duration:
                self._renewed = None  # held by a live peer
                return
        transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
        try:
            await self.api.replace(self._lease(lease, now, transitions))
        except ApiError as exc:
            if exc.status == 409:  # another peer renewed or took it meanwhile: look again next round
                return
            raise
        self._renewed = sent

    async def _release(self) -> None:
        """Paused by kopf's rule: give the Lease up at once, so that the peer kopf prefers takes it without
        waiting for it to expire."""
        lease = await self.api.get(LEASE, self.namespace, self.name)
        self._renewed = None
        if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
            lease["spec"]["holderIdentity"] = ""
            await self.api.replace(lease)

    def _lease(self, current: Mapping[str, Any], now: datetime, transitions: int) -> dict[str, Any]:
        spec = dict(current.get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = micro_time(now)
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=LEASE_SECONDS,
            renewTime=micro_time(now),
            leaseTransitions=transitions,
        )
        metadata = dict(current.get("metadata") or {"name": self.name, "namespace": self.namespace})
        return {"apiVersion": LEASE.api_version, "kind": LEASE.kind, "metadata": metadata, "spec": spec}

    def _evaluate(self) -> None:
        """Leading while wanted and renewed within RENEW_SECONDS; re-evaluated at that deadline, since a request
        that never returns (a partition) brings no news of its own."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        left = RENEW_SECONDS - (time.monotonic() - self._renewed) if self._renewed is not None else 0.0
        leading = self._wanted and left > 0
        if leading:
            self._deadline = asyncio.get_running_loop().call_later(left, self._evaluate)
        if leading == self.leading:
            return
        self.leading = leading
        if leading:
            log.info("Leading: holding Lease %s/%s as %s", self.namespace, self.name, self.identity)
            self._resume()
        else:
            why = "standing by" if not self._wanted else f"Lease not renewed for {RENEW_SECONDS} s: fenced"
            log.info("Not leading (%s): writes stop", why)
            self._pause()

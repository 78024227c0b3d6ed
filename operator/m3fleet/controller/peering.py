"""Standby replicas: our scheduler pauses exactly when kopf pauses its own watchers and handlers.

kopf's peering pauses an operator while another live peer in the peering object has a higher priority,
or the same one (kopf/_core/engines/peering.py, process_peering_event). It pauses only what kopf runs:
our scheduler's retries and autoscaler ticks would go on writing. kopf exposes no pause state, and a kopf
handler on the peering object is paused along with everything else (it could miss the very event that
pauses it), so `PeeringGate` follows the peering object with a watch of its own and applies kopf's rule,
with the identity and priority the operator hands to `kopf.run`. Until the first look at the object the
gate stays closed: a standby that starts next to an active operator never writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from m3fleet.controller import metrics
from m3fleet.controller.kube import CLUSTER_PEERING, PEERING, KubeApi

log = logging.getLogger("m3fleet.peering")


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

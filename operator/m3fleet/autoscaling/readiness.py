"""Time-to-ready measured from the pods themselves: the scaling horizon. Pure: pods in, numbers out.

A new replica passes three phases, each visible in the pod's own status:

* `schedule` — created -> `PodScheduled` (a GPU node found, or provisioned by a node autoscaler);
* `pull` — scheduled -> the serving container started (image pulled, container created);
* `load` — started -> `Ready` (weights loaded, engine warmed up, readiness probe passed).

`measure(pods, now)` returns the p90 of each phase and of the whole over the most recent replicas
that became ready, and, for each pod still starting, how long it still needs given the phase it is
in (a pod whose image is already pulled only has its load left). The operator feeds the result to
`FleetState(time_to_ready_seconds=..., starting_ages=..., starting_remaining=...)`; with nothing
measured yet the spec's `coldStartSeconds` stands in.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from m3fleet.autoscaling.signals import quantile

PHASES = ("schedule", "pull", "load")
SAMPLES = 10  # the most recent replicas that became ready


def _epoch(timestamp: Any) -> float | None:
    if not isinstance(timestamp, str) or not timestamp:
        return None
    try:
        return float(calendar.timegm(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


@dataclass(frozen=True)
class PodTimeline:
    """When one pod passed each milestone (Unix seconds; None = not yet)."""

    name: str
    created: float
    scheduled: float | None = None
    started: float | None = None
    ready: float | None = None

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodTimeline | None:
        """From a pod's JSON (metadata + status); None for a pod without a creation time or being deleted."""
        meta = pod.get("metadata") or {}
        created = _epoch(meta.get("creationTimestamp"))
        if created is None or meta.get("deletionTimestamp"):
            return None
        status = pod.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}

        def when(kind: str) -> float | None:
            c = conditions.get(kind)
            return _epoch(c.get("lastTransitionTime")) if c and c.get("status") == "True" else None

        starts = [
            _epoch(((s.get("state") or {}).get("running") or {}).get("startedAt"))
            for s in status.get("containerStatuses") or []
            if isinstance(s, Mapping)
        ]
        started = max((s for s in starts if s is not None), default=None)
        return cls(
            name=str(meta.get("name", "")),
            created=created,
            scheduled=when("PodScheduled"),
            started=started,
            ready=when("Ready"),
        )

    def phases(self) -> dict[str, float] | None:
        """Seconds in each phase, for a pod that became ready (clock skew clamped at 0)."""
        if self.ready is None or self.ready < self.created:
            return None
        scheduled = self.scheduled if self.scheduled is not None else self.created
        started = self.started if self.started is not None else scheduled
        scheduled = min(max(scheduled, self.created), self.ready)
        started = min(max(started, scheduled), self.ready)
        return {"schedule": scheduled - self.created, "pull": started - scheduled, "load": self.ready - started}


@dataclass(frozen=True)
class TimeToReady:
    """Measured p90s (None until a replica has become ready) and each starting pod's remaining time."""

    total_seconds: float | None
    phase_seconds: dict[str, float]
    samples: int
    starting_ages: tuple[float, ...]
    starting_remaining: tuple[float, ...]

    def to_status(self) -> dict[str, Any]:
        return {
            "measuredSeconds": None if self.total_seconds is None else round(self.total_seconds, 1),
            "phases": {k: round(v, 1) for k, v in self.phase_seconds.items()},
            "samples": self.samples,
        }


def measure(pods: Sequence[Mapping[str, Any]], now: float, default_seconds: float) -> TimeToReady:
    """Time-to-ready from serving pods (one per replica: the leader of a multi-node group)."""
    timelines = [t for t in (PodTimeline.from_pod(p) for p in pods) if t is not None]
    done = sorted((t for t in timelines if t.phases() is not None), key=lambda t: t.ready or 0.0)[-SAMPLES:]
    phases = [t.phases() or {} for t in done]
    total = quantile([sum(p.values()) for p in phases], 0.9) if phases else None
    per_phase = {k: quantile([p[k] for p in phases], 0.9) for k in PHASES} if phases else {}
    whole = total if total is not None else default_seconds
    ages: list[float] = []
    remaining: list[float] = []
    for t in sorted((t for t in timelines if t.ready is None), key=lambda t: t.created):
        ages.append(max(0.0, now - t.created))
        if per_phase and t.started is not None:
            left = per_phase["load"] - (now - t.started)
        elif per_phase and t.scheduled is not None:
            left = per_phase["pull"] + per_phase["load"] - (now - t.scheduled)
        else:
            left = whole - (now - t.created)
        remaining.append(max(0.0, left))
    return TimeToReady(
        total_seconds=total,
        phase_seconds=per_phase,
        samples=len(done),
        starting_ages=tuple(ages),
        starting_remaining=tuple(remaining),
    )

"""Time-to-ready measured from the pods themselves: the scaling horizon. Pure: pods and events in, numbers out.

A new replica (a pod; for a multi-node LeaderWorkerSet replica, its group: the leader and every worker)
passes four phases, each read from what the API server holds about its pods:

* `schedule` — pod created -> `PodScheduled` True (a GPU node found, or provisioned by a node autoscaler);
* `image` — scheduled -> the kubelet has the engine image: the first `Pulled` event of the pod's
  containers (posted when a pull finished, or at once with "already present on machine"). It includes
  the pod sandbox and volume mounts. Events expire (an hour by default) and some kubelets (kwok) post
  none: then the image phase is unknown (None) and its time counts in `start`;
* `start` — image ready (or scheduled, when unknown) -> the serving containers started (their first
  `startedAt`: a container that crashed and restarted counts from its first start, kept in `lastState`);
* `load` — started -> `Ready` (weights read, engine initialised and warmed up, readiness probe passed;
  a crash before ready and its restart count here).

A group passes a milestone when its last pod does; it is created when its first pod is. The whole
(`seconds`) is created -> ready, the sum of the phases. The image pull itself, when the event says
("Successfully pulled image ... in 1m2.5s"), is kept as `pullSeconds` (0 when the image was present).

`record(previous, pods, events, group_size)` measures every replica that became ready and is not yet in
`previous` (the last WINDOW replicas, as `status.timeToReady` keeps them), so a restarted operator counts
each replica once: a replica is new when its id is not in the window and it became ready no earlier than
the window's oldest (anything older has been counted, or would drop out at once). `Record.p90_seconds` —
the p90 of the last WINDOW replicas — is the autoscaler's time-to-ready (see `Record.horizon_seconds`);
`starting(pods, record, ...)` says, for each replica still starting, how long it has been starting and
how long it still needs given the phase it is in. With nothing measured the spec's `coldStartSeconds`
stands in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from m3fleet.autoscaling.signals import FleetState, quantile

PHASES = ("schedule", "image", "start", "load")
WINDOW = 10  # the most recent replicas that became ready: the statistics' sample
HORIZON_QUANTILE = 0.9
GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"  # on every pod of one LeaderWorkerSet group
ROLE = "m3fleet.dev/role"
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_GO_DURATION_AT_START = re.compile(r"(?:\d+(?:\.\d+)?(?:h|ms|m|s|us|µs|ns))+")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def epoch(timestamp: Any) -> float | None:
    """Unix seconds of an RFC 3339 timestamp as the API server writes them (fraction optional)."""
    if not isinstance(timestamp, str) or not timestamp:
        return None
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def go_duration(text: str) -> float | None:
    """Seconds of the Go duration `text` starts with, such as 1m2.345s or 850ms; None when there is none."""
    match = _GO_DURATION_AT_START.match(text.strip())
    if match is None:
        return None
    return sum(float(n) * _UNIT[u] for n, u in _GO_DURATION.findall(match.group(0)))


@dataclass(frozen=True)
class ImageEvent:
    """What the kubelet's first `Pulled` event for a container says."""

    time: float
    present: bool  # "already present on machine": nothing was pulled
    pull_seconds: float | None  # the pull's own duration, from the message


def image_events(events: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], ImageEvent]:
    """(pod uid, container name) -> its first `Pulled` event (core/v1 Events as the kubelet posts them)."""
    found: dict[tuple[str, str], ImageEvent] = {}
    for event in events:
        if event.get("reason") != "Pulled":
            continue
        involved = event.get("involvedObject") or {}
        path = str(involved.get("fieldPath") or "")
        if involved.get("kind") != "Pod" or not path.startswith("spec.containers{"):
            continue
        when = epoch(event.get("firstTimestamp")) or epoch(event.get("eventTime")) or epoch(event.get("lastTimestamp"))
        if when is None:
            continue
        message = str(event.get("message") or "")
        present = "already present" in message
        pulled = None if present else go_duration(message.split(" in ", 1)[1]) if " in " in message else None
        key = (str(involved.get("uid") or ""), path[len("spec.containers{") : -1])
        if key not in found or when < found[key].time:
            found[key] = ImageEvent(when, present, 0.0 if present else pulled)
    return found


@dataclass(frozen=True)
class PodTimeline:
    """When one pod passed each milestone (Unix seconds; None = not yet, or not known)."""

    name: str
    uid: str
    created: float
    scheduled: float | None = None
    image: float | None = None
    started: float | None = None
    ready: float | None = None
    restarts: int = 0
    image_present: bool | None = None
    pull_seconds: float | None = None
    group: str = ""  # LeaderWorkerSet group key ("" for a single-pod replica)
    leader: bool = True

    @classmethod
    def from_pod(
        cls, pod: Mapping[str, Any], images: Mapping[tuple[str, str], ImageEvent] | None = None
    ) -> PodTimeline | None:
        """From a pod's JSON (metadata, spec, status) and the image events; None for a pod without a creation
        time or being deleted."""
        meta = pod.get("metadata") or {}
        created = epoch(meta.get("creationTimestamp"))
        if created is None or meta.get("deletionTimestamp"):
            return None
        uid = str(meta.get("uid") or "")
        status = pod.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}

        def when(kind: str) -> float | None:
            c = conditions.get(kind)
            return epoch(c.get("lastTransitionTime")) if c and c.get("status") == "True" else None

        names = [str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, Mapping)]
        statuses = {str(s.get("name")): s for s in status.get("containerStatuses") or [] if isinstance(s, Mapping)}
        names = names or list(statuses)
        firsts: list[float | None] = []
        restarts = 0
        for name in names:
            s = statuses.get(name) or {}
            restarts += int(s.get("restartCount") or 0)
            starts = [
                epoch(((s.get(part) or {}).get(state) or {}).get("startedAt"))
                for part in ("state", "lastState")
                for state in ("running", "terminated")
            ]
            firsts.append(min((t for t in starts if t is not None), default=None))
        started = None if not firsts or None in firsts else max(t for t in firsts if t is not None)
        seen = [images.get((uid, n)) for n in names] if images else []
        known = [e for e in seen if e is not None]
        complete = bool(names) and len(known) == len(names)
        labels = meta.get("labels") or {}
        return cls(
            name=str(meta.get("name", "")),
            uid=uid,
            created=created,
            scheduled=when("PodScheduled"),
            image=max(e.time for e in known) if complete else None,
            started=started,
            ready=when("Ready"),
            restarts=restarts,
            image_present=all(e.present for e in known) if complete else None,
            pull_seconds=(
                sum(e.pull_seconds for e in known if e.pull_seconds is not None)
                if complete and all(e.pull_seconds is not None for e in known)
                else None
            ),
            group=str(labels.get(GROUP_KEY) or ""),
            leader=labels.get(ROLE) != "worker",
        )


@dataclass(frozen=True)
class Replica:
    """One replica's timeline: a pod, or a LeaderWorkerSet group (a milestone is passed when its last pod
    passes it; created when its first pod was). `complete`: every pod of the group exists."""

    id: str  # the leader pod's uid (a re-created group is a new replica)
    name: str  # the leader pod's name
    uids: tuple[str, ...]
    created: float
    scheduled: float | None
    image: float | None
    started: float | None
    ready: float | None
    restarts: int
    image_present: bool | None
    pull_seconds: float | None
    complete: bool

    @classmethod
    def of(cls, members: Sequence[PodTimeline], group_size: int) -> Replica:
        leader = next((m for m in members if m.leader), members[0])

        def last(values: Iterable[float | None]) -> float | None:
            seen = list(values)
            return None if not seen or None in seen else max(v for v in seen if v is not None)

        presents = [m.image_present for m in members]
        pulls = [m.pull_seconds for m in members]
        return cls(
            id=leader.uid,
            name=leader.name,
            uids=tuple(sorted(m.uid for m in members)),
            created=min(m.created for m in members),
            scheduled=last(m.scheduled for m in members),
            image=last(m.image for m in members),
            started=last(m.started for m in members),
            ready=last(m.ready for m in members),
            restarts=sum(m.restarts for m in members),
            image_present=None if None in presents else all(presents),
            pull_seconds=None if None in pulls else max(p for p in pulls if p is not None),
            complete=len(members) >= group_size,
        )

    @property
    def is_ready(self) -> bool:
        return self.complete and self.ready is not None

    def phases(self) -> dict[str, float | None] | None:
        """Seconds in each phase, for a replica that became ready (milestones clamped into order, so clock
        skew between nodes never makes a phase negative); `image` None when no event told."""
        if not self.is_ready or self.ready is None or self.ready < self.created:
            return None
        ready = self.ready
        scheduled = min(max(self.scheduled if self.scheduled is not None else self.created, self.created), ready)
        image = None if self.image is None else min(max(self.image, scheduled), ready)
        started = min(
            max(self.started if self.started is not None else (image or scheduled), image or scheduled), ready
        )
        return {
            "schedule": scheduled - self.created,
            "image": None if image is None else image - scheduled,
            "start": started - (scheduled if image is None else image),
            "load": ready - started,
        }


def replicas(
    pods: Sequence[Mapping[str, Any]], events: Iterable[Mapping[str, Any]] = (), group_size: int = 1
) -> list[Replica]:
    """The pods grouped into replicas: each pod alone, or by LeaderWorkerSet group (a group re-created
    under the same key is a new replica: its leader is new)."""
    images = image_events(events)
    timelines = [t for t in (PodTimeline.from_pod(p, images) for p in pods) if t is not None]
    groups: dict[str, list[PodTimeline]] = {}
    for index, t in enumerate(timelines):
        groups.setdefault(t.group or t.uid or f"#{index}", []).append(t)
    return [Replica.of(members, group_size if members[0].group else 1) for members in groups.values()]


@dataclass(frozen=True)
class Sample:
    """One measured replica, as `status.timeToReady.recent` keeps it."""

    id: str
    replica: str
    uids: tuple[str, ...]
    ready_at: float
    seconds: float
    phases: dict[str, float | None]
    restarts: int = 0
    image_present: bool | None = None
    pull_seconds: float | None = None

    def to_status(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "id": self.id,
            "uids": list(self.uids),
            "readyAt": rfc3339(self.ready_at),
            "seconds": round(self.seconds, 1),
            "phases": {k: round(v, 1) for k, v in self.phases.items() if v is not None},  # unknown: left out
            "restarts": self.restarts,
            "imagePresent": self.image_present,
            "pullSeconds": None if self.pull_seconds is None else round(self.pull_seconds, 1),
        }

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> Sample | None:
        try:
            ready_at = epoch(data.get("readyAt"))
            if ready_at is None:
                return None
            phases = data.get("phases") or {}
            pull = data.get("pullSeconds")
            return cls(
                id=str(data["id"]),
                replica=str(data.get("replica") or ""),
                uids=tuple(str(u) for u in data.get("uids") or ()),
                ready_at=ready_at,
                seconds=float(data["seconds"]),
                phases={k: None if phases.get(k) is None else float(phases[k]) for k in PHASES},
                restarts=int(data.get("restarts") or 0),
                image_present=data.get("imagePresent"),
                pull_seconds=None if pull is None else float(pull),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Record:
    """The last WINDOW measured replicas (oldest first) and how many were ever measured."""

    recent: tuple[Sample, ...] = ()
    measured: int = 0

    @classmethod
    def from_status(cls, data: Mapping[str, Any] | None) -> Record:
        data = data or {}
        samples = [s for s in (Sample.from_status(d) for d in data.get("recent") or [] if isinstance(d, Mapping)) if s]
        try:
            measured = int(data.get("replicasMeasured") or 0)
        except (TypeError, ValueError):
            measured = 0
        return cls(tuple(sorted(samples, key=lambda s: s.ready_at)[-WINDOW:]), max(measured, len(samples)))

    def knows(self, uid: str) -> bool:
        """Whether the pod with this uid belongs to a replica already measured (and still in the window)."""
        return any(uid in s.uids or uid == s.id for s in self.recent)

    def is_new(self, replica: Replica) -> bool:
        if not replica.is_ready or any(s.id == replica.id for s in self.recent):
            return False
        full = len(self.recent) >= WINDOW
        return not full or (replica.ready or 0.0) >= self.recent[0].ready_at

    def quantile(self, q: float, phase: str | None = None) -> float | None:
        values = [s.seconds if phase is None else s.phases.get(phase) for s in self.recent]
        known = [v for v in values if v is not None]
        return quantile(known, q) if known else None

    @property
    def p90_seconds(self) -> float | None:
        return self.quantile(HORIZON_QUANTILE)

    def horizon_seconds(self, prior: float) -> tuple[float, str]:
        """The time-to-ready the autoscaler plans with, and where it comes from."""
        measured = self.p90_seconds
        if measured is None:
            return prior, "prior: spec.autoscaling.coldStartSeconds (no replica measured yet)"
        return measured, f"measured: p90 of the last {len(self.recent)} replicas to become ready"

    def to_status(self) -> dict[str, Any]:
        """`status.timeToReady`."""
        if not self.recent:
            return {"replicasMeasured": self.measured, "samples": 0, "recent": []}
        # Every phase is present; one no replica in the window knows has 0 samples and null figures (so that a
        # merge patch also clears figures written before).
        unknown = {"p50Seconds": None, "p90Seconds": None, "lastSeconds": None, "samples": 0}
        phases: dict[str, Any] = {phase: dict(unknown) for phase in PHASES}
        for phase in PHASES:
            known = [s.phases.get(phase) for s in self.recent if s.phases.get(phase) is not None]
            if known:
                phases[phase] = {
                    "p50Seconds": _round(self.quantile(0.5, phase)),
                    "p90Seconds": _round(self.quantile(0.9, phase)),
                    "lastSeconds": _round(self.recent[-1].phases.get(phase)),
                    "samples": len(known),
                }
        return {
            "replicasMeasured": self.measured,
            "samples": len(self.recent),
            "lastSeconds": _round(self.recent[-1].seconds),
            "p50Seconds": _round(self.quantile(0.5)),
            "p90Seconds": _round(self.quantile(0.9)),
            "lastReplica": self.recent[-1].replica,
            "phases": phases,
            "recent": [s.to_status() for s in self.recent],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


@dataclass(frozen=True)
class Measured:
    """What `record` found: the record to keep and the replicas measured now (for the histograms)."""

    record: Record
    new: tuple[Sample, ...] = field(default_factory=tuple)


def unmeasured(pods: Sequence[Mapping[str, Any]], previous: Record, group_size: int = 1) -> list[Replica]:
    """Replicas that became ready and are not yet counted (events are not needed to tell)."""
    return [r for r in replicas(pods, (), group_size) if previous.is_new(r)]


def record(
    previous: Record,
    pods: Sequence[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]] = (),
    group_size: int = 1,
) -> Measured:
    """Measure every replica that became ready since `previous`; each exactly once."""
    new: list[Sample] = []
    for replica in replicas(pods, events, group_size):
        phases = replica.phases()
        if phases is None or replica.ready is None or not previous.is_new(replica):
            continue
        new.append(
            Sample(
                id=replica.id,
                replica=replica.name,
                uids=replica.uids,
                ready_at=replica.ready,
                seconds=replica.ready - replica.created,
                phases=phases,
                restarts=replica.restarts,
                image_present=replica.image_present,
                pull_seconds=replica.pull_seconds,
            )
        )
    if not new:
        return Measured(previous)
    merged = sorted((*previous.recent, *new), key=lambda s: s.ready_at)[-WINDOW:]
    return Measured(Record(tuple(merged), previous.measured + len(new)), tuple(sorted(new, key=lambda s: s.ready_at)))


def starting(
    pods: Sequence[Mapping[str, Any]], previous: Record, now: float, default_seconds: float, group_size: int = 1
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(ages, remaining seconds) of each replica still starting, youngest first: the remaining time from the
    p90 of the phases still ahead of it (a replica whose containers started only has its load left); the
    whole time-to-ready less its age before anything is measured."""
    whole = previous.p90_seconds if previous.p90_seconds is not None else default_seconds

    def ahead(*phases: str) -> float | None:
        values = [previous.quantile(HORIZON_QUANTILE, p) for p in phases]
        return None if None in values else sum(v for v in values if v is not None)

    pending = sorted((r for r in replicas(pods, (), group_size) if not r.is_ready), key=lambda r: -r.created)
    ages: list[float] = []
    remaining: list[float] = []
    for r in pending:
        ages.append(max(0.0, now - r.created))
        load, start_load = ahead("load"), ahead("start", "load")
        if load is not None and r.started is not None:
            left = load - (now - r.started)
        elif start_load is not None and r.scheduled is not None:
            image = previous.quantile(HORIZON_QUANTILE, "image") or 0.0
            left = image + start_load - (now - r.scheduled)
        else:
            left = whole - (now - r.created)
        remaining.append(max(0.0, left))
    return tuple(ages), tuple(remaining)


def fleet_from(
    workload: Mapping[str, Any],
    pods: list[dict[str, Any]],
    now: float,
    measured: Mapping[str, Any] | None = None,
    group_size: int = 1,
    prior_seconds: float = 600.0,
) -> FleetState:
    """Replicas from the workload; each starting replica's age and remaining time from its pods' phases; the
    measured time-to-ready from `measured` (`status.timeToReady`) and the pods that became ready since."""
    spec_replicas = int((workload.get("spec") or {}).get("replicas") or 0)
    ready = int((workload.get("status") or {}).get("readyReplicas") or 0)
    measurements = record(Record.from_status(measured), pods, (), group_size).record
    ages, remaining = starting(pods, measurements, now, prior_seconds, group_size)
    keep = max(0, spec_replicas - ready)
    return FleetState(
        now=now,
        current_replicas=spec_replicas,
        ready_replicas=ready,
        starting_ages=ages[:keep],
        time_to_ready_seconds=measurements.p90_seconds,
        starting_remaining=remaining[:keep],
    )

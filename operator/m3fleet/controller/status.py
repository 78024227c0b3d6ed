"""Status in Kubernetes conventions, computed from what the children report. Pure: `now` is an input.

Condition types (metav1.Condition, a map list keyed by `type`):

* `Ready` — every replica of the current generation is ready (the summary `kubectl wait` uses).
  Reasons: AllReplicasReady, ScaledToZero, RolloutInProgress, Unschedulable (pods wait for a node: the
  message carries the scheduler's reason, and the Ready condition of a model cache whose nodes they require
  when it is not Ready), InvalidSpec, LeaderWorkerSetNotInstalled,
  ComputeDomainNotInstalled, ApplyFailed, NameConflict.
* `Available` — at least one replica serves. Reasons: MinimumReplicasAvailable; when False, NoReplicasReady,
  or ScaledToZero (none asked for, none serving).
* `Progressing` — a rollout or scale is under way. Reasons: RolloutInProgress, RolloutComplete, plus the
  blocking reasons above (False: nothing progresses until the spec or cluster is fixed).
* `Degraded` — negative polarity: True when the operator cannot do what the spec asks. Reasons:
  AsExpected, InvalidSpec, LeaderWorkerSetNotInstalled, ComputeDomainNotInstalled, ApplyFailed, NameConflict
  (an object the resource does not control holds a child's name; see m3fleet.render.ownership).

`lastTransitionTime` changes only when a condition's status flips, so a re-computed identical status
compares equal and the operator writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from m3fleet.api.models import ModelCacheRef
from m3fleet.engines.base import CacheMount

READY, AVAILABLE, PROGRESSING, DEGRADED = "Ready", "Available", "Progressing", "Degraded"
CONDITION_ORDER = (READY, AVAILABLE, PROGRESSING, DEGRADED)


@dataclass(frozen=True)
class Workload:
    """What the workload child (Deployment or LeaderWorkerSet) reports."""

    desired: int
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    observed_current: bool = False  # the child's controller has seen its latest spec
    unschedulable: str | None = None  # why pods wait for a node, when some do (the scheduler's own words)

    @classmethod
    def from_live(cls, desired: int, live: dict[str, Any] | None) -> Workload:
        if live is None:
            return cls(desired)
        status = live.get("status") or {}
        generation = (live.get("metadata") or {}).get("generation")
        observed = status.get("observedGeneration")
        # LeaderWorkerSet reports observedGeneration from v0.9 only; before, updated/ready counts alone decide.
        current = observed is None or generation is None or observed >= generation
        return cls(
            desired=desired,
            replicas=int(status.get("replicas") or 0),
            ready=int(status.get("readyReplicas") or 0),
            updated=int(status.get("updatedReplicas") or 0),
            observed_current=current and "status" in live,
        )

    def with_pods(self, pods: list[dict[str, Any]], hint: str | None = None) -> Workload:
        """Why pods wait for a node, if some do, with `hint` (what else may keep them: a model cache not ready)."""
        waiting = unschedulable(pods)
        return dataclasses.replace(self, unschedulable=f"{waiting}; {hint}" if waiting and hint else waiting)

    @property
    def all_ready(self) -> bool:
        return (
            self.observed_current
            and self.ready == self.desired
            and self.updated == self.desired
            and self.replicas == self.desired
        )


def unschedulable(pods: list[dict[str, Any]]) -> str | None:
    """ "N of M pods cannot be scheduled: <the scheduler's message>" when some pod is Pending because no node
    fits (PodScheduled=False, reason Unschedulable), else None. The scheduler's message says which nodes
    failed which check, e.g. "0/15 nodes are available: 15 node(s) didn't match Pod's node affinity/selector"."""
    waiting: list[str] = []
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if (
                cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                waiting.append(str(cond.get("message") or "no node fits"))
    if not waiting:
        return None
    return f"{len(waiting)} of {len(pods)} pods cannot be scheduled: {waiting[0]}"


def cache_not_ready(cache: Mapping[str, Any] | None) -> str | None:
    """A model cache the pods require the nodes of, when it is not Ready: its own words (None: it is, or none)."""
    if cache is None:
        return None
    conditions = (cache.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    name = cache["metadata"]["name"]
    if ready is None:
        return f"model cache {name} has not reported a Ready condition yet"
    if ready.get("status") == "True":
        return None
    return f"model cache {name} is not Ready ({ready.get('reason')}: {ready.get('message')})"


@dataclass(frozen=True)
class Blocked:
    """Why the operator stopped before touching children (children are left exactly as they were)."""

    reason: str
    message: str


def condition(
    previous: list[dict[str, Any]], type_: str, status: str, reason: str, message: str, generation: int, now: str
) -> dict[str, Any]:
    old = next((c for c in previous if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status and "lastTransitionTime" in old else now
    return {
        "type": type_,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": since,
        "reason": reason,
        "message": message[:32768],
    }


def conditions(
    previous: list[dict[str, Any]],
    generation: int,
    now: str,
    workload: Workload,
    blocked: Blocked | None,
) -> list[dict[str, Any]]:
    def c(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return condition(previous, type_, "True" if ok else "False", reason, message, generation, now)

    # Available means something answers requests: never with no ready replica, even when none is asked for.
    serving = workload.ready >= 1
    available = c(
        AVAILABLE,
        serving,
        "MinimumReplicasAvailable" if serving else "ScaledToZero" if workload.desired == 0 else "NoReplicasReady",
        f"{workload.ready} of {workload.desired} replicas ready",
    )
    if blocked is not None:
        return [
            c(READY, False, blocked.reason, blocked.message),
            available,
            c(PROGRESSING, False, blocked.reason, "nothing is applied until this is fixed; running children are kept"),
            c(DEGRADED, True, blocked.reason, blocked.message),
        ]
    if workload.desired == 0 and workload.all_ready:  # the scale-down to zero is complete
        ready = c(READY, True, "ScaledToZero", "0 replicas requested")
    elif workload.all_ready:
        ready = c(READY, True, "AllReplicasReady", f"all {workload.desired} replicas ready")
    elif workload.unschedulable:
        ready = c(
            READY,
            False,
            "Unschedulable",
            f"{workload.ready} of {workload.desired} replicas ready; {workload.unschedulable}",
        )
    else:
        ready = c(
            READY,
            False,
            "RolloutInProgress",
            f"{workload.ready} of {workload.desired} replicas ready, {workload.updated} updated",
        )
    progressing = ready["status"] != "True"
    return [
        ready,
        available,
        c(
            PROGRESSING,
            progressing,
            "RolloutInProgress" if progressing else "RolloutComplete",
            ready["message"],
        ),
        c(DEGRADED, False, "AsExpected", "the spec is valid and applied"),
    ]


def status_update(
    body: Mapping[str, Any],
    now: str,
    workload: Workload,
    blocked: Blocked | None,
    plan: dict[str, Any] | None,
    selector: str,
    secrets: list[str] | None,
    model_cache: dict[str, Any] | None = None,
    autoscaling: bool | None = None,
) -> dict[str, Any] | None:
    """The status a reconcile reports, or None when the resource's status says all of it already (no write).
    `plan` None keeps the last plan (an invalid spec has none); `secrets` None (blocked) keeps the record of
    generated Secrets and of the model cache as they are; `model_cache` None otherwise removes the record.
    `autoscaling` False (the spec turned it off) removes `status.autoscaling`: its last decision must not be
    applied, nor its state resumed, when autoscaling is turned on again (None keeps it)."""
    current = dict(body.get("status") or {})
    generation = int(body["metadata"].get("generation") or 0)
    new = {
        "observedGeneration": generation,
        "conditions": conditions(current.get("conditions") or [], generation, now, workload, blocked),
        "plan": plan if plan is not None else current.get("plan"),
        "replicas": workload.replicas,
        "readyReplicas": workload.ready,
        "selector": selector,
    }
    if secrets is not None and (secrets or current.get("generatedSecrets")):
        new["generatedSecrets"] = secrets
    if secrets is not None and (model_cache is not None or current.get("modelCache") is not None):
        new["modelCache"] = model_cache  # which MiniMaxM3ModelCache the pods mount
    if autoscaling is False and current.get("autoscaling") is not None:
        new["autoscaling"] = None  # a merge patch removes it
    return None if all(current.get(k) == v for k, v in new.items()) else new


def model_cache_record(cache_ref: ModelCacheRef | None, mount: CacheMount | None) -> dict[str, Any] | None:
    """`status.modelCache`: which MiniMaxM3ModelCache the pods mount, how they are placed, and where (None: none)."""
    if mount is None or cache_ref is None:
        return None
    return {
        "name": mount.name,
        "nodeAffinity": cache_ref.node_affinity,
        "nodeLabel": f"{mount.node_label}=ready",
        "path": mount.path,
    }

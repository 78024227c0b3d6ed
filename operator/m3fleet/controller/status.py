"""Status in Kubernetes conventions, computed from what the children report. Pure: `now` is an input.

Condition types (metav1.Condition, a map list keyed by `type`): Ready, Available, Progressing, Degraded. Their
reasons, what each means and the status each comes with are the catalogue in m3fleet.api.conditions (the CRD's
description and docs/reference/ are written from it); only its names are emitted here. A crash is kept between
restarts (see `crash_seen_last`), so a crash-looping fleet does not flap between Degraded and healthy.

`lastTransitionTime` changes only when a condition's status flips, so a re-computed identical status
compares equal and the operator writes nothing.

About 600 lines: the conditions and the pod diagnosis they are computed from (unschedulable, gated, failing pods,
FailedCreate events). The next seam is that diagnosis (`unschedulable` through `create_failure`) into a module of its
own, left for a change of its own: ten modules and tests import these names from here.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from m3fleet.api.conditions import (
    AVAILABLE,
    CONTAINER_CONFIG_REASONS,
    DEGRADED,
    FALSE,
    GATEWAY_READY,
    IMAGE_PULL_REASONS,
    PROGRESSING,
    READY,
    TRUE,
    ConditionStatus,
    DeploymentReason,
    Reason,
)
from m3fleet.api.models import ModelCacheRef
from m3fleet.engines.base import CacheMount

CONDITION_ORDER = (READY, AVAILABLE, PROGRESSING, DEGRADED)
# Why engine pods fail (see the catalogue): the kubelet's words and the workload controller's Event reason.
CRASH_LOOP, OOM_KILLED = DeploymentReason.CRASH_LOOP_BACK_OFF, DeploymentReason.OOM_KILLED
FAILED_CREATE = DeploymentReason.FAILED_CREATE
FAILED_CREATE_RECENT_SECONDS = 15 * 60  # a FailedCreate event older than this says nothing of today's pods
DETAIL_CHARS = 400  # of a termination message or event: enough for the engine's last error line


@dataclass(frozen=True)
class Workload:
    """What the workload child (Deployment or LeaderWorkerSet) reports."""

    desired: int
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    observed_current: bool = False  # the child's controller has seen its latest spec
    unschedulable: str | None = None  # why pods wait for a node, when some do (the scheduler's own words)
    failure: PodFailure | None = None  # why engine pods fail, when some do
    pods_per_replica: int = 1  # a LeaderWorkerSet group's size
    pods_missing: bool = False  # fewer engine pods exist than the replicas need (looked at during a rollout)
    ready_pods: frozenset[str] | None = None  # engine pods whose Ready is True (None: pods not looked at)

    @classmethod
    def from_live(cls, desired: int, live: dict[str, Any] | None, pods_per_replica: int = 1) -> Workload:
        if live is None:
            return cls(desired, pods_per_replica=pods_per_replica)
        status = reported_status(live)
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
            pods_per_replica=pods_per_replica,
        )

    def missing_pods(self, pods: list[dict[str, Any]]) -> bool:
        """Whether fewer engine pods exist (not being deleted) than the desired replicas need."""
        alive = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
        return len(alive) < self.desired * self.pods_per_replica

    def with_pods(
        self, pods: list[dict[str, Any]], hint: str | None = None, create_failure: PodFailure | None = None
    ) -> Workload:
        """Why pods wait for a node, if some do, with `hint` (what else may keep them: a model cache not ready);
        why they fail, if some do, or else why the workload controller cannot create them (`create_failure`)."""
        waiting = unschedulable(pods)
        return dataclasses.replace(
            self,
            unschedulable=f"{waiting}; {hint}" if waiting and hint else waiting,
            failure=pod_failure(pods) or create_failure,
            pods_missing=self.missing_pods(pods),
            ready_pods=frozenset(p["metadata"]["name"] for p in pods if pod_ready(p)),
        )

    @property
    def all_ready(self) -> bool:
        return (
            self.observed_current
            and self.ready == self.desired
            and self.updated == self.desired
            and self.replicas == self.desired
        )


def reported_status(live: Mapping[str, Any]) -> dict[str, Any]:
    """A workload's status in the Deployment/LeaderWorkerSet vocabulary. A DynamoGraphDeployment reports its
    components under status.components (ComponentReplicaStatus: replicas, updatedReplicas, readyReplicas or
    availableReplicas): the decode workers', with the graph's observedGeneration."""
    status: dict[str, Any] = dict(live.get("status") or {})
    if live.get("kind") != "DynamoGraphDeployment" or "status" not in live:
        return status
    decode = (status.get("components") or {}).get("decode") or {}
    ready = decode.get("readyReplicas", decode.get("availableReplicas"))
    reported = {
        "replicas": decode.get("replicas"),
        "readyReplicas": ready,
        "updatedReplicas": decode.get("updatedReplicas"),
    }
    return {"observedGeneration": status.get("observedGeneration"), **reported}


def desired_replicas(workload: Mapping[str, Any]) -> int:
    """The replicas a rendered workload asks for: its spec.replicas, or a DynamoGraphDeployment's decode workers
    (what spec.replicas counts for a disaggregated fleet)."""
    spec = workload.get("spec") or {}
    if "replicas" in spec:
        return int(spec["replicas"])
    components = spec.get("components") or []
    return sum(int(c.get("replicas") or 0) for c in components if c.get("type") == "decode")


def pods_per_replica(workload: Mapping[str, Any]) -> int:
    """Engine pods per replica of a rendered workload: a LeaderWorkerSet group's size, else 1."""
    template = (workload.get("spec") or {}).get("leaderWorkerTemplate") or {}
    return int(template.get("size") or 1)


def unschedulable(pods: list[dict[str, Any]]) -> str | None:
    """ "N of M pods cannot be scheduled: <why>" when some pod is Pending unplaced, else None: held by scheduling
    gates (`gated`), named to a scheduler that has not looked at it (`unplaced_by_other_scheduler`), or refused by
    the scheduler (PodScheduled=False, reason Unschedulable), whose message says which nodes failed which check,
    e.g. "0/15 nodes are available: 15 node(s) didn't match Pod's node affinity/selector"."""
    waiting: list[str] = []
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if why := gated(pod) or unplaced_by_other_scheduler(pod) or refused_by_scheduler(pod):
            waiting.append(why)
    if not waiting:
        return None
    return f"{len(waiting)} of {len(pods)} pods cannot be scheduled: {waiting[0]}"


def refused_by_scheduler(pod: Mapping[str, Any]) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == DeploymentReason.UNSCHEDULABLE
        ):
            return str(cond.get("message") or "no node fits")
    return None


def gated(pod: Mapping[str, Any]) -> str | None:
    """Why a pod waits on scheduling gates (spec.schedulingGates): no scheduler looks at it until whoever set them
    lifts them. Kueue gates a queued group's pods (kueue.x-k8s.io/admission) until its Workload is admitted, so
    a quota too small for the group leaves them here; the Workload's QuotaReserved condition says what is short."""
    spec = pod.get("spec") or {}
    gates = [str(g.get("name")) for g in spec.get("schedulingGates") or []]
    if not gates or spec.get("nodeName"):
        return None
    return (
        f"they wait on scheduling gates {', '.join(gates)}, which the controller that set them has not lifted "
        "(Kueue: its Workload for them is not admitted); fix: check that controller, for Kueue the queue in "
        "spec.podTemplate's kueue.x-k8s.io/queue-name label and `kubectl get workloads` (QuotaReserved says what "
        "is short)"
    )


DEFAULT_SCHEDULER = "default-scheduler"  # the apiserver's default for spec.schedulerName


def unplaced_by_other_scheduler(pod: Mapping[str, Any]) -> str | None:
    """Why a pod of spec.podTemplate.schedulerName (e.g. volcano) waits, when that scheduler has not looked at it:
    no node, no PodScheduled condition (a scheduler sets one on every pod it tries). Without it status would only
    say the rollout is in progress; a missing scheduler never reports anything itself."""
    spec = pod.get("spec") or {}
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
    conditions = (pod.get("status") or {}).get("conditions") or []
    if (
        scheduler == DEFAULT_SCHEDULER
        or spec.get("nodeName")
        or any(c.get("type") == "PodScheduled" for c in conditions)
    ):
        return None
    return (
        f"they name scheduler {scheduler} (spec.podTemplate.schedulerName) and no scheduler of that name has placed "
        f"them yet; fix: check that {scheduler} runs and serves this namespace, or remove schedulerName"
    )


@dataclass(frozen=True)
class PodFailure:
    """Why engine pods fail: a reason of `POD_FAILURE_REASONS` and a message naming the pod, the container and
    the cause."""

    reason: DeploymentReason
    message: str


def pod_failure(pods: list[dict[str, Any]]) -> PodFailure | None:
    """The first failing container's reason, with "N of M pods failing: pod P, container C: ...", else None."""
    failing: list[PodFailure] = []
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            found = container_failure(container)
            if found is not None:
                where = f"pod {pod['metadata']['name']}, container {container.get('name')}"
                failing.append(PodFailure(found.reason, f"{where}: {found.message}"))
                break
    if not failing:
        return None
    return PodFailure(failing[0].reason, f"{len(failing)} of {len(pods)} pods failing: {failing[0].message}")


def container_failure(container: Mapping[str, Any]) -> PodFailure | None:
    """Why one container (a status of `containerStatuses`) fails, else None (running, starting, or done)."""
    state = container.get("state") or {}
    waiting = state.get("waiting") or {}
    # The container that ran last: terminated now, or (waiting to restart) the last termination.
    last = state.get("terminated") or (container.get("lastState") or {}).get("terminated") or {}
    restarts = int(container.get("restartCount") or 0)
    if last.get("reason") == OOM_KILLED and (state.get("terminated") or waiting.get("reason") == CRASH_LOOP):
        return PodFailure(
            OOM_KILLED,
            f"killed for exceeding its memory limit (exit code {last.get('exitCode')}), restarted {restarts} times; "
            "raise resources.limits.memory or lower what the engine holds in host memory",
        )
    reason = waiting.get("reason")
    if reason == CRASH_LOOP:
        exit_text = f"last exit: {last.get('reason') or 'unknown'} (exit code {last.get('exitCode')})"
        detail = _detail(last.get("message"))
        return PodFailure(
            CRASH_LOOP,
            f"restarted {restarts} times and crashing, {exit_text}{': ' + detail if detail else ''}; "
            "see its log: kubectl logs --previous",
        )
    if reason in IMAGE_PULL_REASONS:
        return PodFailure(
            DeploymentReason(reason),
            f"{reason} for image {container.get('image')}: {_detail(waiting.get('message')) or 'no detail'}",
        )
    if reason in CONTAINER_CONFIG_REASONS:
        return PodFailure(DeploymentReason(reason), _detail(waiting.get("message")) or reason)
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Whether a pod (not being deleted) reports Ready=True."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def crash_seen_last(previous: list[dict[str, Any]], generation: int, workload: Workload) -> PodFailure | None:
    """The crash reported last, kept until the pod it names is Ready, every replica is, or the spec changes.

    A crashing container shows its failure only part of the time: between crashes it runs (state `running`,
    not Ready), and a LeaderWorkerSet recreates the whole group as soon as one of its pods restarts, so new
    pods show nothing until they crash again. Without this, Degraded would flip to AsExpected on every restart
    (and Argo CD's and Flux's health with it). Image pull and configuration errors hold still: not kept."""
    if workload.ready_pods is None or workload.all_ready:
        return None
    old = next((c for c in previous if c.get("type") == DEGRADED), None)
    if not old or old.get("status") != "True" or old.get("observedGeneration") != generation:
        return None
    reason, message = str(old.get("reason")), str(old.get("message") or "")
    named = _FAILING_POD.search(message)
    if reason not in (CRASH_LOOP, OOM_KILLED) or named is None or named.group(1) in workload.ready_pods:
        return None
    return PodFailure(DeploymentReason(reason), message.split("; ", 1)[-1])  # without the old "N of M replicas ready"


_FAILING_POD = re.compile(r"pods failing: pod (\S+), container ")


def create_failure(events: list[dict[str, Any]], workload: str, now: str) -> PodFailure | None:
    """Why the workload controller cannot create pods (the newest recent `FailedCreate` event of a ReplicaSet or
    StatefulSet the workload `workload` owns, named after it), else None. Pod Security refusals, quotas and
    admission webhooks all say so only there: no pod exists to carry a status."""
    recent: list[tuple[str, dict[str, Any]]] = []
    for event in events:
        involved = event.get("involvedObject") or {}
        if event.get("reason") != FAILED_CREATE or involved.get("kind") not in ("ReplicaSet", "StatefulSet"):
            continue
        if not str(involved.get("name") or "").startswith(workload):
            continue
        when = str(event.get("lastTimestamp") or event.get("eventTime") or "")
        if when and _seconds_between(when, now) <= FAILED_CREATE_RECENT_SECONDS:
            recent.append((when, event))
    if not recent:
        return None
    when, event = max(recent, key=lambda item: item[0])
    involved = event["involvedObject"]
    return PodFailure(
        FAILED_CREATE,
        f"{involved['kind']} {involved['name']} cannot create pods: {_detail(event.get('message'))}",
    )


def _seconds_between(earlier: str, later: str) -> float:
    """Seconds from one RFC 3339 time to another (infinite when either is not one)."""
    try:
        start, end = (datetime.datetime.fromisoformat(t.replace("Z", "+00:00")) for t in (earlier, later))
    except ValueError:
        return float("inf")
    return (end - start).total_seconds()


def _detail(text: object) -> str:
    """A kubelet or engine message on one line, cut to DETAIL_CHARS."""
    one_line = " ".join(str(text or "").split())
    return one_line if len(one_line) <= DETAIL_CHARS else one_line[: DETAIL_CHARS - 3] + "..."


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

    reason: DeploymentReason
    message: str


def condition(
    previous: list[dict[str, Any]],
    type_: str,
    status: ConditionStatus,
    reason: Reason,
    message: str,
    generation: int,
    now: str,
) -> dict[str, Any]:
    """One metav1.Condition; `reason` only from the catalogue (m3fleet.api.conditions), written as a plain string."""
    old = next((c for c in previous if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status and "lastTransitionTime" in old else now
    return {
        "type": type_,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": since,
        "reason": str(reason),
        "message": message[:32768],
    }


@dataclass(frozen=True)
class TierReport:
    """One context tier's workload, as it reports."""

    name: str
    workload: str
    desired: int
    ready: int


@dataclass(frozen=True)
class GatewayReport:
    """What the serving path (spec.gateway) reports: the Gateway, the route's verdict from it, the pool's endpoints."""

    gateway: str  # namespace/name, for messages
    route: str  # the HTTPRoute's name
    missing_api: str | None = None  # the API the cluster does not serve (nothing of the path is applied)
    gateway_found: bool = True
    accepted: Mapping[str, Any] | None = None  # the route's Accepted condition from this Gateway (None: none yet)
    endpoints: int = 0  # ready serving pods in the pool, every tier
    tiers: tuple[TierReport, ...] = ()

    def to_status(self) -> dict[str, Any]:
        """`status.gateway`: the Gateway, the ready endpoints, each tier's replicas."""
        return {
            "gateway": self.gateway,
            "readyEndpoints": self.endpoints,
            "tiers": [
                {"name": t.name, "workload": t.workload, "replicas": t.desired, "readyReplicas": t.ready}
                for t in self.tiers
            ],
        }


def gateway_condition(report: GatewayReport) -> tuple[bool, DeploymentReason, str]:
    """GatewayReady: (status, reason, message). Nothing here ever stops the rest of the reconcile."""
    meanwhile = "the engines keep serving through the <name>-api Service"
    if report.missing_api is not None:
        return (
            False,
            DeploymentReason.GATEWAY_API_NOT_INSTALLED,
            (
                f"the cluster does not serve {report.missing_api}: install the Gateway API and Gateway API Inference "
                f"Extension (v1.3.0) CRDs and a Gateway implementation; {meanwhile}"
            ),
        )
    if not report.gateway_found:
        return (
            False,
            DeploymentReason.GATEWAY_NOT_FOUND,
            (
                f"Gateway {report.gateway} does not exist: create it, or fix spec.gateway.gatewayRef; the HTTPRoute "
                f"{report.route} waits for it and {meanwhile}"
            ),
        )
    accepted = report.accepted
    if accepted is None:
        return (
            False,
            DeploymentReason.ROUTE_PENDING,
            (
                f"Gateway {report.gateway} has not accepted or refused HTTPRoute {report.route} yet: is a controller "
                "implementing the Gateway API Inference Extension running for its GatewayClass?"
            ),
        )
    if accepted.get("status") != TRUE:
        why = _detail(f"{accepted.get('reason', '')}: {accepted.get('message', '')}")
        return (
            False,
            DeploymentReason.ROUTE_NOT_ACCEPTED,
            (
                f"Gateway {report.gateway} refused HTTPRoute {report.route} ({why}): allow routes from this namespace "
                "in its listener (allowedRoutes), or fix spec.gateway.gatewayRef.sectionName"
            ),
        )
    if report.endpoints == 0:
        return (
            False,
            DeploymentReason.NO_ENDPOINTS,
            (
                f"HTTPRoute {report.route} is accepted by Gateway {report.gateway} but the pool has no ready endpoint: "
                "the endpoint picker holds requests until a replica is ready"
            ),
        )
    return (
        True,
        DeploymentReason.ROUTE_ACCEPTED,
        (f"HTTPRoute {report.route} accepted by Gateway {report.gateway}; {report.endpoints} ready endpoint(s)"),
    )


def conditions(
    previous: list[dict[str, Any]],
    generation: int,
    now: str,
    workload: Workload,
    blocked: Blocked | None,
    gateway: GatewayReport | None = None,
) -> list[dict[str, Any]]:
    found = _conditions(previous, generation, now, workload, blocked)
    if gateway is not None:
        ok, reason, message = gateway_condition(gateway)
        found.append(condition(previous, GATEWAY_READY, TRUE if ok else FALSE, reason, message, generation, now))
    return found


def _conditions(
    previous: list[dict[str, Any]],
    generation: int,
    now: str,
    workload: Workload,
    blocked: Blocked | None,
) -> list[dict[str, Any]]:
    def c(type_: str, ok: bool, reason: DeploymentReason, message: str) -> dict[str, Any]:
        return condition(previous, type_, TRUE if ok else FALSE, reason, message, generation, now)

    # Available means something answers requests: never with no ready replica, even when none is asked for.
    serving = workload.ready >= 1
    available = c(
        AVAILABLE,
        serving,
        DeploymentReason.MINIMUM_REPLICAS_AVAILABLE
        if serving
        else DeploymentReason.SCALED_TO_ZERO
        if workload.desired == 0
        else DeploymentReason.NO_REPLICAS_READY,
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
        ready = c(READY, True, DeploymentReason.SCALED_TO_ZERO, "0 replicas requested")
    elif workload.all_ready:
        ready = c(READY, True, DeploymentReason.ALL_REPLICAS_READY, f"all {workload.desired} replicas ready")
    elif failure := workload.failure or crash_seen_last(previous, generation, workload):
        message = f"{workload.ready} of {workload.desired} replicas ready; {failure.message}"
        return [
            c(READY, False, failure.reason, message),
            available,
            c(PROGRESSING, False, failure.reason, "the rollout cannot progress until the failing pods are fixed"),
            c(DEGRADED, True, failure.reason, message),
        ]
    elif workload.unschedulable:
        ready = c(
            READY,
            False,
            DeploymentReason.UNSCHEDULABLE,
            f"{workload.ready} of {workload.desired} replicas ready; {workload.unschedulable}",
        )
    else:
        ready = c(
            READY,
            False,
            DeploymentReason.ROLLOUT_IN_PROGRESS,
            f"{workload.ready} of {workload.desired} replicas ready, {workload.updated} updated",
        )
    progressing = ready["status"] != "True"
    return [
        ready,
        available,
        c(
            PROGRESSING,
            progressing,
            DeploymentReason.ROLLOUT_IN_PROGRESS if progressing else DeploymentReason.ROLLOUT_COMPLETE,
            ready["message"],
        ),
        c(DEGRADED, False, DeploymentReason.AS_EXPECTED, "the spec is valid and applied"),
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
    gateway: GatewayReport | None = None,
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
        "conditions": conditions(current.get("conditions") or [], generation, now, workload, blocked, gateway),
        "plan": plan if plan is not None else current.get("plan"),
        "replicas": workload.replicas,
        "readyReplicas": workload.ready,
        "selector": selector,
    }
    if secrets is not None and (secrets or current.get("generatedSecrets")):
        new["generatedSecrets"] = secrets
    if secrets is not None and (model_cache is not None or current.get("modelCache") is not None):
        new["modelCache"] = model_cache  # which MiniMaxM3ModelCache the pods mount
    if gateway is not None:
        new["gateway"] = gateway.to_status()
    elif blocked is None and current.get("gateway") is not None:
        new["gateway"] = None  # spec.gateway was removed
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

"""The condition catalogue of both resources: every condition type, its polarity, who sets it, and every reason
with what it means. Pure data. The controllers can only emit reasons named here (`DeploymentReason`,
`CacheReason`: typed, and tests/unit/test_conditions.py finds no reason written as a literal anywhere else); the
CRDs' `status.conditions` descriptions and the generated API reference (docs/reference/) are written from it.

Kubernetes conventions (metav1.Condition): a type is an adjective or past participle, a reason one CamelCase
word; an absent condition means Unknown; `Degraded` has negative polarity (all is well when it is False).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

READY: Final = "Ready"
AVAILABLE: Final = "Available"
PROGRESSING: Final = "Progressing"
DEGRADED: Final = "Degraded"
GATEWAY_READY: Final = "GatewayReady"
TRUE: Final = "True"
FALSE: Final = "False"

ConditionStatus = Literal["True", "False"]


class DeploymentReason(StrEnum):
    """Every reason a MiniMaxM3Deployment's conditions carry."""

    ALL_REPLICAS_READY = "AllReplicasReady"
    SCALED_TO_ZERO = "ScaledToZero"
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    ROLLOUT_COMPLETE = "RolloutComplete"
    UNSCHEDULABLE = "Unschedulable"  # the scheduler's own reason on a pod's PodScheduled condition
    MINIMUM_REPLICAS_AVAILABLE = "MinimumReplicasAvailable"
    NO_REPLICAS_READY = "NoReplicasReady"
    AS_EXPECTED = "AsExpected"
    # The operator stops before touching children.
    INVALID_SPEC = "InvalidSpec"
    MODEL_CACHE_NOT_FOUND = "ModelCacheNotFound"
    LEADER_WORKER_SET_NOT_INSTALLED = "LeaderWorkerSetNotInstalled"
    COMPUTE_DOMAIN_NOT_INSTALLED = "ComputeDomainNotInstalled"
    DYNAMO_NOT_INSTALLED = "DynamoNotInstalled"
    SECRETS_FORBIDDEN = "SecretsForbidden"
    NAME_CONFLICT = "NameConflict"
    APPLY_FAILED = "ApplyFailed"
    # Engine pods fail: the kubelet's own words (a container waiting, or killed for memory), and the workload
    # controller's (FailedCreate, the reason of its Event when pods are refused at admission).
    CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
    OOM_KILLED = "OOMKilled"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    ERR_IMAGE_PULL = "ErrImagePull"
    INVALID_IMAGE_NAME = "InvalidImageName"
    ERR_IMAGE_NEVER_PULL = "ErrImageNeverPull"
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    CREATE_CONTAINER_ERROR = "CreateContainerError"
    FAILED_CREATE = "FailedCreate"
    # The serving path (spec.gateway): whether the route is accepted and the pool has endpoints.
    ROUTE_ACCEPTED = "RouteAccepted"
    GATEWAY_API_NOT_INSTALLED = "GatewayApiNotInstalled"
    GATEWAY_NOT_FOUND = "GatewayNotFound"
    ROUTE_PENDING = "RoutePending"
    ROUTE_NOT_ACCEPTED = "RouteNotAccepted"
    NO_ENDPOINTS = "NoEndpoints"


class CacheReason(StrEnum):
    """Every reason a MiniMaxM3ModelCache's conditions carry."""

    ALL_NODES_READY = "AllNodesReady"
    STAGING = "Staging"
    DELETING = "Deleting"
    AS_EXPECTED = "AsExpected"
    STAGING_FAILED = "StagingFailed"
    INVALID_SPEC = "InvalidSpec"
    PATH_NOT_ALLOWED = "PathNotAllowed"
    STAGER_IMAGE_NOT_ALLOWED = "StagerImageNotAllowed"
    NO_NODES = "NoNodes"
    SECRET_NOT_FOUND = "SecretNotFound"
    PATH_CONFLICT = "PathConflict"
    SOURCE_REJECTED = "SourceRejected"
    FOREIGN_FILES = "ForeignFiles"
    PATH_NESTED = "PathNested"


Reason = DeploymentReason | CacheReason

_D, _C = DeploymentReason, CacheReason

# Why the operator stops before touching children: Ready=False, Progressing=False, Degraded=True, and a Warning
# Event. Running children are kept exactly as they are.
BLOCKING_REASONS: Final = (
    _D.INVALID_SPEC,
    _D.MODEL_CACHE_NOT_FOUND,
    _D.LEADER_WORKER_SET_NOT_INSTALLED,
    _D.COMPUTE_DOMAIN_NOT_INSTALLED,
    _D.DYNAMO_NOT_INSTALLED,
    _D.SECRETS_FORBIDDEN,
    _D.NAME_CONFLICT,
    _D.APPLY_FAILED,
)
IMAGE_PULL_REASONS: Final = (_D.IMAGE_PULL_BACK_OFF, _D.ERR_IMAGE_PULL, _D.INVALID_IMAGE_NAME, _D.ERR_IMAGE_NEVER_PULL)
CONTAINER_CONFIG_REASONS: Final = (_D.CREATE_CONTAINER_CONFIG_ERROR, _D.CREATE_CONTAINER_ERROR)
# Why engine pods fail: Ready=False, Progressing=False, Degraded=True. They do not heal by waiting: the user fixes
# the image, the Secret, the namespace.
POD_FAILURE_REASONS: Final = (
    _D.CRASH_LOOP_BACK_OFF,
    _D.OOM_KILLED,
    *IMAGE_PULL_REASONS,
    *CONTAINER_CONFIG_REASONS,
    _D.FAILED_CREATE,
)
# Bad input or a cluster the cache cannot stage on: Ready=False and Degraded=True; nothing staged is deleted.
CACHE_BLOCKING_REASONS: Final = (
    _C.INVALID_SPEC,
    _C.PATH_NOT_ALLOWED,
    _C.STAGER_IMAGE_NOT_ALLOWED,
    _C.NO_NODES,
    _C.SECRET_NOT_FOUND,
    _C.PATH_CONFLICT,
    _C.SOURCE_REJECTED,
    _C.FOREIGN_FILES,
    _C.PATH_NESTED,
)

DEPLOYMENT_REASON_MEANINGS: Final[Mapping[Reason, str]] = {
    _D.ALL_REPLICAS_READY: "Every replica of the current generation is ready and updated.",
    _D.SCALED_TO_ZERO: "No replica is asked for: Ready once the scale-down to zero is complete; Available is False "
    "(nothing serves).",
    _D.ROLLOUT_IN_PROGRESS: "A rollout or scale is under way; the message counts ready and updated replicas.",
    _D.ROLLOUT_COMPLETE: "The rollout is done: every replica is ready.",
    _D.UNSCHEDULABLE: "Pods wait for a node; the message is the scheduler's (which nodes failed which check), plus "
    "the Ready condition of a model cache whose nodes the pods require when it is not Ready; or that the scheduler "
    "spec.podTemplate.schedulerName names has not placed them (it is not running, or not serving the namespace).",
    _D.MINIMUM_REPLICAS_AVAILABLE: "At least one replica serves.",
    _D.NO_REPLICAS_READY: "Replicas are asked for and none is ready.",
    _D.AS_EXPECTED: "The spec is valid and applied.",
    _D.INVALID_SPEC: "The spec cannot be planned or rendered; the message names the field, the reason and a fix "
    "(the admission webhook refuses such a spec at apply time; this is what a spec stored without it shows).",
    _D.MODEL_CACHE_NOT_FOUND: "spec.model.cacheRef names a MiniMaxM3ModelCache that does not exist in the namespace.",
    _D.LEADER_WORKER_SET_NOT_INSTALLED: "A replica spans nodes and the cluster does not serve the LeaderWorkerSet "
    "API (leaderworkerset.x-k8s.io/v1): install LeaderWorkerSet v0.9 or newer, or plan a replica that fits one node.",
    _D.COMPUTE_DOMAIN_NOT_INSTALLED: "Multi-node GB200 and GB300 replicas need the NVIDIA DRA driver's ComputeDomain "
    "API (resource.nvidia.com/v1beta1), which the cluster does not serve.",
    _D.DYNAMO_NOT_INSTALLED: "spec.disaggregation.renderAs DynamoGraphDeployment and the cluster does not serve the "
    "Dynamo operator's DynamoGraphDeployment API (nvidia.com/v1beta1): install NVIDIA Dynamo's platform chart, or "
    "render as pods.",
    _D.SECRETS_FORBIDDEN: "The plan needs a Secret (the TensorRT-LLM multi-node SSH key) in a namespace where the "
    "operator is granted none: add it to the chart's rbac.secretNamespaces.",
    _D.NAME_CONFLICT: "An object the resource does not control holds a child's name; it is left as it is and "
    "nothing is applied until the name is free.",
    _D.APPLY_FAILED: "The API server rejected a child (400, 403, 404 or 422); the message quotes it.",
    _D.CRASH_LOOP_BACK_OFF: "The engine exits and the kubelet restarts it; the message names the pod and container, "
    "the last exit reason and code and the engine's last error line. Kept between restarts until that pod is "
    "Ready, every replica is, or the spec changes.",
    _D.OOM_KILLED: "The engine container exceeded its memory limit and was killed.",
    _D.IMAGE_PULL_BACK_OFF: "The kubelet cannot pull the engine image and backs off.",
    _D.ERR_IMAGE_PULL: "The kubelet failed to pull the engine image.",
    _D.INVALID_IMAGE_NAME: "The engine image reference is not a valid image name.",
    _D.ERR_IMAGE_NEVER_PULL: "The image pull policy is Never and the image is not on the node.",
    _D.CREATE_CONTAINER_CONFIG_ERROR: "The container cannot be configured: usually a Secret or key that "
    "engine.env, engine.apiKeySecretRef or the Hugging Face token names does not exist.",
    _D.CREATE_CONTAINER_ERROR: "The container runtime cannot create the container.",
    _D.FAILED_CREATE: "The workload controller may not create the pods: Pod Security, a ResourceQuota, a "
    "LimitRange or an admission webhook refused them (the message quotes the refusal).",
    _D.ROUTE_ACCEPTED: "The Gateway accepted the HTTPRoute and the InferencePool has at least one ready endpoint.",
    _D.GATEWAY_API_NOT_INSTALLED: "The cluster does not serve the InferencePool (inference.networking.k8s.io/v1) or "
    "HTTPRoute (gateway.networking.k8s.io/v1) API: the pool, picker or route are not applied; the engines serve "
    "through the <name>-api Service meanwhile.",
    _D.GATEWAY_NOT_FOUND: "spec.gateway.gatewayRef names a Gateway that does not exist; the route is applied and "
    "waits for it, nothing else changes.",
    _D.ROUTE_PENDING: "No Gateway controller has accepted or refused the HTTPRoute yet (none implements the "
    "Gateway's class, or it has not got to it).",
    _D.ROUTE_NOT_ACCEPTED: "The Gateway refused the HTTPRoute; the message quotes its reason (e.g. "
    "NotAllowedByListeners).",
    _D.NO_ENDPOINTS: "The InferencePool has no ready endpoint: the endpoint picker holds requests (bounded) until a "
    "replica is ready, e.g. while the fleet scales from zero.",
}

CACHE_REASON_MEANINGS: Final[Mapping[Reason, str]] = {
    _C.ALL_NODES_READY: "Every node of the pool holds a verified copy of the current content.",
    _C.STAGING: "Some nodes of the pool do not hold a verified copy yet; the message counts them.",
    _C.DELETING: "The cache is being deleted: node labels are removed and, with deleteFilesOnRemoval, the copies.",
    _C.AS_EXPECTED: "The spec is valid and no staging failed.",
    _C.STAGING_FAILED: "A node's staging Job failed (network, a corrupt file, the disk); it is retried after 1, 2, "
    "4 ... 30 minutes; status.nodes[].message says why.",
    _C.INVALID_SPEC: "The spec does not parse or the name cannot make a node label (only an older CRD lets this "
    "through).",
    _C.PATH_NOT_ALLOWED: "spec.path is not inside the chart's modelCache.allowedPathPrefixes.",
    _C.STAGER_IMAGE_NOT_ALLOWED: "spec.stagerImage's repository is not in the chart's modelCache.allowedStagerImages.",
    _C.NO_NODES: "No node has the accelerator's labels and every spec.nodes.nodeSelector label.",
    _C.SECRET_NOT_FOUND: "The Hugging Face token Secret does not exist; no new staging starts.",
    _C.PATH_CONFLICT: "Another cache, created first, owns spec.path on some nodes; nothing is staged there.",
    _C.SOURCE_REJECTED: "The Hub or the claim rejected the source (unknown revision or repo, no access); the "
    "copy staged before is kept.",
    _C.FOREIGN_FILES: "On a node, spec.path holds files m3fleet did not write; the message names the node, the path "
    "and the first file. Retried like a failure.",
    _C.PATH_NESTED: "The new spec.path holds, or is inside, a directory engine pods on a node still mount.",
}


@dataclass(frozen=True)
class ReasonGroup:
    """Reasons that come together on several condition types, with what they have in common."""

    name: str
    meaning: str
    reasons: tuple[Reason, ...]


BLOCKED: Final = ReasonGroup(
    "blocking",
    "The operator stops before touching children: running children are kept exactly as they are, and a Warning "
    "Event says why. Ready=False, Progressing=False, Degraded=True.",
    BLOCKING_REASONS,
)
PODS_FAIL: Final = ReasonGroup(
    "pod failure",
    "Engine pods fail and will not heal by waiting (the kubelet's or the workload controller's own word; the "
    "message names the pod, the container and the cause). Ready=False, Progressing=False, Degraded=True, and a "
    "Warning Event.",
    POD_FAILURE_REASONS,
)
CACHE_REFUSED: Final = ReasonGroup(
    "refusal",
    "Bad input, or a pool the cache cannot stage on: Ready=False, Degraded=True; nothing staged is deleted.",
    CACHE_BLOCKING_REASONS,
)


@dataclass(frozen=True)
class ConditionType:
    """One condition type: what True means, its status on a healthy resource at rest (its polarity), who sets
    it, and the reasons it carries with the status each comes with (a group stands for each of its reasons)."""

    type: str
    meaning: str
    at_rest: ConditionStatus  # on a healthy resource with nothing under way: "False" for Degraded (negative polarity)
    set_by: str
    reasons: tuple[tuple[ConditionStatus, Reason | ReasonGroup], ...]

    def pairs(self) -> tuple[tuple[ConditionStatus, Reason], ...]:
        """Every (status, reason) this type is set with, groups expanded."""
        return tuple(
            (status, reason)
            for status, entry in self.reasons
            for reason in (entry.reasons if isinstance(entry, ReasonGroup) else (entry,))
        )


@dataclass(frozen=True)
class Catalogue:
    """The conditions of one resource kind, the groups its reasons come in, and what each reason means."""

    conditions: tuple[ConditionType, ...]
    groups: tuple[ReasonGroup, ...]
    meanings: Mapping[Reason, str]

    def reasons(self) -> frozenset[Reason]:
        return frozenset(reason for entry in self.conditions for _, reason in entry.pairs())


RECONCILE = "the deployment reconcile (controller/reconcile.py; the conditions are computed by controller/status.py)"
CACHE_CONTROLLER = "the model-cache controller (controller/cache.py; decided by the pure cache/plan.py)"

DEPLOYMENT: Final = Catalogue(
    (
        ConditionType(
            READY,
            "Every replica of the current generation is ready: the summary `kubectl wait` and GitOps tools read.",
            TRUE,
            RECONCILE,
            (
                (TRUE, _D.ALL_REPLICAS_READY),
                (TRUE, _D.SCALED_TO_ZERO),
                (FALSE, _D.ROLLOUT_IN_PROGRESS),
                (FALSE, _D.UNSCHEDULABLE),
                (FALSE, BLOCKED),
                (FALSE, PODS_FAIL),
            ),
        ),
        ConditionType(
            AVAILABLE,
            "At least one replica serves requests.",
            TRUE,
            RECONCILE,
            ((TRUE, _D.MINIMUM_REPLICAS_AVAILABLE), (FALSE, _D.NO_REPLICAS_READY), (FALSE, _D.SCALED_TO_ZERO)),
        ),
        ConditionType(
            PROGRESSING,
            "A rollout or scale is under way. False with a blocking or pod failure reason: nothing progresses "
            "until the spec or the cluster is fixed.",
            FALSE,
            RECONCILE,
            ((TRUE, _D.ROLLOUT_IN_PROGRESS), (FALSE, _D.ROLLOUT_COMPLETE), (FALSE, BLOCKED), (FALSE, PODS_FAIL)),
        ),
        ConditionType(
            DEGRADED,
            "Negative polarity: the operator cannot do what the spec asks, or engine pods fail; waiting will not "
            "fix it. Argo CD's and Flux's health checks read it.",
            FALSE,
            RECONCILE,
            ((FALSE, _D.AS_EXPECTED), (TRUE, BLOCKED), (TRUE, PODS_FAIL)),
        ),
        ConditionType(
            GATEWAY_READY,
            "Only with spec.gateway: the Gateway accepted the HTTPRoute to the fleet's InferencePool and the pool has "
            "a ready endpoint. Never blocks the rest: the engines keep serving through <name>-api.",
            TRUE,
            RECONCILE,
            (
                (TRUE, _D.ROUTE_ACCEPTED),
                (FALSE, _D.GATEWAY_API_NOT_INSTALLED),
                (FALSE, _D.GATEWAY_NOT_FOUND),
                (FALSE, _D.ROUTE_PENDING),
                (FALSE, _D.ROUTE_NOT_ACCEPTED),
                (FALSE, _D.NO_ENDPOINTS),
            ),
        ),
    ),
    (BLOCKED, PODS_FAIL),
    DEPLOYMENT_REASON_MEANINGS,
)

CACHE: Final = Catalogue(
    (
        ConditionType(
            READY,
            "Every node of the pool holds a verified copy of the current content.",
            TRUE,
            CACHE_CONTROLLER,
            ((TRUE, _C.ALL_NODES_READY), (FALSE, _C.STAGING), (FALSE, _C.DELETING), (FALSE, CACHE_REFUSED)),
        ),
        ConditionType(
            DEGRADED,
            "Negative polarity: bad input, a pool the cache cannot stage on, or failed staging. Nothing staged is "
            "deleted because of it.",
            FALSE,
            CACHE_CONTROLLER,
            ((FALSE, _C.AS_EXPECTED), (TRUE, _C.STAGING_FAILED), (TRUE, CACHE_REFUSED)),
        ),
    ),
    (CACHE_REFUSED,),
    CACHE_REASON_MEANINGS,
)


def _listed(entries: list[str]) -> str:
    return ", ".join(entries)


def conditions_description(catalogue: Catalogue, reference: str) -> str:
    """The `status.conditions` description `kubectl explain` shows: each type, its polarity and its reasons by
    status, then the reasons of each group; `reference` is the page that says what each reason means."""
    types = []
    for entry in catalogue.conditions:
        by_status = []
        for status in (TRUE, FALSE):
            named = [
                f"any {reason.name} reason" if isinstance(reason, ReasonGroup) else str(reason)
                for s, reason in entry.reasons
                if s == status
            ]
            if named:
                by_status.append(f"{status}: {_listed(named)}")
        types.append(f"{entry.type} ({entry.at_rest} at rest) - {'; '.join(by_status)}.")
    groups = [f"The {group.name} reasons: {_listed([str(r) for r in group.reasons])}." for group in catalogue.groups]
    return " ".join(["metav1.Conditions, one per type.", *types, *groups, f"What each reason means: {reference}."])

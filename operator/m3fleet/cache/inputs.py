"""What the cache's plan is given (`Inputs`: the cache, its pool's nodes, its Jobs, the other caches, the admin's
rules), which nodes are in its pool, and the names and timings its objects share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from m3fleet.api.cache import (
    DEFAULT_PATH_PREFIXES,
    MiniMaxM3ModelCache,
    image_repository,
    path_not_allowed,
    stager_image_not_allowed,
)
from m3fleet.catalog import ACCELERATORS
from m3fleet.exitcodes import EXIT_BAD_SOURCE

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "m3fleet"
CACHE_LABEL = "m3fleet.dev/cache"  # on Jobs and the DaemonSet: which cache (the pod_event of engines ignores it)
CONTENT_LABEL = "m3fleet.dev/cache-content"
ACTION_LABEL = "m3fleet.dev/cache-action"  # stage | clean
NODE_ANNOTATION = "m3fleet.dev/node"
ATTEMPT_ANNOTATION = "m3fleet.dev/attempt"
FINALIZER = "m3fleet.dev/cache-cleanup"
STAGE, CLEAN = "stage", "clean"
BAD_SOURCE_EXIT_CODE = EXIT_BAD_SOURCE  # `m3fleet stage`: the source itself is wrong; no retry helps
JOB_BACKOFF_LIMIT = 3  # pod retries inside one Job (the job controller's own backoff: 10 s, 20 s, 40 s)
RETRY_SECONDS = (60.0, 1800.0)  # a failed Job's next attempt: after 1 min, doubling up to 30 min
BLOCKED_RECHECK_SECONDS = 60.0  # a missing Secret is looked for again (Secrets are not watched)
STOP_RECHECK_SECONDS = 10.0  # a deleted staging Job's pods are looked at again until they are gone
# A cache's removal waits this long for a node that is not Ready (a kubelet restarting, a node rebooting), then
# leaves its copy there rather than keep the cache (and its namespace) from going away for ever.
UNREACHABLE_SECONDS = 900.0
MOUNT_RECHECK_SECONDS = 60.0  # a directory engine pods still mount is looked at again (a rollout takes minutes)
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
STAGE_MOUNT = "/cache"
CACHE_VOLUME = "cache"  # the Job's hostPath volume: the node directory it writes
SOURCE_MOUNT = "/source"
PHASES = ("Pending", "Staging", "Ready", "Failed", "Removing")


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    schedulable: bool = True
    not_ready_since: float | None = None  # epoch seconds its Ready condition has not been True (None: Ready)


@dataclass(frozen=True)
class JobView:
    """One of the cache's Jobs as the job controller reports it."""

    name: str
    uid: str
    node: str
    content: str
    action: str  # stage | clean
    attempt: int
    state: str  # Active | Complete | Failed
    finished_at: float | None = None  # epoch seconds of the Complete/Failed condition
    bad_source: bool = False  # failed by the pod failure policy on exit code 3
    message: str = ""  # the pod's termination message, or the Job's condition message
    path: str = ""  # the node directory it writes (its hostPath)
    stopping: bool = False  # deleted, its pods still going (foreground deletion): it may still write


@dataclass(frozen=True)
class OtherCache:
    """Another model cache the operator can see."""

    key: str  # namespace/name
    path: str  # its spec.path
    created: str = ""  # metadata.creationTimestamp (RFC 3339 in UTC: sorts in time order)
    cache: MiniMaxM3ModelCache | None = None  # None: its spec does not parse (it stages nothing)
    ready_nodes: frozenset[str] = frozenset()  # nodes where its status (of its current spec) says Ready: in use


@dataclass(frozen=True)
class Inputs:
    cache: MiniMaxM3ModelCache
    uid: str
    nodes: Sequence[NodeView]
    jobs: Sequence[JobView]
    images: Sequence[str]  # engine images of the MiniMaxM3Deployments whose cacheRef names this cache
    now: float  # epoch seconds
    stager_image: str  # the operator's image, unless spec.stagerImage says otherwise
    secret_missing: str | None = None  # the token Secret's name when it does not exist
    daemonset_exists: bool = False
    deleting: bool = False  # metadata.deletionTimestamp is set
    reported_nodes: Sequence[Mapping[str, Any]] = ()  # status.nodes as last written (see `_may_hold_files`)
    created: str = ""  # the cache's metadata.creationTimestamp: of two caches on one directory, the first keeps it
    # Every other model cache the operator can see: a directory one of them uses (or one inside it, or holding it)
    # is never cleaned, nor staged on a node where it is the directory of a cache created first.
    others: Sequence[OtherCache] = ()
    # Other caches' cleanup Jobs where the operator watches: a directory one is emptying is not staged until it ends.
    foreign_cleans: Sequence[JobView] = ()
    # node -> the hostPath directories engine pods there mount (not the cache's own Jobs): never cleaned under them.
    mounts: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # The cluster admin's rules (chart values, read at startup): where caches may write, and which image repositories
    # may run the staging program (empty: only the operator's own, `stager_image`).
    allowed_prefixes: Sequence[str] = DEFAULT_PATH_PREFIXES
    allowed_images: Sequence[str] = ()

    def image(self) -> str:
        """The image of the cache's Jobs: spec.stagerImage when the admin allows it, else the operator's own."""
        wanted = self.cache.spec.stager_image
        return (
            wanted
            if wanted and stager_image_not_allowed(wanted, self.image_repositories()) is None
            else (self.stager_image)
        )

    def image_repositories(self) -> list[str]:
        return list(self.allowed_images) or [image_repository(self.stager_image)]

    def not_allowed(self) -> str | None:
        """Why the admin's rules refuse this cache's spec (its path, its stager image); None when they allow it."""
        spec = self.cache.spec
        return path_not_allowed(spec.path, self.allowed_prefixes) or stager_image_not_allowed(
            spec.stager_image, self.image_repositories()
        )


def in_pool(cache: MiniMaxM3ModelCache, node: NodeView) -> bool:
    accelerator = ACCELERATORS[cache.spec.nodes.accelerator]
    for key, values in accelerator.node_labels.items():
        if key in cache.spec.nodes.node_selector:
            continue  # the user's label wins (as for engine pods)
        if node.labels.get(key) not in values:
            return False
    return all(node.labels.get(k) == v for k, v in cache.spec.nodes.node_selector.items())


def retry_delay(attempt: int) -> float:
    first, longest = RETRY_SECONDS
    return float(min(longest, first * 2.0 ** max(0, attempt - 1)))

"""The work a MiniMaxM3ModelCache needs, from what the cluster holds now. Pure: the shell reads, this decides.

Given the cache, the nodes (name, labels, schedulable), its Jobs (per node: which content, which attempt, how
it ended) and the engine images of the deployments that use it, `plan_cache` says which Jobs to create and
delete, which node labels to set or remove, the pre-pull DaemonSet, the status, and when to look again.

Rules:
* A node is in the pool when it has the accelerator's labels and every `nodes.nodeSelector` label. Each pool
  node gets one staging Job per content (source + path, `content_digest`) and attempt, pinned to it.
* A node is labelled `<cache label>=ready` exactly when a Job of the current content completed on it (the
  staging program exits 0 only after every file verified and the marker is written). A node whose current
  Job is running or failed is not labelled; the label is removed before a new Job for it is created.
* A failed Job is retried with a new attempt after 1, 2, 4 ... up to 30 minutes (the Job itself already retried
  its pod with the job controller's backoff).
* Bad input never deletes what is staged: a pool with no nodes, a missing token Secret or a source the staging
  program rejects (unknown revision or repo, no access: exit code 3, which fails the Job at once) is reported in
  a condition; nodes out of the pool keep their labels and their copy; and a node whose copy of an earlier
  content is complete keeps (or gets back) its label while the new content's source is rejected, since the
  staging program checks the source before it writes a byte.
* Jobs are deleted only when their node is gone, or when a newer content's Job completed on their node.
* With `deleteFilesOnRemoval`, a copy left in a directory the cache no longer uses (`spec.path` changed) is
  removed by a cleanup Job on its node once the new copy is complete there and no engine pod on the node mounts
  it; the old Jobs stay as the record of where it is until then (status.nodes[].leftBehind, for a copy whose
  staging was stopped half way). Never a directory inside the new one or holding it, nor one another cache uses.
  A path changed back to a directory being emptied waits for that cleanup, then stages again.
* Two caches never write one directory: on a node both pools hold, a directory (or one inside it, or holding it)
  is the cache's created first; the other stages nothing there and reports `PathConflict` until one of them moves
  or goes. A directory another cache's cleanup Job is emptying on a node is staged only once that Job finished.
* The cluster admin's rules come first: a path outside the allowed prefixes, or a stager image whose repository is
  not allowed, stages and cleans nothing (`PathNotAllowed`, `StagerImageNotAllowed`).
* A staging Job that stopped at files it did not write (`m3fleet stage` exits 3 naming the first) is `ForeignFiles`,
  naming the node, the path and the file, and retried like a failure (someone may move the files). A path that holds
  or is inside a directory engine pods on the node still mount stages nothing there (`PathNested`).
* Only what the cache controls (owner reference with its uid) is its Job or DaemonSet; another cache's cleanup Job
  counts only when a live cache controls it in its own namespace (the shell filters; look-alikes change nothing).
* Deleting the cache removes every label; with `deleteFilesOnRemoval`, one cleanup Job per node and directory a
  staging Job wrote removes it, and the finalizer goes once they completed (or their node is gone). A node not
  Ready for UNREACHABLE_SECONDS holds the removal no longer: no Job runs there until its kubelet is back, so its
  copy is left there and said so (`Work.left_behind`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from m3fleet.api.cache import (
    DEFAULT_PATH_PREFIXES,
    NODE_LABEL_READY,
    MiniMaxM3ModelCache,
    foreign_file,
    image_repository,
    label_key_problem,
    node_label_key,
    path_not_allowed,
    stager_image_not_allowed,
)
from m3fleet.api.conditions import DEGRADED, FALSE, READY, TRUE, CacheReason, ConditionStatus
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


@dataclass(frozen=True)
class Verdict:
    """A condition to report: (type, status, reason, message)."""

    type: str
    status: ConditionStatus
    reason: CacheReason
    message: str


def refusal(reason: CacheReason, message: str, summary: str | None = None) -> list[Verdict]:
    """Ready=False and Degraded=True for one reason; Ready's message leads with the summary of nodes, if given."""
    ready = f"{summary}; {message}" if summary is not None else message
    return [Verdict(READY, FALSE, reason, ready), Verdict(DEGRADED, TRUE, reason, message)]


@dataclass
class Work:
    create: list[dict[str, Any]] = field(default_factory=list)  # Jobs to create
    delete: list[JobView] = field(default_factory=list)  # Jobs to delete
    labels: dict[str, str | None] = field(default_factory=dict)  # node -> label value (None: remove)
    daemonset: dict[str, Any] | None = None  # the pre-pull DaemonSet to apply
    delete_daemonset: bool = False
    nodes: list[dict[str, Any]] = field(default_factory=list)  # status.nodes
    conditions: list[Verdict] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)  # the rest of status
    requeue_after: float | None = None
    release: bool = False  # deletion: every label is gone and cleanup is done: drop the finalizer
    left_behind: list[str] = field(default_factory=list)  # deletion: copies left on nodes long not Ready (say so)


def _hash(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:10]


def job_name(cache: str, action: str, node: str, content: str, attempt: int) -> str:
    """At most 63 characters whatever the node's name (the job-name label on its pods must fit)."""
    return f"{cache[:40]}-{action}-{_hash(node, content, str(attempt))}"


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


def _owner(cache: MiniMaxM3ModelCache, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": cache.api_version,
        "kind": cache.kind,
        "name": cache.metadata.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _labels(cache: MiniMaxM3ModelCache) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "minimax-m3",
        "app.kubernetes.io/instance": cache.metadata.name,
        "app.kubernetes.io/component": "model-cache",
        MANAGED_BY: MANAGER,
        CACHE_LABEL: cache.metadata.name,
    }


def _tolerations(cache: MiniMaxM3ModelCache) -> list[dict[str, Any]]:
    accelerator = ACCELERATORS[cache.spec.nodes.accelerator]
    gpu_taint = {"key": accelerator.resource_name, "operator": "Exists", "effect": "NoSchedule"}
    return [gpu_taint, *cache.spec.nodes.tolerations]


# A cordoned node takes no new staging, but a cache's removal must still empty its directory there (as
# DaemonSets tolerate the cordon), or the finalizer would wait for an uncordon that may never come.
CORDONED: Final[list[dict[str, Any]]] = [
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
]


def _on_node(node: str) -> dict[str, Any]:
    """Pinned to one node the way DaemonSets pin their pods: a required affinity on the node's name (the
    scheduler still checks taints and resources, unlike spec.nodeName)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def stage_command(cache: MiniMaxM3ModelCache) -> tuple[list[str], list[dict[str, Any]]]:
    """`m3fleet stage ...` for this cache's source, and the environment it needs."""
    source = cache.spec.source
    if source.hugging_face is not None:
        hf = source.hugging_face
        args = ["m3fleet", "stage", "huggingface", "--repo", hf.repo, "--revision", hf.revision]
        env: list[dict[str, Any]] = [{"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
        if hf.endpoint:
            env.append({"name": "HF_ENDPOINT", "value": hf.endpoint})
        if hf.token_secret_ref is not None:  # referenced, never read by the operator
            ref = {"name": hf.token_secret_ref.name, "key": hf.token_secret_ref.key}
            env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
        return [*args, "--dest", STAGE_MOUNT, "--owner", owner_of(cache)], env
    assert source.pvc is not None
    origin = f"{SOURCE_MOUNT}/{source.pvc.sub_path.strip('/')}".rstrip("/") if source.pvc.sub_path else SOURCE_MOUNT
    return ["m3fleet", "stage", "copy", "--from", origin, "--dest", STAGE_MOUNT, "--owner", owner_of(cache)], []


def owner_of(cache: MiniMaxM3ModelCache) -> str:
    """Who a staging record belongs to: the cache's namespace/name (a re-created cache of the name keeps its copy)."""
    return f"{cache.metadata.namespace}/{cache.metadata.name}"


def _job(
    inputs: Inputs, node: str, action: str, attempt: int, directory: tuple[str, str] | None = None
) -> dict[str, Any]:
    """A Job on `node` for the cache's directory, or for `directory` (path, the content staged there) when
    cleaning one the cache no longer uses."""
    cache = inputs.cache
    path, content = directory or (cache.spec.path, cache.spec.content_digest())
    volumes: list[dict[str, Any]] = [{"name": CACHE_VOLUME, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}]
    mounts: list[dict[str, Any]] = [{"name": CACHE_VOLUME, "mountPath": STAGE_MOUNT}]
    if action == STAGE:
        command, env = stage_command(cache)
        if cache.spec.source.pvc is not None:
            claim = {"claimName": cache.spec.source.pvc.claim_name, "readOnly": True}
            volumes.append({"name": "source", "persistentVolumeClaim": claim})
            mounts.append({"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True})
    else:
        command, env = ["m3fleet", "stage", "clean", "--dest", STAGE_MOUNT, "--owner", owner_of(cache)], []
    env = [*env, {"name": "HF_HOME", "value": f"{STAGE_MOUNT}/.m3fleet-hf-home"}]
    container = {
        "name": action,
        "image": inputs.image(),
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": env,
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        # Writes a root-owned node directory: root, but nothing more (no privilege, every capability dropped
        # but the ones a copy that keeps ownership needs).
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    labels = {**_labels(cache), CONTENT_LABEL: content, ACTION_LABEL: action}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(cache.metadata.name, action, node, content, attempt),
            "namespace": cache.metadata.namespace,
            "labels": labels,
            "annotations": {NODE_ANNOTATION: node, ATTEMPT_ANNOTATION: str(attempt)},
            "ownerReferences": [_owner(cache, inputs.uid)],
        },
        "spec": {
            "backoffLimit": JOB_BACKOFF_LIMIT,
            # A rejected source fails the Job at once: retrying the same request cannot help.
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": action, "operator": "In", "values": [BAD_SOURCE_EXIT_CODE]},
                    }
                ]
            },
            "template": {
                "metadata": {"labels": labels, "annotations": {NODE_ANNOTATION: node}},
                "spec": {
                    "restartPolicy": "Never",
                    "affinity": _on_node(node),
                    "tolerations": _tolerations(cache) + (CORDONED if action == CLEAN else []),
                    "containers": [container],
                    "volumes": volumes,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                },
            },
        },
    }


def written_path(job: Mapping[str, Any]) -> str:
    """The node directory a Job made by `_job` writes ("" when it names none)."""
    volumes = ((job.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes") or []
    for volume in volumes:
        if volume.get("name") == CACHE_VOLUME:
            return str((volume.get("hostPath") or {}).get("path") or "")
    return ""


def _daemonset(inputs: Inputs) -> dict[str, Any]:
    """Pre-pull: one pod per pool node whose init containers are the engine images running `sh -c 'exit 0'`
    (every engine image is a full Linux userland with a shell), then a pause container that holds the pod (and
    so the images: the kubelet's image GC does not remove images in use)."""
    cache = inputs.cache
    accelerator = ACCELERATORS[cache.spec.nodes.accelerator]
    selector = {k: v[0] for k, v in accelerator.node_labels.items() if len(v) == 1}
    selector.update(cache.spec.nodes.node_selector)
    tiny = {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "64Mi"}}
    security = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    init = [
        {
            "name": f"pull-{index}",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "exit 0"],
            "resources": tiny,
            "securityContext": security,
        }
        for index, image in enumerate(sorted(set(inputs.images)))
    ]
    labels = {**_labels(cache), ACTION_LABEL: "pre-pull"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": f"{cache.metadata.name}-prepull",
            "namespace": cache.metadata.namespace,
            "labels": labels,
            "ownerReferences": [_owner(cache, inputs.uid)],
        },
        "spec": {
            "selector": {"matchLabels": {CACHE_LABEL: cache.metadata.name, ACTION_LABEL: "pre-pull"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": dict(sorted(selector.items())),
                    "tolerations": _tolerations(cache),
                    "initContainers": init,
                    "containers": [
                        {
                            "name": "pause",
                            "image": PAUSE_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "resources": tiny,
                            "securityContext": {**security, "runAsNonRoot": True, "runAsUser": 65535},
                        }
                    ],
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 1,
                },
            },
        },
    }


def _latest(jobs: Sequence[JobView]) -> JobView | None:
    return max(jobs, key=lambda j: j.attempt) if jobs else None


def _nested(a: str, b: str) -> bool:
    """Whether one directory holds the other (or they are one)."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


@dataclass
class _Cleanup:
    """Where removing one directory on one node stands."""

    done: bool = False
    create: dict[str, Any] | None = None  # the cleanup Job to create
    wait: float | None = None  # seconds until a failed cleanup is retried
    failure: str = ""  # the last attempt's message


def _cleanup(
    inputs: Inputs, node: str, directory: tuple[str, str], cleans: Sequence[JobView], written: Sequence[JobView]
) -> _Cleanup:
    """The cleanup Job of `directory` (path, the content staged there) on `node`: done, running, due or waiting.
    A cleanup that finished before the last staging Job there (`written`) finished emptied an older copy."""
    mine = _latest([j for j in cleans if j.node == node and j.path == directory[0]])
    if mine is None:
        return _Cleanup(create=_job(inputs, node, CLEAN, 1, directory))
    last_write = max((j.finished_at or inputs.now for j in written if j.path == directory[0]), default=0.0)
    if mine.state == "Complete" and (mine.finished_at or inputs.now) < last_write:
        return _Cleanup(create=_job(inputs, node, CLEAN, mine.attempt + 1, directory))
    if mine.state == "Complete":
        return _Cleanup(done=True)
    if mine.state == "Active":
        return _Cleanup()
    due = (mine.finished_at or 0.0) + retry_delay(mine.attempt)
    if due > inputs.now:
        return _Cleanup(wait=due - inputs.now, failure=mine.message)
    return _Cleanup(create=_job(inputs, node, CLEAN, mine.attempt + 1, directory), failure=mine.message)


def _used_by_another(inputs: Inputs, path: str) -> str | None:
    """The other cache (namespace/name) whose directory is `path`, is inside it or holds it."""
    return next((o.key for o in sorted(inputs.others, key=lambda o: o.key) if _nested(path, o.path)), None)


def _holder(inputs: Inputs, node: NodeView, ready_here: bool) -> str | None:
    """The other cache whose directory on `node` is spec.path, is inside it or holds it (its pool holds the node), and
    so keeps it: the one whose copy there is in use (Ready for its current spec), else, unless this cache's own copy
    there is the one in use (`ready_here`: a cache moved onto it never takes it), the one created first. Same-second
    creations go by namespace/name."""
    meta = inputs.cache.metadata
    mine = (inputs.created, f"{meta.namespace}/{meta.name}")
    first = sorted((o for o in inputs.others if o.cache is not None), key=lambda o: (o.created, o.key))
    sharing = [
        o for o in first if o.cache is not None and _nested(o.path, inputs.cache.spec.path) and in_pool(o.cache, node)
    ]
    if in_use := [o for o in sharing if node.name in o.ready_nodes]:
        return in_use[0].key
    older = [o for o in sharing if (o.created, o.key) < mine]
    return older[0].key if older and not ready_here else None


def _may_clean(inputs: Inputs, directory: str) -> bool:
    """A directory the cache no longer uses may be emptied: only with deleteFilesOnRemoval, and never one inside the
    current directory or holding it, nor one another cache uses."""
    return (
        inputs.cache.spec.delete_files_on_removal
        and not _nested(directory, inputs.cache.spec.path)
        and _used_by_another(inputs, directory) is None
        and path_not_allowed(directory, inputs.allowed_prefixes) is None
    )


def _left_behind(inputs: Inputs, jobs: Sequence[JobView]) -> dict[str, str]:
    """Directories (path -> the content staged there) that Jobs wrote on a node and the cache may empty."""
    return {j.path: j.content for j in sorted(jobs, key=lambda j: j.attempt) if j.path and _may_clean(inputs, j.path)}


def _carried(inputs: Inputs, node: str) -> list[str]:
    """Directories status records as left on `node` (status.nodes[].leftBehind) that the cache may still empty."""
    reported = next((n for n in inputs.reported_nodes if n.get("name") == node), {})
    return [p for p in reported.get("leftBehind") or [] if isinstance(p, str) and _may_clean(inputs, p)]


def _left_behind_paths(paths: Sequence[str]) -> dict[str, str]:
    """Directories known from status only (path -> a stand-in content: it names their cleanup Jobs)."""
    return {path: _hash("left", path) for path in paths}


@dataclass
class _NodeStep:
    """What one pool node needs this round: its status entry, whether it holds a ready copy, and what to do."""

    entry: dict[str, Any]
    ready: bool = False
    failure: str | None = None  # the last attempt failed (retried)
    bad_source: str | None = None  # the staging program rejected the source (not retried until it changes)
    wait: float | None = None  # seconds until the next attempt is due
    stage_attempt: int | None = None  # create the staging Job of this attempt
    superseded: list[JobView] = field(default_factory=list)  # Jobs whose record a newer one replaces
    cleanups: list[dict[str, Any]] = field(default_factory=list)  # cleanup Jobs of directories left behind
    holder: str | None = None  # the cache (namespace/name) whose directory spec.path is on this node
    foreign: str | None = None  # the first file in spec.path on this node that m3fleet did not write
    nested: str | None = None  # a directory engine pods here mount that spec.path holds or is inside


def _node_step(
    inputs: Inputs, name: str, jobs: list[JobView], content: str, in_pool: bool, cleans: Sequence[JobView] = ()
) -> _NodeStep:
    current = _latest([j for j in jobs if j.content == content])
    # A copy staged before stands for this content only in the directory the pods mount now.
    path = inputs.cache.spec.path
    older_complete = [j for j in jobs if j.content != content and j.state == "Complete" and j.path == path]
    step = _NodeStep({"name": name, "attempts": current.attempt if current else 0, "message": ""})
    entry = step.entry
    # Directories a stopped staging Job wrote in part: status is their only record once the Job is gone.
    carried = _carried(inputs, name)
    if carried:
        entry["leftBehind"] = carried
    node = next(n for n in inputs.nodes if n.name == name)
    if (holder := _holder(inputs, node, current is not None and current.state == "Complete")) is not None:
        # Another cache's staging would overwrite this one's copy and the reverse: the first cache keeps it.
        entry.update(phase="Pending", message=f"{path} is the directory of cache {holder} (created first) here")
        step.holder = holder
        writing = [j for j in jobs if j.state == "Active"]
        step.superseded = [j for j in writing if not j.stopping]
        if partial := [j.path for j in writing if j.path and _may_clean(inputs, j.path)]:
            entry["leftBehind"] = sorted({*carried, *partial})
        return step
    # A path moved into the directory of the copy pods here still run from, or one holding it: staging there would
    # write under their feet (and a cleanup of the old one would reach the new). Wait until they have rolled off it.
    in_use = sorted(m for m in inputs.mounts.get(name, ()) if m != path and _nested(m, path))
    if in_use and not (current is not None and current.state == "Complete"):
        entry.update(phase="Pending", message=f"{path} and {in_use[0]}, which engine pods here mount, are nested")
        step.nested, step.wait = in_use[0], MOUNT_RECHECK_SECONDS
        return step
    # The path changed back to a directory a cleanup empties (or one holding it, or inside it), or another cache
    # empties one it no longer uses: nothing is staged or trusted there until that cleanup has finished, and a copy
    # completed before it finished is gone.
    here = [c for c in cleans if _nested(c.path, path)]
    foreign = [c for c in inputs.foreign_cleans if c.node == name and _nested(c.path, path)]
    if emptying := [c for c in (*here, *foreign) if c.state == "Active"]:
        entry.update(phase="Pending", message=f"waiting for cleanup job {emptying[0].name} of {emptying[0].path}")
        step.wait = STOP_RECHECK_SECONDS
        return step
    emptied = max((c.finished_at or inputs.now for c in (*here, *foreign)), default=None)
    complete = current is not None and current.state == "Complete"
    if complete and current is not None and emptied is not None and (current.finished_at or 0.0) <= emptied:
        complete = False  # staged again below, as a new attempt
        entry["message"] = "the copy here was removed by a cleanup"
    if complete and current is not None:
        entry["phase"] = "Ready"
        step.ready = True
        pending = _clean_left_behind(inputs, name, [j for j in jobs if j is not current], cleans, step, carried)
        entry.pop("leftBehind", None)
        if kept := sorted(p for p in pending if p in carried):
            entry["leftBehind"] = kept
        old = [j for j in jobs if j is not current and j.path not in pending]
        done = [c for c in cleans if c.state != "Active" and c.path not in pending]  # older than this copy
        step.superseded = [j for j in (*old, *done) if not j.stopping]
        return step
    writing = [j for j in jobs if j.content != content and j.state == "Active"]
    if writing and not (current is not None and current.state == "Active"):
        # The spec changed while a Job of the old one stages here: two Jobs must never write one directory.
        entry.update(phase="Pending", message=f"waiting for job {writing[0].name} of the previous spec to stop")
        step.superseded, step.wait = [j for j in writing if not j.stopping], STOP_RECHECK_SECONDS
        # Stopped, such a Job is no record of the directory it wrote in part: status keeps it, to be emptied later.
        partial = [j.path for j in writing if j.path and _may_clean(inputs, j.path)]
        if partial:
            entry["leftBehind"] = sorted({*carried, *partial})
        return step
    stray = foreign_file(current.message) if current is not None and current.state == "Failed" else None
    if current is not None and current.state == "Failed" and current.bad_source and stray is None:
        entry.update(phase="Failed", message=current.message)
        step.bad_source = current.message
        if older_complete:  # the staging program rejected the source before writing: the old copy stands
            step.ready = True
            entry["message"] += "; the copy staged before is kept"
        return step
    if not in_pool:
        entry.update(phase="Pending", message="no longer in the pool; nothing is staged here any more")
        return step
    if current is not None and current.state == "Active":
        entry.update(phase="Staging", message=f"job {current.name}")
        return step
    if current is not None and current.state == "Failed":
        due = (current.finished_at or inputs.now) + retry_delay(current.attempt)
        entry.update(phase="Failed", message=current.message)
        if stray is not None:  # nothing was written: retried (someone may move the files), never silently
            step.foreign = stray
        else:
            step.failure = current.message
        if due > inputs.now:
            step.wait = due - inputs.now
            return step
    if inputs.secret_missing is not None:
        entry.update(phase="Pending", message=f"waiting for Secret {inputs.secret_missing}")
        return step
    if not node.schedulable:
        entry.update(phase="Pending", message="node is cordoned (unschedulable)")
        return step
    step.stage_attempt = (current.attempt + 1) if current is not None else 1
    if current is not None and not current.stopping:
        step.superseded.append(current)  # the failed attempt's record passes to the new one: failures do not pile up
    step.superseded.extend(c for c in here if not c.stopping)  # finished before this attempt: no longer a record
    entry.update(phase="Staging", attempts=step.stage_attempt, message="job created")
    return step


def _clean_left_behind(
    inputs: Inputs,
    node: str,
    older: Sequence[JobView],
    cleans: Sequence[JobView],
    step: _NodeStep,
    carried: Sequence[str] = (),
) -> set[str]:
    """Clean the directories a path change left on a node whose new copy is complete (those `older` Jobs wrote and
    those status `carried`); returns those still pending (their Jobs, or status, stay the record of them)."""
    pending: set[str] = set()
    waits: list[float] = []
    notes: list[str] = []
    mounted = inputs.mounts.get(node, ())
    directories = {**_left_behind_paths(carried), **_left_behind(inputs, older)}
    for old_path, old_content in sorted(directories.items()):
        if any(j.path == old_path and j.state == "Active" for j in older):
            pending.add(old_path)  # a Job of the old spec still stopping there: never clean under a writer
            waits.append(STOP_RECHECK_SECONDS)
            continue
        if any(_nested(old_path, m) for m in mounted):
            pending.add(old_path)  # an engine pod of the old spec still runs from it: wait for the rollout
            waits.append(MOUNT_RECHECK_SECONDS)
            notes.append(f"keeping the copy in {old_path} while pods on the node mount it")
            continue
        cleanup = _cleanup(inputs, node, (old_path, old_content), cleans, older)
        if cleanup.done:
            continue
        pending.add(old_path)
        step.cleanups.extend([cleanup.create] if cleanup.create else [])
        waits.extend([cleanup.wait] if cleanup.wait is not None else [])
        failed = f" (the last attempt failed: {cleanup.failure}; retried)" if cleanup.failure else ""
        notes.append(f"removing the copy in {old_path}, which the cache no longer uses{failed}")
    step.wait = min(waits) if waits else None
    step.entry["message"] = "; ".join(notes)
    return pending


def plan_cache(inputs: Inputs) -> Work:
    cache = inputs.cache
    meta = cache.metadata
    work = Work()
    label = node_label_key(meta.namespace, meta.name)
    content = cache.spec.content_digest()
    nodes = {n.name: n for n in inputs.nodes}
    labelled = {n.name for n in inputs.nodes if label in n.labels}
    stage_jobs = [j for j in inputs.jobs if j.action == STAGE]
    clean_jobs = [j for j in inputs.jobs if j.action == CLEAN]
    work.status = {"nodeLabel": f"{label}={NODE_LABEL_READY}", "content": content}

    if (problem := label_key_problem(meta.namespace, meta.name)) is not None:
        work.conditions = refusal(CacheReason.INVALID_SPEC, f"metadata.name: {problem}")
        return work

    # Jobs whose node is gone: nothing to record any more.
    work.delete.extend(j for j in inputs.jobs if j.node not in nodes)

    if inputs.deleting:
        return _removal(inputs, work, label, labelled, nodes, stage_jobs, clean_jobs)

    if (refused := inputs.not_allowed()) is not None:
        # Nothing is staged or cleaned; a node keeps its label only while it holds a copy of this very spec.
        holding = {j.node for j in stage_jobs if j.content == content and j.state == "Complete"}
        work.labels = dict.fromkeys(sorted(labelled - holding))
        reason = (
            CacheReason.PATH_NOT_ALLOWED if refused.startswith("spec.path") else CacheReason.STAGER_IMAGE_NOT_ALLOWED
        )
        work.conditions = refusal(reason, refused)
        return work

    pool = sorted(n for n, node in nodes.items() if in_pool(cache, node))
    by_node: dict[str, list[JobView]] = {}
    for job in stage_jobs:
        by_node.setdefault(job.node, []).append(job)
    ready: set[str] = set()
    failures: list[str] = []
    bad_source: list[str] = []
    conflicts: list[str] = []
    foreign: list[tuple[str, str]] = []  # (node, the first file there m3fleet did not write)
    nested: list[tuple[str, str]] = []  # (node, a directory pods there mount that spec.path is nested with)
    waiting: list[float] = []
    blocked = inputs.secret_missing is not None
    statuses: dict[str, dict[str, Any]] = {}
    for name in sorted(set(pool) | set(by_node)):
        if name not in nodes:
            continue
        cleans = [j for j in clean_jobs if j.node == name]
        step = _node_step(inputs, name, by_node.get(name, []), content, name in pool, cleans)
        statuses[name] = step.entry
        work.delete.extend(step.superseded)
        ready.update([name] if step.ready else [])
        failures.extend([f"{name}: {step.failure}"] if step.failure is not None else [])
        bad_source.extend([f"{name}: {step.bad_source}"] if step.bad_source is not None else [])
        conflicts.extend([f"{name} ({step.holder})"] if step.holder is not None else [])
        foreign.extend([(name, step.foreign)] if step.foreign is not None else [])
        nested.extend([(name, step.nested)] if step.nested is not None else [])
        waiting.extend([step.wait] if step.wait is not None else [])
        if step.stage_attempt is not None:
            work.create.append(_job(inputs, name, STAGE, step.stage_attempt))
        work.create.extend(step.cleanups)

    for name in sorted(labelled - ready):
        work.labels[name] = None  # removed before any Job is created (the shell applies labels first)
    for name in sorted(ready - labelled):
        work.labels[name] = NODE_LABEL_READY

    pool_ready = [n for n in pool if n in ready]
    work.nodes = [statuses[n] for n in sorted(statuses)]
    work.status.update(nodesTotal=len(pool), nodesReady=len(pool_ready), nodesSummary=f"{len(pool_ready)}/{len(pool)}")
    images = sorted(set(inputs.images)) if cache.spec.pre_pull_images else []
    work.status["images"] = images
    if images:
        work.daemonset = _daemonset(inputs)
    elif inputs.daemonset_exists:
        work.delete_daemonset = True

    work.conditions = _conditions(inputs, pool, pool_ready, failures, bad_source, conflicts)
    if blocking := _directory_verdict(inputs, len(pool_ready), len(pool), foreign, nested):
        work.conditions = blocking
    if blocked:
        waiting.append(BLOCKED_RECHECK_SECONDS)
    work.requeue_after = min(waiting) if waiting else None
    return work


def _conditions(
    inputs: Inputs, pool: list[str], ready: list[str], failures: list[str], bad_source: list[str], conflicts: list[str]
) -> list[Verdict]:
    spec = inputs.cache.spec
    accel = spec.nodes.accelerator
    if not pool:
        selector = f" and nodeSelector {dict(spec.nodes.node_selector)}" if spec.nodes.node_selector else ""
        message = (
            f"spec.nodes: no node has the {accel} accelerator's labels{selector}; nothing is staged, and nodes "
            "staged before keep their copy and label; fix: correct spec.nodes (kubectl get nodes --show-labels) "
            "or add nodes to the pool"
        )
        return refusal(CacheReason.NO_NODES, message)
    if inputs.secret_missing is not None:
        message = (
            f"spec.source.huggingFace.tokenSecretRef: Secret {inputs.secret_missing} does not exist in namespace "
            f"{inputs.cache.metadata.namespace}; no new staging starts and nothing staged is touched; fix: create it "
            f"(kubectl create secret generic {inputs.secret_missing} --from-literal=token=hf_...) or correct the name"
        )
        return refusal(CacheReason.SECRET_NOT_FOUND, message)
    summary = f"{len(ready)} of {len(pool)} nodes hold a verified copy"
    if conflicts:
        shown = ", ".join(conflicts[:3]) + (f" and {len(conflicts) - 3} more" if len(conflicts) > 3 else "")
        message = (
            f"spec.path: {spec.path} is the directory of another cache created first on {len(conflicts)} node(s) "
            f"[{shown}]; nothing is staged there, so that two caches never overwrite each other's copy; fix: give "
            "this cache a directory of its own, or point the deployments at the other cache"
        )
        return refusal(CacheReason.PATH_CONFLICT, message, summary)
    if bad_source:
        message = (
            f"the source was rejected ({bad_source[0]}); nothing staged before is deleted; fix: correct "
            "spec.source (the revision must be a commit of the repo, the token must have access)"
        )
        return refusal(CacheReason.SOURCE_REJECTED, message, summary)
    ready_verdict = (
        Verdict(READY, TRUE, CacheReason.ALL_NODES_READY, summary)
        if len(ready) == len(pool)
        else Verdict(READY, FALSE, CacheReason.STAGING, summary)
    )
    if failures:
        message = f"{len(failures)} node(s) failed staging and will be retried: {failures[0]}"
        return [ready_verdict, Verdict(DEGRADED, TRUE, CacheReason.STAGING_FAILED, message)]
    return [ready_verdict, Verdict(DEGRADED, FALSE, CacheReason.AS_EXPECTED, "the spec is valid")]


def _directory_verdict(
    inputs: Inputs, ready: int, total: int, foreign: list[tuple[str, str]], nested: list[tuple[str, str]]
) -> list[Verdict]:
    """The directory itself stops staging on some node: files m3fleet did not write are in it, or it is nested with
    the one engine pods there still mount (a path moved into or around the old copy). Empty when neither."""
    path, summary = inputs.cache.spec.path, f"{ready} of {total} nodes hold a verified copy"
    if foreign:
        node, first = foreign[0]
        message = (
            f"spec.path: {path} on node {node} holds files m3fleet did not write (first: {first}"
            + (f"; {len(foreign) - 1} more node(s) too" if len(foreign) > 1 else "")
            + "); nothing there was written or deleted; fix: give this cache an empty directory of its own, or move "
            "those files out (staging is retried every few minutes)"
        )
        reason = CacheReason.FOREIGN_FILES
    elif nested:
        node, mounted = nested[0]
        message = (
            f"spec.path: {path} is nested with {mounted}, which engine pods on node {node} still mount; nothing is "
            "staged there while they do, so that no copy is written or removed under them; fix: choose a directory "
            "beside the old one (not inside it, not holding it)"
        )
        reason = CacheReason.PATH_NESTED
    else:
        return []
    return refusal(reason, message, summary)


def _may_hold_files(entry: Mapping[str, Any]) -> bool:
    """Whether a status.nodes entry names a node that may hold files: a staging attempt ran there, or an earlier
    round of the removal listed it. A pool node that never staged (cordoned all along) holds nothing to clean, and
    a cleanup Job there could wait for ever."""
    return "name" in entry and (
        bool(entry.get("attempts")) or entry.get("phase") == "Removing" or bool(entry.get("leftBehind"))
    )


def _removal(
    inputs: Inputs,
    work: Work,
    label: str,
    labelled: set[str],
    nodes: Mapping[str, NodeView],
    stage_jobs: Sequence[JobView],
    clean_jobs: Sequence[JobView],
) -> Work:
    """The cache is being deleted: labels off; optionally the files, one cleanup Job per node and directory."""
    for name in sorted(labelled):
        work.labels[name] = None
    pending: list[dict[str, Any]] = []
    if inputs.cache.spec.delete_files_on_removal:
        # Every node that may hold files: a staging or cleanup Job ran there, or status still lists it (a staging
        # Job deleted below to stop it writing is no record any more; the status written below is).
        touched = {j.node for j in (*stage_jobs, *clean_jobs)} | {
            str(n["name"]) for n in inputs.reported_nodes if _may_hold_files(n)
        }
        staged = sorted(n for n in touched if n in nodes)
        for job in stage_jobs:
            if job.state == "Active" and not job.stopping:
                work.delete.append(job)  # stop writing before the directory is removed (foreground: until its pods go)
        spec = inputs.cache.spec
        shared = _used_by_another(inputs, spec.path)
        outside = path_not_allowed(spec.path, inputs.allowed_prefixes)
        if shared is not None:
            # Another cache stages there too: emptying the directory would delete its copy.
            work.left_behind.append(f"the files in {spec.path} are left on every node: cache {shared} uses them")
        elif outside is not None:  # no Job of ours runs there: a staging Job never did either
            work.left_behind.append(f"the files in {spec.path} are left on every node: the admin allows no cache there")
        for name in staged:
            # The directory in use, and any a path change left behind that no cleanup has removed yet.
            written = [j for j in stage_jobs if j.node == name]
            current = {} if shared is not None or outside is not None else {spec.path: spec.content_digest()}
            carried = _carried(inputs, name)
            directories = {**current, **_left_behind_paths(carried), **_left_behind(inputs, written)}
            cleanups = [_cleanup(inputs, name, d, clean_jobs, written) for d in sorted(directories.items())]
            if all(c.done for c in cleanups):
                continue
            since = nodes[name].not_ready_since
            if since is not None and inputs.now - since >= UNREACHABLE_SECONDS:
                paths = ", ".join(
                    path for (path, _), c in zip(sorted(directories.items()), cleanups, strict=True) if not c.done
                )
                minutes = (inputs.now - since) / 60
                work.left_behind.append(
                    f"node {name} has not been Ready for {minutes:.0f} minutes: its copy in {paths} is left there; "
                    "remove it by hand when the node is back, or delete the node if it is gone"
                )
                continue
            entry: dict[str, Any] = {"name": name, "phase": "Removing", "attempts": 0, "message": "removing the copy"}
            # Status keeps every other directory still to empty: the Jobs that recorded them may be gone next round.
            others = [path for (path, _), c in zip(sorted(directories.items()), cleanups, strict=True) if not c.done]
            if others := [path for path in others if path != spec.path]:
                entry["leftBehind"] = others
            pending.append(entry)
            if any(j.state == "Active" for j in written):
                continue  # the cleanup starts once the staging Job is gone
            work.create.extend(c.create for c in cleanups if c.create is not None)
    work.nodes = pending
    cleaning = f"removing labels; {len(pending)} node(s) still cleaning"
    if work.left_behind:
        cleaning += f"; {len(work.left_behind)} left: {work.left_behind[0]}"
    work.conditions = [Verdict(READY, FALSE, CacheReason.DELETING, cleaning)]
    work.release = not pending and not labelled
    work.requeue_after = None if work.release else 10.0
    return work


@dataclass(frozen=True)
class Letting:
    """What an uninstall lets go of for one cache (`m3fleet release-caches`, the chart's pre-delete hook): with no
    operator left, a finalizer would hold the cache's namespace deletion for ever, and its node label would tell
    the scheduler of a copy no one keeps. The files, the cache object and its Jobs stay."""

    unlabel: tuple[str, ...]  # the nodes that carry its label
    finalizers: list[str] | None  # the finalizers it keeps (None: ours is not among them: nothing to write)


def let_go(namespace: str, name: str, finalizers: Sequence[str], nodes: Sequence[NodeView]) -> Letting:
    label = node_label_key(namespace, name)
    unlabel = tuple(sorted(n.name for n in nodes if label in n.labels))
    kept = [f for f in finalizers if f != FINALIZER] if FINALIZER in finalizers else None
    return Letting(unlabel, kept)

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from m3fleet.api.cache import NODE_LABEL_READY, label_key_problem, node_label_key, path_not_allowed
from m3fleet.api.conditions import DEGRADED, FALSE, READY, TRUE, CacheReason, ConditionStatus
from m3fleet.cache.inputs import (
    ACTION_LABEL,
    ATTEMPT_ANNOTATION,
    BAD_SOURCE_EXIT_CODE,
    BLOCKED_RECHECK_SECONDS,
    CACHE_LABEL,
    CACHE_VOLUME,
    CLEAN,
    CONTENT_LABEL,
    FINALIZER,
    JOB_BACKOFF_LIMIT,
    MANAGED_BY,
    MANAGER,
    MOUNT_RECHECK_SECONDS,
    NODE_ANNOTATION,
    PAUSE_IMAGE,
    PHASES,
    RETRY_SECONDS,
    SOURCE_MOUNT,
    STAGE,
    STAGE_MOUNT,
    STOP_RECHECK_SECONDS,
    UNREACHABLE_SECONDS,
    Inputs,
    JobView,
    NodeView,
    OtherCache,
    in_pool,
    retry_delay,
)
from m3fleet.cache.nodes import (
    carried_directories,
    directory_cleanup,
    left_behind_by,
    left_behind_paths,
    node_step,
    used_by_another,
)
from m3fleet.cache.objects import (
    CORDONED,
    job_manifest,
    job_name,
    owner_of,
    prepull_daemonset,
    stage_command,
    written_path,
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
        step = node_step(inputs, name, by_node.get(name, []), content, name in pool, cleans)
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
            work.create.append(job_manifest(inputs, name, STAGE, step.stage_attempt))
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
        work.daemonset = prepull_daemonset(inputs)
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
        shared = used_by_another(inputs, spec.path)
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
            carried = carried_directories(inputs, name)
            directories = {**current, **left_behind_paths(carried), **left_behind_by(inputs, written)}
            cleanups = [directory_cleanup(inputs, name, d, clean_jobs, written) for d in sorted(directories.items())]
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


# The inputs, the objects and one node's round live in their own modules; their names stay importable from here.
__all__ = [
    "ACTION_LABEL",
    "ATTEMPT_ANNOTATION",
    "BAD_SOURCE_EXIT_CODE",
    "BLOCKED_RECHECK_SECONDS",
    "CACHE_LABEL",
    "CACHE_VOLUME",
    "CLEAN",
    "CONTENT_LABEL",
    "CORDONED",
    "FINALIZER",
    "JOB_BACKOFF_LIMIT",
    "MANAGED_BY",
    "MANAGER",
    "MOUNT_RECHECK_SECONDS",
    "NODE_ANNOTATION",
    "PAUSE_IMAGE",
    "PHASES",
    "RETRY_SECONDS",
    "SOURCE_MOUNT",
    "STAGE",
    "STAGE_MOUNT",
    "STOP_RECHECK_SECONDS",
    "UNREACHABLE_SECONDS",
    "Inputs",
    "JobView",
    "Letting",
    "NodeView",
    "OtherCache",
    "Verdict",
    "Work",
    "in_pool",
    "job_name",
    "let_go",
    "owner_of",
    "plan_cache",
    "retry_delay",
    "stage_command",
    "written_path",
]

"""One pool node's round (`node_step`): whether its copy is ready, what to stage or clean there, and the directory
rules (another cache's directory, one engine pods still mount, a cleanup still emptying it, copies a path change
left behind)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from m3fleet.api.cache import foreign_file, path_not_allowed
from m3fleet.cache.inputs import (
    CLEAN,
    MOUNT_RECHECK_SECONDS,
    STOP_RECHECK_SECONDS,
    Inputs,
    JobView,
    NodeView,
    in_pool,
    retry_delay,
)
from m3fleet.cache.objects import job_manifest, short_hash


def _latest(jobs: Sequence[JobView]) -> JobView | None:
    return max(jobs, key=lambda j: j.attempt) if jobs else None


def _nested(a: str, b: str) -> bool:
    """Whether one directory holds the other (or they are one)."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


@dataclass
class Cleanup:
    """Where removing one directory on one node stands."""

    done: bool = False
    create: dict[str, Any] | None = None  # the cleanup Job to create
    wait: float | None = None  # seconds until a failed cleanup is retried
    failure: str = ""  # the last attempt's message


def directory_cleanup(
    inputs: Inputs, node: str, directory: tuple[str, str], cleans: Sequence[JobView], written: Sequence[JobView]
) -> Cleanup:
    """The cleanup Job of `directory` (path, the content staged there) on `node`: done, running, due or waiting.
    A cleanup that finished before the last staging Job there (`written`) finished emptied an older copy."""
    mine = _latest([j for j in cleans if j.node == node and j.path == directory[0]])
    if mine is None:
        return Cleanup(create=job_manifest(inputs, node, CLEAN, 1, directory))
    last_write = max((j.finished_at or inputs.now for j in written if j.path == directory[0]), default=0.0)
    if mine.state == "Complete" and (mine.finished_at or inputs.now) < last_write:
        return Cleanup(create=job_manifest(inputs, node, CLEAN, mine.attempt + 1, directory))
    if mine.state == "Complete":
        return Cleanup(done=True)
    if mine.state == "Active":
        return Cleanup()
    due = (mine.finished_at or 0.0) + retry_delay(mine.attempt)
    if due > inputs.now:
        return Cleanup(wait=due - inputs.now, failure=mine.message)
    return Cleanup(create=job_manifest(inputs, node, CLEAN, mine.attempt + 1, directory), failure=mine.message)


def used_by_another(inputs: Inputs, path: str) -> str | None:
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
        and used_by_another(inputs, directory) is None
        and path_not_allowed(directory, inputs.allowed_prefixes) is None
    )


def left_behind_by(inputs: Inputs, jobs: Sequence[JobView]) -> dict[str, str]:
    """Directories (path -> the content staged there) that Jobs wrote on a node and the cache may empty."""
    return {j.path: j.content for j in sorted(jobs, key=lambda j: j.attempt) if j.path and _may_clean(inputs, j.path)}


def carried_directories(inputs: Inputs, node: str) -> list[str]:
    """Directories status records as left on `node` (status.nodes[].leftBehind) that the cache may still empty."""
    reported = next((n for n in inputs.reported_nodes if n.get("name") == node), {})
    return [p for p in reported.get("leftBehind") or [] if isinstance(p, str) and _may_clean(inputs, p)]


def left_behind_paths(paths: Sequence[str]) -> dict[str, str]:
    """Directories known from status only (path -> a stand-in content: it names their cleanup Jobs)."""
    return {path: short_hash("left", path) for path in paths}


@dataclass
class NodeStep:
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


def node_step(
    inputs: Inputs, name: str, jobs: list[JobView], content: str, in_pool: bool, cleans: Sequence[JobView] = ()
) -> NodeStep:
    current = _latest([j for j in jobs if j.content == content])
    # A copy staged before stands for this content only in the directory the pods mount now.
    path = inputs.cache.spec.path
    older_complete = [j for j in jobs if j.content != content and j.state == "Complete" and j.path == path]
    step = NodeStep({"name": name, "attempts": current.attempt if current else 0, "message": ""})
    entry = step.entry
    # Directories a stopped staging Job wrote in part: status is their only record once the Job is gone.
    carried = carried_directories(inputs, name)
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
    step: NodeStep,
    carried: Sequence[str] = (),
) -> set[str]:
    """Clean the directories a path change left on a node whose new copy is complete (those `older` Jobs wrote and
    those status `carried`); returns those still pending (their Jobs, or status, stay the record of them)."""
    pending: set[str] = set()
    waits: list[float] = []
    notes: list[str] = []
    mounted = inputs.mounts.get(node, ())
    directories = {**left_behind_paths(carried), **left_behind_by(inputs, older)}
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
        cleanup = directory_cleanup(inputs, node, (old_path, old_content), cleans, older)
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

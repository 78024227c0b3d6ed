"""`m3fleet stage`: put a checkpoint into a node-local directory and prove it is complete. What the cache's Jobs run.

    m3fleet stage huggingface --repo ORG/NAME --revision COMMIT --dest DIR   # HF_ENDPOINT, HF_TOKEN as usual
    m3fleet stage copy --from DIR --dest DIR                                 # from a mounted claim
    m3fleet stage clean --dest DIR                                           # remove what it wrote in DIR

DIR is written only when it is empty (or absent) or holds nothing but what this program wrote there, as its
staging record (`.m3fleet-staging.json`) lists: the source, every file, and the trees Hugging Face's client makes
while it downloads. Any other file (another team's weights, a data set, a notes file) stops the run before a byte is
written or deleted: exit 3, naming DIR and the first such file. The record is saved before each file is written, so
an interrupted run resumes and a cleanup finds everything it wrote. Only files the record lists are ever deleted:
one an earlier run wrote that the new source does not have, one that fails verification, and everything on `clean`,
which then removes DIR itself only if nothing else is left in it.

Hugging Face: the repo's file list at the pinned commit comes from the Hub API (`huggingface_hub`, the client
the Hub documents), with what the Hub publishes per file: its size, and the sha256 of LFS files or the git blob
sha1 of the others. Every file already in DIR that matches is kept; every other one is downloaded with
`hf_hub_download` (from its first byte: a file that failed is fetched whole again; HF_ENDPOINT and HF_TOKEN
honoured) and then checked; a file that does not match is deleted and the run fails. Copy: the files of the source
directory, checked against `m3fleet-manifest.json` in it when present (path, size and sha256 of each file), else
against the source files' sizes; a file only a size describes is kept only when DIR was staged from this same
source (the record), else copied again. A listing that names a path outside DIR (absolute, `..`) is a bad source.

Only when every file verified is `.m3fleet-complete.json` written (first removed, so an interrupted run never
looks complete); exit 0. Exit 6: something failed that a retry may fix (network, a corrupt or partial file).
Exit 3: the source or the destination is wrong (unknown revision or repo, no access, no source directory,
files in DIR it did not write) — checked before anything in DIR is touched. The reason is also written to the
termination log, where `kubectl describe pod` and the operator read it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m3fleet.api.cache import foreign_files_message
from m3fleet.exitcodes import EXIT_BAD_SOURCE, EXIT_RETRY

MARKER = ".m3fleet-complete.json"
STAGING = ".m3fleet-staging.json"  # the source a run stages from, written first: a resumed run may trust its files
MANIFEST = "m3fleet-manifest.json"
HF_HOME_DIR = ".m3fleet-hf-home"  # HF_HOME inside the directory (the Job sets it): nothing outside DIR is written
TREES = (HF_HOME_DIR, ".cache/huggingface")  # what huggingface_hub writes while it downloads: ours in DIR
BOOKKEEPING = frozenset({MARKER, STAGING, f"{MARKER}.tmp", f"{STAGING}.tmp"})
FIX_DEST = "fix: give the cache an empty directory of its own (spec.path), or move those files out of it"
TERMINATION_LOG = "/dev/termination-log"
CHUNK = 16 * 1024 * 1024
WORKERS = 8


class StageError(Exception):
    def __init__(self, message: str, code: int = EXIT_RETRY) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Expected:
    """One file of the checkpoint and what it must be."""

    path: str  # relative, '/'-separated
    size: int | None
    sha256: str | None = None
    git_sha1: str | None = None

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size}
        if self.sha256:
            out["sha256"] = self.sha256
        if self.git_sha1:
            out["gitSha1"] = self.git_sha1
        return out


def checked(files: Sequence[Expected], where: str) -> list[Expected]:
    """`files`, each a plain relative path (no absolute path, no `..`, no empty part): a listing that names any other
    would write or delete outside DIR. Raises StageError (the source is wrong) before anything is touched."""
    for expected in files:
        if not _inside(expected.path):
            raise StageError(f"{where} names {expected.path!r}, not a path inside the checkpoint", EXIT_BAD_SOURCE)
    return list(files)


def file_hashes(path: Path, git: bool) -> tuple[str, str | None]:
    """sha256 of the content, and (with `git`) the git blob sha1 (sha1 of `blob <size>\\0` + content)."""
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(f"blob {path.stat().st_size}\0".encode()) if git else None
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            sha256.update(chunk)
            if sha1 is not None:
                sha1.update(chunk)
    return sha256.hexdigest(), sha1.hexdigest() if sha1 is not None else None


def mismatch(dest: Path, expected: Expected) -> str | None:
    """Why the file in `dest` is not the expected one; None when it is."""
    target = dest / expected.path
    if not target.is_file():
        return "missing"
    size = target.stat().st_size
    if expected.size is not None and size != expected.size:
        return f"size {size} != published {expected.size}"
    if expected.sha256 or expected.git_sha1:
        sha256, sha1 = file_hashes(target, git=bool(expected.git_sha1))
        if expected.sha256 and sha256 != expected.sha256:
            return f"sha256 {sha256} != published {expected.sha256}"
        if expected.git_sha1 and sha1 != expected.git_sha1:
            return f"git blob sha1 {sha1} != published {expected.git_sha1}"
    return None


class Record:
    """What this program wrote in DIR (`.m3fleet-staging.json`): the source, every file, and the trees it owns
    (Hugging Face's download cache). Saved before each file is written, so an interrupted run resumes and a
    cleanup removes exactly what was written, and nothing else."""

    def __init__(self, dest: Path, source: Any, files: set[str], trees: set[str], owner: str = "") -> None:
        self.dest, self.source, self.files, self.trees = dest, source, files, trees
        self.owner = owner  # the cache (namespace/name) it stages for; "" when run by hand
        self._lock = threading.Lock()

    def foreign_to(self, owner: str) -> bool:
        """Whether the record is another cache's (both named, and not the same)."""
        return bool(self.owner and owner and self.owner != owner)

    def owns(self, relative: str) -> bool:
        return (
            relative in BOOKKEEPING
            or relative in self.files
            or any(relative == tree or relative.startswith(f"{tree}/") for tree in self.trees)
        )

    def add(self, relative: str) -> None:
        with self._lock:
            if relative not in self.files:
                self.files.add(relative)
                self._save()

    def discard(self, relative: str) -> None:
        with self._lock:
            if relative in self.files:
                self.files.discard(relative)
                self._save()

    def save(self, source: Any) -> None:
        with self._lock:
            self.source = source
            self._save()

    def _save(self) -> None:
        record = {"source": self.source, "files": sorted(self.files), "trees": sorted(self.trees), "owner": self.owner}
        _write(self.dest / STAGING, record)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded(dest: Path) -> Record | None:
    """The record of what this program wrote in DIR; None when DIR holds none. A complete copy of an earlier version
    (its marker lists the checkpoint's files, its staging file none) counts as written here too."""
    staging, marker = _read(dest / STAGING), _read(dest / MARKER)
    if not staging and not marker:
        return None
    files = {f for f in staging.get("files") or [] if _inside(f)}
    files |= {f["path"] for f in marker.get("files") or [] if isinstance(f, dict) and _inside(f.get("path"))}
    trees = {t for t in staging.get("trees") or [] if _inside(t)} if "trees" in staging else set(TREES)
    owner = str(staging.get("owner") or "")
    return Record(dest, staging.get("source") or marker.get("source"), files, trees, owner)


def _inside(path: Any) -> bool:
    """A plain relative path inside DIR: a record naming any other (edited by hand) must never reach outside it."""
    return isinstance(path, str) and not path.startswith("/") and all(p not in ("", ".", "..") for p in path.split("/"))


def entries(dest: Path) -> list[str]:
    """Every file and symlink under DIR, relative and sorted (symlinks are never followed)."""
    found: list[str] = []
    for root, directories, names in os.walk(dest):
        base = Path(root)
        links = [d for d in directories if (base / d).is_symlink()]
        directories[:] = sorted(d for d in directories if d not in links)
        found.extend((base / name).relative_to(dest).as_posix() for name in (*names, *links))
    return sorted(found)


def claim(dest: Path, owner: str) -> Record:
    """DIR as this run (for `owner`) may write it: empty (or absent), or holding only what its record lists. Any
    other file, or any file of another cache's record, is someone else's: StageError (exit 3) naming the first,
    before anything is written or deleted."""
    if dest.exists() and not dest.is_dir():
        raise StageError(f"{dest} is not a directory: {FIX_DEST}", EXIT_BAD_SOURCE)
    record = recorded(dest) if dest.is_dir() else None
    theirs = record is not None and record.foreign_to(owner)
    mine = record if record is not None and not theirs else Record(dest, None, set(), set())
    foreign = [path for path in entries(dest) if not mine.owns(path)] if dest.is_dir() else []
    if foreign:
        refusal = foreign_files_message(str(dest), foreign[0], len(foreign))
        whose = f" (the staging record there is cache {record.owner}'s)" if theirs and record is not None else ""
        raise StageError(f"{refusal}{whose}; nothing was written or deleted; {FIX_DEST}", EXIT_BAD_SOURCE)
    dest.mkdir(parents=True, exist_ok=True)
    mine.trees |= set(TREES)  # DIR holds none of them but ours: the download cache it makes is ours
    mine.owner = owner or mine.owner
    return mine


def _write(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


def _finish(
    record: Record, source: dict[str, Any], files: Sequence[Expected], fetch: Callable[[Expected], None]
) -> str:
    """Fetch what is missing or wrong, verify everything, then write the marker. Returns a summary."""
    dest = record.dest
    # A file that only a size describes is kept only when it came from this same source (a resumed run): the
    # same size from another source (a fine-tune's shards, another subPath) says nothing about the bytes.
    same_source = record.source == source
    (dest / MARKER).unlink(missing_ok=True)
    record.save(source)
    wanted = {f.path for f in files}
    for stale in sorted(record.files - wanted):  # written here by an earlier run, not in this source
        (dest / stale).unlink(missing_ok=True)
        record.discard(stale)
        print(f"removed {stale} (not in the source)", flush=True)

    def one(expected: Expected) -> str | None:
        hashed = bool(expected.sha256 or expected.git_sha1)
        if (hashed or same_source) and mismatch(dest, expected) is None:
            record.add(expected.path)
            return None  # already here and verified
        record.add(expected.path)  # recorded before a byte is written: a cleanup finds it whatever happens next
        try:
            fetch(expected)
        except StageError:
            raise
        except Exception as exc:  # the client's own errors (HTTP, I/O): retry later
            (dest / expected.path).unlink(missing_ok=True)
            return f"{expected.path}: {type(exc).__name__}: {exc}"
        problem = mismatch(dest, expected)
        if problem is not None:
            (dest / expected.path).unlink(missing_ok=True)  # never leave a file that is not the published one
            return f"{expected.path}: {problem}"
        print(f"verified {expected.path}", flush=True)
        return None

    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        problems = [p for p in pool.map(one, files) if p]
    if problems:
        raise StageError(f"{len(problems)} of {len(files)} files failed verification: " + "; ".join(problems[:5]))
    _write(dest / MARKER, {"source": source, "files": [f.record() for f in files]})
    total = sum(f.size or 0 for f in files)
    return f"{len(files)} files ({total} bytes) complete and verified in {dest}"


def stage_huggingface(repo: str, revision: str, dest: Path, owner: str = "") -> str:
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = HfApi()
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True)
    except RevisionNotFoundError:
        raise StageError(
            f"revision {revision} does not exist in {repo}: give a commit of the repo", EXIT_BAD_SOURCE
        ) from None
    except GatedRepoError:
        raise StageError(f"{repo} is gated and the token has no access: accept its terms", EXIT_BAD_SOURCE) from None
    except RepositoryNotFoundError:
        raise StageError(
            f"repo {repo} does not exist, or the token cannot see it (private): check the name and token",
            EXIT_BAD_SOURCE,
        ) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        code = EXIT_BAD_SOURCE if status in (401, 403) else EXIT_RETRY
        raise StageError(f"the Hub refused the file list of {repo}@{revision}: {exc}", code) from None
    if info.sha and info.sha != revision:
        raise StageError(f"{repo}@{revision} resolved to commit {info.sha}: give the full commit hash", EXIT_BAD_SOURCE)
    files = [
        Expected(
            s.rfilename,
            s.lfs.size if s.lfs else s.size,
            sha256=s.lfs.sha256 if s.lfs else None,
            git_sha1=None if s.lfs else s.blob_id,
        )
        for s in info.siblings or []
    ]
    if not files:
        raise StageError(f"{repo}@{revision} lists no files", EXIT_BAD_SOURCE)
    files = checked(files, f"the file list of {repo}@{revision}")
    record = claim(dest, owner)

    def fetch(expected: Expected) -> None:
        (dest / expected.path).unlink(missing_ok=True)
        hf_hub_download(repo, expected.path, revision=revision, local_dir=dest, force_download=True)

    return _finish(record, {"huggingFace": {"repo": repo, "revision": revision}}, files, fetch)


def _manifest(source: Path) -> list[Expected]:
    manifest = source / MANIFEST
    if manifest.is_file():
        try:
            data = json.loads(manifest.read_text())
            return [Expected(f["path"], int(f["size"]), sha256=f.get("sha256")) for f in data["files"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise StageError(f"{manifest} is not a valid manifest ({exc})", EXIT_BAD_SOURCE) from None
    files = []
    for path in sorted(source.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            files.append(Expected(path.relative_to(source).as_posix(), path.stat().st_size))
    return files


def stage_copy(source: Path, dest: Path, owner: str = "") -> str:
    if not source.is_dir():
        raise StageError(f"source directory {source} does not exist: check the claim and subPath", EXIT_BAD_SOURCE)
    files = checked(_manifest(source), f"{source / MANIFEST}")
    if not files:
        raise StageError(f"source directory {source} holds no files", EXIT_BAD_SOURCE)
    absent = [f.path for f in files if not (source / f.path).is_file()]
    if absent:  # before DIR is touched: exit 3 promises the copy staged before is intact
        raise StageError(f"{absent[0]} is in the manifest but not in {source}", EXIT_BAD_SOURCE)
    record = claim(dest, owner)

    def fetch(expected: Expected) -> None:
        origin = source / expected.path
        target = dest / expected.path
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        record.add(partial.relative_to(dest).as_posix())
        shutil.copyfile(origin, partial)
        partial.replace(target)
        record.discard(partial.relative_to(dest).as_posix())

    return _finish(record, {"copy": str(source)}, files, fetch)


def clean(dest: Path, owner: str = "") -> str:
    """Remove what the record lists, then the record, then DIR itself if nothing else is left in it. Another cache's
    record (`owner` given and not the one it names) removes nothing."""
    if not dest.is_dir():
        return f"{dest} does not exist: nothing to remove"
    record = recorded(dest)
    if record is not None and record.foreign_to(owner):
        return f"the staging record in {dest} is cache {record.owner}'s, not {owner}'s: nothing removed"
    removed = 0
    if record is not None:
        for relative in sorted(record.files):
            target = dest / relative
            if target.is_file() or target.is_symlink():
                target.unlink()
                removed += 1
        for tree in sorted(record.trees):
            target = dest / tree
            if target.is_symlink():
                target.unlink()
            elif target.is_dir():
                shutil.rmtree(target)
        # Directories the recorded files sat in, deepest first, when nothing else is in them.
        parents = {p for f in (*record.files, *record.trees) for p in (dest / f).parents if dest in p.parents}
        for directory in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        for name in (MARKER, f"{MARKER}.tmp", f"{STAGING}.tmp", STAGING):  # the record last: a rerun resumes
            (dest / name).unlink(missing_ok=True)
    left = entries(dest)
    if left:
        first = foreign_files_message(str(dest), left[0], len(left))
        return f"removed the {removed} files m3fleet wrote; {first}: they are left as they are"
    try:
        dest.rmdir()
    except OSError:  # a mount point (the Job's volume) cannot be removed from inside: it is left empty
        return f"removed the {removed} files m3fleet wrote; {dest} is empty"
    return f"removed the {removed} files m3fleet wrote and the empty directory {dest}"


def write_termination_log(message: str) -> None:
    """Where `kubectl describe pod` and the operator read why the Job's container ended (best effort)."""
    log = Path(os.environ.get("M3FLEET_TERMINATION_LOG", TERMINATION_LOG))
    try:
        if log.parent.is_dir():
            log.write_text(message[:4000])
    except OSError:
        pass

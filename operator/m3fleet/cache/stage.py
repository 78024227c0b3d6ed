"""`m3fleet stage`: put a checkpoint into a node-local directory and prove it is complete. What the cache's Jobs run.

    m3fleet stage huggingface --repo ORG/NAME --revision COMMIT --dest DIR   # HF_ENDPOINT, HF_TOKEN as usual
    m3fleet stage copy --from DIR --dest DIR                                 # from a mounted claim
    m3fleet stage clean --dest DIR                                           # empty DIR (the cache is removed)

Hugging Face: the repo's file list at the pinned commit comes from the Hub API (`huggingface_hub`, the client
the Hub documents), with what the Hub publishes per file: its size, and the sha256 of LFS files or the git blob
sha1 of the others. Every file already in DIR that matches is kept; every other one is downloaded with
`hf_hub_download` (from its first byte: a file that failed is fetched whole again; HF_ENDPOINT and HF_TOKEN
honoured) and then checked; a file that does not match is
deleted and the run fails. Copy: the files of the source directory, checked against `m3fleet-manifest.json` in
it when present (path, size and sha256 of each file), else against the source files' sizes; a file only a size
describes is kept only when DIR was staged from this same source (`.m3fleet-staging.json`, written first), else
copied again. Files in DIR that the source does not have are removed (an earlier revision's). A listing that names a
path outside DIR (absolute, `..`) is a bad source.

Only when every file verified is `.m3fleet-complete.json` written (first removed, so an interrupted run never
looks complete); exit 0. Exit 6: something failed that a retry may fix (network, a corrupt or partial file).
Exit 3: the source itself is wrong (unknown revision or repo, no access, no source directory) — checked
before anything in DIR is touched. The reason is also written to the termination log, where
`kubectl describe pod` and the operator read it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m3fleet.exitcodes import EXIT_BAD_SOURCE, EXIT_OK, EXIT_RETRY

MARKER = ".m3fleet-complete.json"
STAGING = ".m3fleet-staging.json"  # the source a run stages from, written first: a resumed run may trust its files
MANIFEST = "m3fleet-manifest.json"
HF_HOME_DIR = ".m3fleet-hf-home"  # HF_HOME inside the directory (the Job sets it): nothing outside DIR is written
KEEP = (MARKER, STAGING, ".cache", HF_HOME_DIR)  # never treated as stale checkpoint files
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
        parts = expected.path.split("/")
        if expected.path.startswith("/") or any(part in ("", ".", "..") for part in parts):
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


def _stale(dest: Path, wanted: set[str]) -> list[Path]:
    found = []
    for path in sorted(dest.rglob("*")):
        relative = path.relative_to(dest).as_posix()
        if relative.split("/")[0] in KEEP or not (path.is_file() or path.is_symlink()):
            continue
        if relative not in wanted:
            found.append(path)
    return found


def _source_staged(dest: Path) -> Any:
    """The source the files in DIR were staged from, as the last run recorded it (None: unknown)."""
    for name in (STAGING, MARKER):
        try:
            return json.loads((dest / name).read_text()).get("source")
        except (OSError, ValueError, AttributeError):
            continue
    return None


def _write(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


def _finish(dest: Path, source: dict[str, Any], files: Sequence[Expected], fetch: Callable[[Expected], None]) -> str:
    """Fetch what is missing or wrong, verify everything, then write the marker. Returns a summary."""
    # A file that only a size describes is kept only when it came from this same source (a resumed run): the
    # same size from another source (a fine-tune's shards, another subPath) says nothing about the bytes.
    same_source = _source_staged(dest) == source
    (dest / MARKER).unlink(missing_ok=True)
    _write(dest / STAGING, {"source": source})
    for path in _stale(dest, {f.path for f in files}):
        path.unlink()
        print(f"removed {path.relative_to(dest)} (not in the source)", flush=True)

    def one(expected: Expected) -> str | None:
        hashed = bool(expected.sha256 or expected.git_sha1)
        if (hashed or same_source) and mismatch(dest, expected) is None:
            return None  # already here and verified
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


def stage_huggingface(repo: str, revision: str, dest: Path) -> str:
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
    dest.mkdir(parents=True, exist_ok=True)

    def fetch(expected: Expected) -> None:
        (dest / expected.path).unlink(missing_ok=True)
        hf_hub_download(repo, expected.path, revision=revision, local_dir=dest, force_download=True)

    return _finish(dest, {"huggingFace": {"repo": repo, "revision": revision}}, files, fetch)


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


def stage_copy(source: Path, dest: Path) -> str:
    if not source.is_dir():
        raise StageError(f"source directory {source} does not exist: check the claim and subPath", EXIT_BAD_SOURCE)
    files = checked(_manifest(source), f"{source / MANIFEST}")
    if not files:
        raise StageError(f"source directory {source} holds no files", EXIT_BAD_SOURCE)
    absent = [f.path for f in files if not (source / f.path).is_file()]
    if absent:  # before DIR is touched: exit 3 promises the copy staged before is intact
        raise StageError(f"{absent[0]} is in the manifest but not in {source}", EXIT_BAD_SOURCE)
    dest.mkdir(parents=True, exist_ok=True)

    def fetch(expected: Expected) -> None:
        origin = source / expected.path
        target = dest / expected.path
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        shutil.copyfile(origin, partial)
        partial.replace(target)

    return _finish(dest, {"copy": str(source)}, files, fetch)


def clean(dest: Path) -> str:
    if not dest.exists():
        return f"{dest} does not exist: nothing to remove"
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    return f"emptied {dest}"


def _terminate(message: str) -> None:
    log = Path(os.environ.get("M3FLEET_TERMINATION_LOG", TERMINATION_LOG))
    try:
        if log.parent.is_dir():
            log.write_text(message[:4000])
    except OSError:
        pass


def register(sub: Any) -> None:
    parser = sub.add_parser("stage", help="stage a checkpoint into a node-local directory and verify it (cache Jobs)")
    which = parser.add_subparsers(dest="source", required=True, metavar="SOURCE")
    hf = which.add_parser("huggingface", help="download a pinned commit of a Hugging Face repo")
    hf.add_argument("--repo", required=True)
    hf.add_argument("--revision", required=True, help="the full 40-character commit hash")
    hf.add_argument("--dest", required=True, type=Path)
    copy = which.add_parser("copy", help="copy from a directory (a mounted claim)")
    copy.add_argument("--from", dest="origin", required=True, type=Path)
    copy.add_argument("--dest", required=True, type=Path)
    cleanup = which.add_parser("clean", help="remove everything in the directory")
    cleanup.add_argument("--dest", required=True, type=Path)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        if args.source == "huggingface":
            summary = stage_huggingface(args.repo, args.revision, args.dest)
        elif args.source == "copy":
            summary = stage_copy(args.origin, args.dest)
        else:
            summary = clean(args.dest)
    except StageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        _terminate(str(exc))
        return exc.code
    except OSError as exc:  # the node's disk: full, read-only, permissions
        message = f"{type(exc).__name__}: {exc}"
        print(f"error: {message}", file=sys.stderr)
        _terminate(message)
        return EXIT_RETRY
    print(summary, flush=True)
    _terminate(summary)
    return EXIT_OK

"""`m3fleet stage huggingface|copy|clean`: stage a checkpoint into a node-local directory and verify it (what the
model cache's Jobs run; the staging itself: `m3fleet.cache.stage`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from m3fleet.cache.stage import StageError, clean, stage_copy, stage_huggingface, write_termination_log
from m3fleet.exitcodes import EXIT_OK, EXIT_RETRY


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
    cleanup = which.add_parser(
        "clean", help="remove the files its staging record lists, then the directory if nothing else is in it"
    )
    cleanup.add_argument("--dest", required=True, type=Path)
    for command in (hf, copy, cleanup):
        command.add_argument(
            "--owner", default="", help="the cache it works for (namespace/name): another cache's record is not its own"
        )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.source == "huggingface":
            summary = stage_huggingface(args.repo, args.revision, args.dest, args.owner)
        elif args.source == "copy":
            summary = stage_copy(args.origin, args.dest, args.owner)
        else:
            summary = clean(args.dest, args.owner)
    except StageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        write_termination_log(str(exc))
        return exc.code
    except OSError as exc:  # the node's disk: full, read-only, permissions
        message = f"{type(exc).__name__}: {exc}"
        print(f"error: {message}", file=sys.stderr)
        write_termination_log(message)
        return EXIT_RETRY
    print(summary, flush=True)
    write_termination_log(summary)
    return EXIT_OK

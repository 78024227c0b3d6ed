"""`m3fleet render -f FILE [-o yaml|json]`: every Kubernetes object the operator would create, offline."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from m3fleet.api import MiniMaxM3Deployment
from m3fleet.cli.inputs import Caches, cache_of, input_flags, process
from m3fleet.documents import dump_objects
from m3fleet.exitcodes import EXIT_INVALID, EXIT_OK
from m3fleet.planner import plan
from m3fleet.render import cache_mount, render


def register(sub: Any) -> None:
    parser = sub.add_parser("render", help="every Kubernetes object the operator would create, offline")
    input_flags(parser)
    parser.add_argument(
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="YAML documents, or JSON as a v1 List"
    )
    parser.set_defaults(func=run)


def _render(resource: MiniMaxM3Deployment, caches: Caches) -> list[Any]:
    return render(resource, plan(resource.spec), cache=cache_mount(resource, cache_of(resource, caches)))


def run(args: argparse.Namespace) -> int:
    results, problems = process(args, _render)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return EXIT_INVALID
    sys.stdout.write(dump_objects([obj for objects in results for obj in objects], args.output))
    return EXIT_OK

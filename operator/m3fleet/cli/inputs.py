"""The resources `plan` and `render` read: every MiniMaxM3Deployment in `-f` (files, directories, stdin), in `-n`'s
namespace, with the MiniMaxM3ModelCaches beside them; each failing resource one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from m3fleet.api import KIND, MiniMaxM3Deployment, parse_resource
from m3fleet.api.cache import CACHE_KIND, MiniMaxM3ModelCache
from m3fleet.api.parse import parse_cache
from m3fleet.documents import Document, in_namespace, is_cache, label, ours, read_inputs, report
from m3fleet.errors import SpecError, SpecErrors

INPUT_HELP = "YAML file, directory, or - for stdin (repeatable); documents that are not ours are skipped"

Caches = dict[tuple[str, str], MiniMaxM3ModelCache]


def input_flags(parser: argparse.ArgumentParser) -> None:
    """-f and -n of `plan` and `render`, as kubectl's."""
    parser.add_argument("-f", "--filename", required=True, action="append", help=INPUT_HELP)
    parser.add_argument(
        "-n",
        "--namespace",
        help="the namespace of resources that name none; one that names another is an error (as kubectl)",
    )


def process(
    args: argparse.Namespace, each: Callable[[MiniMaxM3Deployment, Caches], Any]
) -> tuple[list[Any], list[str]]:
    """Parse every resource of ours in `args.filename` (each -f), in `args.namespace` (-n) when given, and apply
    `each` (with the MiniMaxM3ModelCaches of the same input, by namespace and name); collect results and
    per-resource errors. Documents that are not ours are skipped (stderr names them). Caches are validated, not
    planned: the operator stages them on the nodes (stderr says so)."""
    results: list[Any] = []
    read, unreadable = read_inputs(args.filename)
    problems = [f"error: {e}" for e in unreadable]
    docs: list[Document] = []
    for doc in ours(read):
        try:
            docs.append(in_namespace(doc, args.namespace))
        except SpecError as exc:
            problems.append(report(doc, exc))
    if not docs and not problems:
        print(f"note: no {KIND} in the input", file=sys.stderr)
    caches: Caches = {}
    for doc in docs:
        if not is_cache(doc.body):
            continue
        try:
            cache = parse_cache(doc.body)
            caches[cache.metadata.namespace, cache.metadata.name] = cache
            print(
                f"note: {label(doc)}: {CACHE_KIND}, validated; not planned (the operator stages it on the nodes)",
                file=sys.stderr,
            )
        except (SpecError, SpecErrors) as exc:
            problems.append(report(doc, exc))
    for doc in docs:
        if is_cache(doc.body):
            continue
        try:
            resource = parse_resource(doc.body)
            results.append(each(resource, caches))
        except (SpecError, SpecErrors) as exc:
            problems.append(report(doc, exc))
    return results, problems


def cache_of(resource: MiniMaxM3Deployment, caches: Caches) -> MiniMaxM3ModelCache | None:
    """The MiniMaxM3ModelCache the resource names, when the input holds it."""
    ref = resource.spec.model.cache_ref
    return caches.get((resource.metadata.namespace, ref.name)) if ref is not None else None

"""What the serving benchmarks (routing, disaggregation) share: seed lists and plain-text tables."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from m3fleet.api.models import Plan
from m3fleet.api.parse import parse_resource
from m3fleet.planner import plan as make_plan
from tests.bench.autoscaling.__main__ import parse_seeds

__all__ = ["load_plan", "parse_seeds", "table"]

REPO = Path(__file__).resolve().parents[2]


def load_plan(sample: str, spec_changes: dict[str, Any] | None = None) -> Plan:
    """The planner's plan of a sample under manifests/samples/, with `spec` fields replaced (dotted paths)."""
    document = yaml.safe_load((REPO / "manifests" / "samples" / sample).read_text())
    for dotted, value in (spec_changes or {}).items():
        node = document["spec"]
        *parents, leaf = dotted.split(".")
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return make_plan(parse_resource(document).spec)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header], *[[("-" if c is None else str(c)) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in cells
    )

"""The generated reference pages hold everything their sources say: every CRD field, CEL rule, condition type and
reason (docs/reference/), and every chart value with its values.yaml default (charts/m3fleet/README.md). The
pages checked in are these pages: hack/generate.py --check (tests/chart/test_generated.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from m3fleet.api.cache import CACHE_KIND
from m3fleet.api.conditions import CACHE, DEPLOYMENT, Catalogue
from m3fleet.api.crd import build_cache_crd, build_crd
from m3fleet.api.models import KIND
from m3fleet.api.reference import crd_reference, values_reference

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "m3fleet"
CELL_SEPARATOR = re.compile(r"(?<!\\)\|")


def _paths(node: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every property of a schema, with its dotted path (list items `[]`, map values `.<key>`)."""
    for name, child in (node.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        yield path, child
        yield from _paths(child, path)
        for inner, suffix in ((child.get("items"), "[]"), (child.get("additionalProperties"), ".<key>")):
            if isinstance(inner, Mapping) and "properties" in inner:
                yield from _paths(inner, path + suffix)


def _rules(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        yield from (rule["rule"] for rule in node.get("x-kubernetes-validations") or [])
        for value in node.values():
            yield from _rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from _rules(value)


def _shown(default: Any) -> str:
    """A default as the page writes it: a string as it is (empty: ""), anything else as compact JSON."""
    return default if isinstance(default, str) and default else json.dumps(default, separators=(",", ":"))


def _table_rows(page: str) -> Iterator[str]:
    return (line for line in page.splitlines() if line.startswith("|"))


@pytest.mark.parametrize(
    ("kind", "crd", "book"), [(KIND, build_crd(), DEPLOYMENT), (CACHE_KIND, build_cache_crd(), CACHE)]
)
def test_the_api_reference_has_every_field_rule_type_and_reason(kind: str, crd: Any, book: Catalogue) -> None:
    page = crd_reference(kind)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    paths = list(_paths(schema))
    assert len(paths) > 40
    for path, node in paths:
        row = next((r for r in _table_rows(page) if r.startswith(f"| `{path}`")), None)
        assert row is not None, path
        if "default" in node and not isinstance(node["default"], dict):
            assert f"`{_shown(node['default'])}`" in row, path
        for value in node.get("enum", []):
            assert f"`{value}`" in row, (path, value)
    rules = list(_rules(schema))
    assert len(rules) >= 3
    for rule in rules:
        assert f"`{' '.join(rule.split())}`" in page, rule
    for entry in book.conditions:
        assert f"### {entry.type}\n" in page
    for reason in book.reasons():
        assert f"| `{reason}` | {book.meanings[reason][:30]}" in page, reason
    assert "ModelCacheNotFound" in page or kind == CACHE_KIND


MISSING = object()


def _lookup(values: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(values, dict) or key not in values:
            return MISSING
        values = values[key]
    return values


def test_the_chart_readme_has_every_value_with_its_default() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values_yaml = (CHART / "values.yaml").read_text()
    table = values_reference(schema, values_yaml)
    readme = (CHART / "README.md").read_text()
    assert table in readme and readme == (ROOT / "docs" / "reference" / "chart.md").read_text()
    rows = {row.split(" | ")[0].removeprefix("| `").split("`")[0]: row for row in _table_rows(table)}
    values = yaml.safe_load(values_yaml)
    assert {key for key in values} <= {path for path, _ in _paths(schema)}
    for path, node in _paths(schema):
        assert path in rows, path
        default = _lookup(values, path)
        if default is MISSING or "[]" in path:
            continue
        if isinstance(default, dict) and default and "properties" in node:
            assert "see its fields" in rows[path], path
        else:
            assert f"`{_shown(default)}`" in rows[path], path


@pytest.mark.parametrize("page", ["minimaxm3deployment.md", "minimaxm3modelcache.md", "chart.md"])
def test_every_table_row_has_as_many_cells_as_its_header(page: str) -> None:
    """A pipe in a value (a regex, a CEL rule) must not split a cell: GitHub, Artifact Hub and MkDocs read these."""
    lines = (ROOT / "docs" / "reference" / page).read_text().splitlines()
    width = 0
    for line in lines:
        if not line.startswith("|"):
            width = 0
            continue
        cells = len(CELL_SEPARATOR.findall(line))
        width = width or cells
        assert cells == width, line

"""Reference pages in Markdown, written from schemas: each CRD's API reference (every field with its type, default,
bounds and description; every CEL rule at the field it sits on; the condition catalogue) and a table of a JSON
Schema's values (the chart's README). Pure: hack/generate.py writes the pages, and its --check fails when a
page no longer matches the models.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from m3fleet.api.cache import CACHE_KIND
from m3fleet.api.conditions import CACHE, DEPLOYMENT, FALSE, TRUE, Catalogue, ConditionType, ReasonGroup
from m3fleet.api.crd import build_cache_crd, build_crd
from m3fleet.api.models import KIND

CATALOGUES: Mapping[str, Catalogue] = {KIND: DEPLOYMENT, CACHE_KIND: CACHE}
# Bounds shown in a field's row, as (schema keyword, how it reads).
BOUNDS = (
    ("minimum", "min"),
    ("maximum", "max"),
    ("minLength", "min length"),
    ("maxLength", "max length"),
    ("minItems", "min items"),
    ("maxItems", "max items"),
    ("minProperties", "min keys"),
    ("maxProperties", "max keys"),
    ("pattern", "pattern"),
    ("format", "format"),
    ("x-kubernetes-list-type", "list type"),
    ("x-kubernetes-list-map-keys", "list map keys"),
)


@dataclass(frozen=True)
class Row:
    """One field of a schema: where it is, what it holds and what it may be."""

    path: str
    type: str
    required: bool
    default: Any  # NO_DEFAULT when it has none, SEE_FIELDS for an object whose fields' rows show theirs
    bounds: tuple[str, ...]
    description: str
    rules: tuple[Mapping[str, Any], ...]  # x-kubernetes-validations on this node


NO_DEFAULT = object()
MARKDOWN_ENTITIES = {c: f"&#{ord(c)};" for c in "|[]()*_`\\"}
SEE_FIELDS = object()


def _type(node: Mapping[str, Any]) -> str:
    kind = node.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"array of {_type(node.get('items') or {})}"
    if kind == "object" and isinstance(node.get("additionalProperties"), Mapping) and "properties" not in node:
        return f"map of {_type(node['additionalProperties'])}"
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "object (free-form)"
    return str(kind)


def _bounds(node: Mapping[str, Any]) -> tuple[str, ...]:
    found = [f"one of: {', '.join(_code(v) for v in node['enum'])}"] if "enum" in node else []
    for keyword, reads in BOUNDS:
        if keyword in node:
            value = node[keyword]
            exclusive = keyword in ("minimum", "maximum") and node.get(f"exclusive{keyword.capitalize()}") is True
            found.append(f"{reads}{' (exclusive)' if exclusive else ''}: {_code(value)}")
    return tuple(found)


def rows(schema: Mapping[str, Any], prefix: str = "", defaults: Any = NO_DEFAULT) -> Iterator[Row]:
    """Every field under an object schema, depth first in the schema's order. `defaults`: the values to show as
    each field's default instead of the schema's own (the chart's values.yaml)."""
    required = set(schema.get("required") or [])
    for name, node in (schema.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        given = defaults.get(name, NO_DEFAULT) if isinstance(defaults, Mapping) else NO_DEFAULT
        default = given if defaults is not NO_DEFAULT else node.get("default", NO_DEFAULT)
        yield from _node_rows(node, path, name in required, default, given)


def _node_rows(node: Mapping[str, Any], path: str, required: bool, default: Any, given: Any) -> Iterator[Row]:
    rules = tuple(node.get("x-kubernetes-validations") or ())
    if "properties" in node and isinstance(default, Mapping) and default:
        default = SEE_FIELDS  # each field's row shows its own
    yield Row(path, _type(node), required, default, _bounds(node), node.get("description", ""), rules)
    nested = given if given is not NO_DEFAULT else NO_DEFAULT
    if "properties" in node:
        yield from rows(node, path, nested if isinstance(nested, Mapping) else NO_DEFAULT)
    items = node.get("items")
    if isinstance(items, Mapping) and ("properties" in items or "x-kubernetes-validations" in items):
        yield from _node_rows(items, f"{path}[]", False, NO_DEFAULT, NO_DEFAULT)
    values = node.get("additionalProperties")
    if isinstance(values, Mapping) and ("properties" in values or "x-kubernetes-validations" in values):
        yield from _node_rows(values, f"{path}.<key>", False, NO_DEFAULT, NO_DEFAULT)


def _code(value: Any) -> str:
    """A value as code in a table cell. A pipe would end the cell on GitHub and shows escaped on MkDocs, so a value
    holding one is written as HTML, every character Markdown reads inside HTML (a pipe, `[x](y)` of a regex, `*`)
    an entity: both render it as written."""
    text = value if isinstance(value, str) and value else json.dumps(value, separators=(",", ":"))
    if "|" in text:
        return "<code>" + "".join(MARKDOWN_ENTITIES.get(c, c) for c in html.escape(text, quote=False)) + "</code>"
    return f"``{text}``" if "`" in text else f"`{text}`"


def _prose(text: str) -> str:
    """Prose on one line, its angle brackets (`<name>`) not taken for HTML."""
    return html.escape(" ".join(text.split()), quote=False)


def _cell(text: str) -> str:
    """Prose in a table cell: a pipe would end the cell."""
    return _prose(text).replace("|", "\\|")


def _default(value: Any) -> str:
    if value is NO_DEFAULT:
        return ""
    if value is SEE_FIELDS:
        return "see its fields"
    return _code(value)


def field_table(table: list[Row], heading: str = "Field") -> str:
    lines = [f"| {heading} | Type | Default | Validation | Description |", "|---|---|---|---|---|"]
    for row in table:
        if row.path.endswith(("[]", ".<key>")) and not (row.description or row.bounds):
            continue  # a bare item or map value: its fields' rows say it all
        field = f"`{row.path}`" + (" (required)" if row.required else "")
        bounds = "<br>".join(row.bounds)
        cells = (field, _cell(row.type), _default(row.default), bounds, _cell(row.description))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rule_list(table: list[Row]) -> str:
    """Each CEL rule under the field it sits on: its message, then the rule (a list: rules hold pipes)."""
    lines = []
    for row in table:
        for rule in row.rules:
            at = f"`{row.path}`" if row.path else "the resource"
            if rule.get("fieldPath"):
                at += f" (reported at `{rule['fieldPath']}`)"
            message = _prose(str(rule.get("message") or rule.get("messageExpression", "")))
            lines.append(f"- {at}: {message}<br>`{' '.join(str(rule['rule']).split())}`")
    return "\n".join(lines)


def _condition_section(entry: ConditionType) -> str:
    lines = [
        f"### {entry.type}",
        "",
        entry.meaning,
        "",
        f"{entry.at_rest} on a healthy resource with nothing under way. Set by {entry.set_by}.",
        "",
        "| Status | Reasons |",
        "|---|---|",
    ]
    for status in (TRUE, FALSE):
        named = [
            f"any {reason.name} reason" if isinstance(reason, ReasonGroup) else f"`{reason}`"
            for s, reason in entry.reasons
            if s == status
        ]
        if named:
            lines.append(f"| {status} | {', '.join(named)} |")
    return "\n".join(lines)


def _group(group: ReasonGroup) -> str:
    return f"**The {group.name} reasons** ({', '.join(f'`{r}`' for r in group.reasons)}). {group.meaning}\n"


def conditions_section(catalogue: Catalogue) -> str:
    """Each condition type with the reasons it comes with, then what each reason means."""
    reasons = sorted(catalogue.reasons(), key=list(catalogue.meanings).index)
    return "\n".join(
        [
            "## Conditions",
            "",
            "`status.conditions` holds one `metav1.Condition` per type; an absent condition means Unknown. Every "
            "reason the operator can write is here (from `m3fleet.api.conditions`).",
            "",
            "\n\n".join(_condition_section(entry) for entry in catalogue.conditions),
            "",
            "### Reasons",
            "",
            *[_group(group) for group in catalogue.groups],
            "| Reason | Meaning |",
            "|---|---|",
            *[f"| `{reason}` | {_cell(catalogue.meanings[reason])} |" for reason in reasons],
        ]
    )


def crd_reference(kind: str) -> str:
    """The API reference page of one CRD."""
    crd = build_cache_crd() if kind == CACHE_KIND else build_crd()
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    names = crd["spec"]["names"]
    table = list(rows(schema))
    root = Row("", "object", True, NO_DEFAULT, (), "", tuple(schema.get("x-kubernetes-validations") or ()))
    columns = ", ".join(f"`{c['name']}`" for c in version["additionalPrinterColumns"])
    header = [
        f"# {kind} API reference",
        "",
        "<!-- Generated by hack/generate.py from the models in operator/m3fleet/api/. Do not edit. -->",
        "",
        schema["description"],
        "",
        f"- API version: `{crd['spec']['group']}/{version['name']}`, kind `{kind}`, namespaced",
        f"- Names: `{names['plural']}`, short names {', '.join(f'`{n}`' for n in names['shortNames'])}",
        f"- Subresources: {', '.join(f'`{s}`' for s in version['subresources'])}; `kubectl get` columns: {columns}",
        f"- `kubectl explain {names['plural']}.spec` shows the same descriptions from the cluster.",
    ]
    return (
        "\n".join(
            [
                *header,
                "",
                "## Fields",
                "",
                "A path ending in `[]` is an item of a list; `.<key>` is a value of a map.",
                "",
                field_table(table),
                "",
                "## Validation rules",
                "",
                "The API server checks these CEL rules (`x-kubernetes-validations`) on every create and update; "
                "a rule that reads `oldSelf` checks updates only.",
                "",
                rule_list([root, *table]),
                "",
                conditions_section(CATALOGUES[kind]),
            ]
        )
        + "\n"
    )


def values_reference(schema: Mapping[str, Any], values_yaml: str) -> str:
    """The table of a chart's values: each key with its type, its default (from values.yaml), bounds and
    description (from values.schema.json)."""
    defaults = yaml.safe_load(values_yaml) or {}
    return field_table(list(rows(schema, defaults=defaults)), "Key")

"""Generate the CRD from the pydantic models (the models are the single source of truth).

pydantic's JSON Schema uses constructs the apiserver rejects in a structural schema, so the
generator rewrites them: `$ref`/`$defs` are inlined, `anyOf [X, null]` becomes `X`,
`additionalProperties: false` and `title` are dropped, draft-2020 `exclusiveMinimum: n` becomes
OpenAPI v3.0's `minimum: n, exclusiveMinimum: true`, and optional object fields with no required
fields of their own get `default: {}` so the apiserver fills their nested defaults (CEL rules rely on them).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from m3fleet.api.cache import (
    CACHE_KIND,
    CACHE_PLURAL,
    CACHE_SHORT_NAMES,
    CACHE_SINGULAR,
    MiniMaxM3ModelCacheSpec,
    MiniMaxM3ModelCacheStatus,
)
from m3fleet.api.children import KEEP_ABSENT
from m3fleet.api.models import (
    CATEGORIES,
    GROUP,
    KIND,
    PLURAL,
    RESOURCE_VALIDATIONS,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    MiniMaxM3DeploymentSpec,
    MiniMaxM3DeploymentStatus,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
CACHE_CRD_NAME = f"{CACHE_PLURAL}.{GROUP}"

CACHE_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Accelerator", "type": "string", "jsonPath": ".spec.nodes.accelerator"},
    {"name": "Nodes", "type": "string", "jsonPath": ".status.nodesSummary", "description": "ready/total"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Path", "type": "string", "jsonPath": ".spec.path", "priority": 1},
    {"name": "Status", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Degraded")].reason', "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Engine", "type": "string", "jsonPath": ".spec.engine.name"},
    {"name": "Accelerator", "type": "string", "jsonPath": ".spec.accelerator"},
    {"name": "TP", "type": "integer", "jsonPath": ".status.plan.tensorParallelSize"},
    {"name": "Nodes/Replica", "type": "integer", "jsonPath": ".status.plan.nodesPerReplica"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Context", "type": "integer", "jsonPath": ".spec.context.maxModelLen"},
    {
        "name": "Status",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        "priority": 1,
    },
    {
        "name": "P:D",
        "type": "string",
        "jsonPath": ".status.plan.disaggregation.ratio",
        "description": "prefill:decode workers of a disaggregated fleet (spec.disaggregation)",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP = {"title", "$defs", "discriminator"}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            return _structural({**options[0], **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or (key == "default" and value is None):
            continue
        if key == "additionalProperties" and (value is False or value is True or value == {}):
            continue
        if key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
            continue
        if key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
            continue
        out[key] = _structural(value, defs)
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out["type"] = "object"
        out.pop("additionalProperties", None)
        out.pop("items", None) if out.get("type") == "object" else None
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "properties" in out:
        required = set(out.get("required", []))
        for name, prop in out["properties"].items():
            optional_object = prop.get("type") == "object" and "properties" in prop and not prop.get("required")
            # an object that must hold a field (minProperties), or whose `{}` means something (a label selector's
            # "every pod"), has no empty default: absent stays absent
            keeps_absent = prop.pop(KEEP_ABSENT, False) or "minProperties" in prop
            if name not in required and optional_object and "default" not in prop and not keeps_absent:
                prop["default"] = _filled_default(prop)
    return out


def _filled_default(node: dict[str, Any]) -> dict[str, Any]:
    """An optional object's default, with its nested defaults filled in. The apiserver checks a default
    against the schema's CEL rules as written, without defaulting inside it first, so `{}` would fail
    every rule that reads a nested field ("no such key") and the CRD would not install."""
    filled: dict[str, Any] = {}
    for name, prop in (node.get("properties") or {}).items():
        if "default" in prop:
            filled[name] = copy.deepcopy(prop["default"])  # no shared objects: YAML would alias them
    return filled


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    result: dict[str, Any] = _structural(raw, defs)
    return result


def _root_schema(
    spec_model: type[BaseModel], status_model: type[BaseModel], kind: str, description: str, spec_description: str
) -> dict[str, Any]:
    spec = schema_of(spec_model)
    status = schema_of(status_model)
    spec.pop("description", None)
    status.pop("description", None)
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "m3fleet.dev/v1alpha1."},
            "kind": {"type": "string", "description": f"{kind}."},
            # A structural schema may declare only metadata.name and generateName. Declaring both as strings
            # lets the root CEL rules point `fieldPath: .metadata.name` at the name, and bounds their cost
            # (253: the apiserver's own limit for names).
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 253},
                    "generateName": {"type": "string", "maxLength": 253},
                },
            },
            "spec": {**spec, "description": spec_description},
            "status": {**status, "description": "What the operator observed."},
        },
        "x-kubernetes-validations": RESOURCE_VALIDATIONS,
    }


def openapi_schema() -> dict[str, Any]:
    return _root_schema(
        MiniMaxM3DeploymentSpec,
        MiniMaxM3DeploymentStatus,
        KIND,
        "MiniMaxM3Deployment serves MiniMax-M3 on a GPU pool: m3fleet plans the layout, renders "
        "the engine pods, reconciles them and autoscales replicas.",
        "What to serve and how.",
    )


def cache_openapi_schema() -> dict[str, Any]:
    return _root_schema(
        MiniMaxM3ModelCacheSpec,
        MiniMaxM3ModelCacheStatus,
        CACHE_KIND,
        "MiniMaxM3ModelCache stages a MiniMax-M3 checkpoint on the local disks of a GPU pool's "
        "nodes, verifies it, labels the nodes that hold it and pre-pulls the engine images; a "
        "MiniMaxM3Deployment with spec.model.cacheRef mounts that copy.",
        "What to stage where.",
    )


def _crd(
    names: tuple[str, str, str, tuple[str, ...]],
    schema: dict[str, Any],
    subresources: dict[str, Any],
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    kind, plural, singular, short_names = names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "m3fleet"}},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def build_cache_crd() -> dict[str, Any]:
    names = (CACHE_KIND, CACHE_PLURAL, CACHE_SINGULAR, CACHE_SHORT_NAMES)
    return _crd(names, cache_openapi_schema(), {"status": {}}, CACHE_PRINTER_COLUMNS)


def build_crd() -> dict[str, Any]:
    scale = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    return _crd(
        (KIND, PLURAL, SINGULAR, SHORT_NAMES), openapi_schema(), {"status": {}, "scale": scale}, PRINTER_COLUMNS
    )


def crd_yaml(kind: str = KIND) -> str:
    if kind == CACHE_KIND:
        header = "# Generated by `m3fleet crd --kind MiniMaxM3ModelCache` from operator/m3fleet/api/cache.py. "
        return header + "Do not edit by hand.\n" + yaml.safe_dump(build_cache_crd(), sort_keys=False, width=120)
    header = "# Generated by `m3fleet crd` from operator/m3fleet/api/models.py. Do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)

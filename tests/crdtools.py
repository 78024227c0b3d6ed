"""Test-side stand-ins for what the apiserver does with our CRD: defaulting, CEL, schema checks.

kubernetes-validate knows only built-in kinds, so custom resources are checked here: the CRD's
openAPIV3Schema is converted to a strict JSON Schema (unknown fields rejected, as the apiserver
prunes them and `kubectl --validate=strict` rejects them), defaults are applied top-down as the
apiserver does, and every `x-kubernetes-validations` rule is evaluated with cel-python.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
CRD_PATH = ROOT / "crds" / "m3fleet.dev_minimaxm3deployments.yaml"


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def openapi_schema(crd: dict[str, Any] | None = None) -> dict[str, Any]:
    crd = crd or load_crd()
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def strict_jsonschema(node: Any, root: bool = True) -> Any:
    """OpenAPI v3 structural schema -> JSON Schema that rejects unknown fields (except in metadata, whose
    schema may only restrict name and generateName: the rest of ObjectMeta is implied)."""
    if isinstance(node, list):
        return [strict_jsonschema(n, False) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_jsonschema(v, False) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if root and "metadata" in out.get("properties", {}):
        out["properties"]["metadata"] = {**node["properties"]["metadata"], "additionalProperties": True}
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
        out.pop("nullable")
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node and not preserve:
        out["additionalProperties"] = False
    return out


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """The apiserver's structural defaulting: fill absent fields with `default`, then recurse."""
    obj = copy.deepcopy(obj)
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(sub, obj[name])
    if isinstance(obj, list) and "items" in schema:
        obj = [apply_defaults(schema["items"], o) for o in obj]
    return obj


@dataclass(frozen=True)
class Rule:
    path: tuple[str, ...]  # where `self` is, from the resource root
    rule: str
    message: str
    field_path: str = ""  # `fieldPath`, relative to `path` (".a.b")
    reason: str = "FieldValueInvalid"

    @property
    def field(self) -> str:
        """The field a failing rule names, as the apiserver reports it: "spec.rollout.maxUnavailable"."""
        return ".".join((*self.path, *self.field_path.split(".")[1:]))


def rules(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[Rule]:
    for entry in schema.get("x-kubernetes-validations", []):
        yield Rule(
            path,
            entry["rule"],
            entry["message"],
            entry.get("fieldPath", ""),
            entry.get("reason", "FieldValueInvalid"),
        )
    for name, sub in schema.get("properties", {}).items():
        yield from rules(sub, (*path, name))


def schema_at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    """The sub-schema at `path` (property names only), or None when a step is not a declared property
    (what the apiserver's ValidFieldPath checks for a rule's fieldPath)."""
    node: dict[str, Any] | None = schema
    for part in path:
        node = (node or {}).get("properties", {}).get(part)
        if node is None:
            return None
    return node


_ENV = celpy.Environment()


def evaluate(rule: Rule, resource: dict[str, Any]) -> bool | None:
    """True/False for the rule on this resource; None when `self` is absent (the rule does not run)."""
    node: Any = resource
    for part in rule.path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    program = _ENV.program(_ENV.compile(rule.rule))
    return bool(program.evaluate({"self": celpy.json_to_cel(node)}))


def _check(resource: dict[str, Any]) -> tuple[list[tuple[str, str]], list[Rule]]:
    schema = openapi_schema()
    defaulted = apply_defaults(schema, resource)
    validator = jsonschema.Draft202012Validator(strict_jsonschema(schema))
    problems = [(".".join(map(str, e.path)), e.message) for e in validator.iter_errors(defaulted)]
    if problems:  # simplified: the apiserver skips CEL only after type errors, and reports both otherwise
        return problems, []
    return [], [r for r in rules(schema) if evaluate(r, defaulted) is False]


def failed_rules(resource: dict[str, Any]) -> list[Rule]:
    """The CEL rules the resource fails (empty when admitted, or when the schema already rejects it)."""
    return _check(resource)[1]


def admit(resource: dict[str, Any]) -> list[str]:
    """What the apiserver would say: schema errors and failed CEL messages (empty = admitted)."""
    schema_problems, failed = _check(resource)
    return [f"{path}: {message}" for path, message in schema_problems] + [r.message for r in failed]

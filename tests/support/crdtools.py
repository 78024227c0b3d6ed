"""The tests' view of what the apiserver does with our CRD, through the product's own contract.

`m3fleet.api.contract` evaluates the generated CRD's openAPIV3Schema and its CEL rules exactly as the CLI
and the operator do (tests/cluster/test_contract.py holds it against a real kube-apiserver); these helpers
only read the checked-in CRD file and phrase the contract's answers for the tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from m3fleet.api.contract import Rule, judge, rules

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "m3fleet.dev_minimaxm3deployments.yaml"

__all__ = ["CRD_PATH", "Rule", "admit", "failed_rules", "load_crd", "openapi_schema", "rules", "schema_at"]


def load_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return crd


def openapi_schema(crd: dict[str, Any] | None = None) -> dict[str, Any]:
    crd = crd or load_crd()
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def schema_at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    """The sub-schema at `path` (property names; `name[]` steps into a list's items), or None when a step is not
    a declared property (what the apiserver's ValidFieldPath checks for a rule's fieldPath)."""
    node: dict[str, Any] | None = schema
    for part in path:
        node = (node or {}).get("properties", {}).get(part.removesuffix("[]"))
        if node is not None and part.endswith("[]"):
            node = node.get("items")
        if node is None:
            return None
    return node


def failed_rules(resource: dict[str, Any]) -> list[Rule]:
    """The CEL rules the resource fails (empty when admitted, or when the schema already stops CEL)."""
    _, found = judge(resource)
    return [v.rule for v in found if v.rule is not None]


def admit(resource: dict[str, Any]) -> list[str]:
    """What admission would say, one line per problem (empty = admitted)."""
    _, found = judge(resource)
    return [str(v.error) for v in found]

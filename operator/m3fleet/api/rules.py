"""One `x-kubernetes-validations` entry of the CRD (the models and m3fleet.api.children write them)."""

from __future__ import annotations

from typing import Any, Literal

CelReason = Literal["FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"]


def cel(rule: str, message: str, field_path: str | None = None, reason: CelReason | None = None) -> dict[str, Any]:
    """One `x-kubernetes-validations` entry; `fieldPath` points kubectl's error at the field and
    `reason` sets its type (the apiserver's default is FieldValueInvalid)."""
    entry: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    return entry

"""Turn user input into `MiniMaxM3Deployment`s, or into `SpecError`s that name field, reason and fix.

A document is first judged by the CRD's own contract (`m3fleet.api.contract`: the generated schema and its
CEL rules, as admission judges it), then read into the models; the planner's refusals come after both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from m3fleet.api.cache import CACHE_KIND, MiniMaxM3ModelCache
from m3fleet.api.contract import admit, admit_spec, describe
from m3fleet.api.models import API_VERSION, KIND, MiniMaxM3Deployment, MiniMaxM3DeploymentSpec
from m3fleet.errors import SpecError, SpecErrors


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    parts = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(item)
    return ".".join(parts)


# pydantic's error types in plain words: (what is wrong, what would be valid). Only the models' own checks
# that the CRD cannot state reach pydantic (the contract has judged types, bounds and rules already).
_WORDS: dict[str, tuple[str, str]] = {
    "missing": ("is required", "add it"),
    "extra_forbidden": ("is not a field of this object", "remove it or correct its spelling"),
    "int_type": ("must be an integer", "write a whole number without quotes, e.g. 8"),
    "int_parsing": ("must be an integer", "write a whole number without quotes, e.g. 8"),
    "int_from_float": ("must be a whole number", "write it without a fraction, e.g. 8"),
    "float_type": ("must be a number", "write a number without quotes, e.g. 0.8"),
    "float_parsing": ("must be a number", "write a number without quotes, e.g. 0.8"),
    "bool_type": ("must be true or false", "write true or false without quotes"),
    "bool_parsing": ("must be true or false", "write true or false without quotes"),
    "string_type": ("must be a string", "write text (quote it if it looks like a number)"),
    "dict_type": ("must be a mapping of fields", "write `field: value` pairs indented under it"),
    "model_type": ("must be a mapping of fields", "write `field: value` pairs indented under it"),
    "model_attributes_type": ("must be a mapping of fields", "write `field: value` pairs indented under it"),
    "list_type": ("must be a list", "write a list, e.g. [a, b]"),
    "string_too_short": ("is too short", "give a non-empty value"),
    "string_pattern_mismatch": ("has the wrong format", "see `kubectl explain minimaxm3deployment.spec`"),
}


def _problem_and_fix(error: Mapping[str, Any]) -> tuple[str, str]:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "m3fleet":  # the model's own rules (m3fleet.api.models.invalid) carry their fix
        return str(ctx.get("problem", error["msg"])), str(ctx.get("fix", "correct the value"))
    if kind == "enum":
        return "is not supported", f"use one of {ctx.get('expected', '')}".replace("'", "")
    if kind in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        return (
            "is too small",
            f"use a value {'of at least' if kind == 'greater_than_equal' else 'greater than'} {bound}",
        )
    if kind in ("less_than_equal", "less_than"):
        bound = ctx.get("le", ctx.get("lt"))
        return "is too large", f"use a value {'of at most' if kind == 'less_than_equal' else 'less than'} {bound}"
    if kind in ("string_too_long", "too_long"):
        limit = ctx.get("max_length")
        return "is too long", f"shorten it to at most {limit}" if limit is not None else "shorten it"
    if kind == "too_short":
        return "has too few items", f"give at least {ctx.get('min_length', 1)}"
    if kind in _WORDS:
        return _WORDS[kind]
    return "is not valid here", "see `kubectl explain minimaxm3deployment.spec` for what the field takes"


def spec_errors(exc: ValidationError, prefix: str) -> SpecErrors:
    errors = []
    for err in exc.errors(include_url=False):
        named = (err.get("ctx") or {}).get("field")  # a model-level rule about one of the model's fields
        field = _path(prefix, (*err["loc"], *([named] if named else [])))
        value = err.get("input")
        problem, fix = _problem_and_fix(err)
        shown = "" if err["type"] == "missing" or isinstance(value, dict | list) else f"{describe(value)} "
        errors.append(SpecError(field, f"{shown}{problem}", fix))
    return SpecErrors(errors)


def parse_spec(spec: Any) -> MiniMaxM3DeploymentSpec:
    """Validate a `spec` mapping (as the operator receives it). Raises SpecErrors."""
    if not isinstance(spec, Mapping):
        raise SpecErrors(
            [
                SpecError(
                    "spec", f"must be a mapping of fields, not {describe(spec)}", "add a spec (see manifests/samples)"
                )
            ]
        )
    try:
        return MiniMaxM3DeploymentSpec.model_validate(admit_spec(spec))
    except ValidationError as exc:
        raise spec_errors(exc, "spec") from None


def _admitted(doc: Any, kind: str) -> dict[str, Any]:
    """The document judged by its kind's CRD, as admission judges it (decoding, defaults, schema, CEL)."""
    if not isinstance(doc, Mapping):
        raise SpecErrors(
            [SpecError("(document)", f"is {describe(doc)}, not a mapping", f"give a {kind} manifest (a mapping)")]
        )
    for field, value, expected in (("apiVersion", doc.get("apiVersion"), API_VERSION), ("kind", doc.get("kind"), kind)):
        if value != expected:
            raise SpecErrors(
                [
                    SpecError(
                        field,
                        f"is {describe(value)}: this is not a {API_VERSION} {kind}",
                        f"set apiVersion: {API_VERSION} and kind: {kind}",
                    )
                ]
            )
    return admit(doc)


def parse_resource(doc: Any) -> MiniMaxM3Deployment:
    """Validate one whole manifest as admission would, then read it. Raises SpecErrors (every problem)."""
    admitted = _admitted(doc, KIND)
    try:
        return MiniMaxM3Deployment.model_validate(admitted)
    except ValidationError as exc:
        raise spec_errors(exc, "") from None


def parse_cache(doc: Any) -> MiniMaxM3ModelCache:
    """Validate one MiniMaxM3ModelCache manifest by its CRD (the same contract as a deployment), then read it.
    Raises SpecErrors (every problem)."""
    admitted = _admitted(doc, CACHE_KIND)
    try:
        return MiniMaxM3ModelCache.model_validate(admitted)
    except ValidationError as exc:
        raise spec_errors(exc, "") from None

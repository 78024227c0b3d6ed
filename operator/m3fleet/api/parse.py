"""Turn user input into `MiniMaxM3Deployment`s, or into `SpecError`s that name field, reason and fix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from m3fleet.api.cache import CACHE_KIND, MiniMaxM3ModelCache
from m3fleet.api.models import API_VERSION, KIND, MiniMaxM3Deployment, MiniMaxM3DeploymentSpec, ObjectMeta
from m3fleet.errors import SpecError, SpecErrors


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    parts = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(item)
    return ".".join(parts)


def _fix_for(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if "fix" in ctx:  # the model's own rules (m3fleet.api.models.invalid) carry their fix
        return str(ctx["fix"])
    if kind == "extra_forbidden":
        return "remove it or correct its spelling (kubectl explain minimaxm3deployment.spec lists the fields)"
    if kind == "missing":
        return "add it"
    if kind == "enum":
        return f"use one of {ctx.get('expected', '')}"
    if kind in ("greater_than_equal", "greater_than"):
        return f"use a value {'>=' if kind == 'greater_than_equal' else '>'} {ctx.get('ge', ctx.get('gt'))}"
    if kind in ("less_than_equal", "less_than"):
        return f"use a value {'<=' if kind == 'less_than_equal' else '<'} {ctx.get('le', ctx.get('lt'))}"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"give a {kind.split('_')[0]}"
    if kind in ("string_too_long", "too_long"):
        return "shorten it"
    if kind in ("string_too_short", "too_short"):
        return "give a non-empty value"
    return "correct the value"


def spec_errors(exc: ValidationError, prefix: str) -> SpecErrors:
    errors = []
    for err in exc.errors(include_url=False):
        named = (err.get("ctx") or {}).get("field")  # a model-level rule about one of the model's fields
        field = _path(prefix, (*err["loc"], *([named] if named else [])))
        value = err.get("input")
        shown = "" if err["type"] == "missing" or isinstance(value, dict | list) else f"{value!r} "
        message = err["msg"] if err["type"] == "m3fleet" else f"{err['msg'][0].lower()}{err['msg'][1:]}"
        errors.append(SpecError(field, f"{shown}{message}", _fix_for(err)))
    return SpecErrors(errors)


def parse_spec(spec: Any) -> MiniMaxM3DeploymentSpec:
    """Validate a `spec` mapping (as the operator receives it). Raises SpecErrors."""
    if not isinstance(spec, Mapping):
        raise SpecErrors([SpecError("spec", "is missing or not a mapping", "add a spec (see manifests/samples)")])
    try:
        return MiniMaxM3DeploymentSpec.model_validate(dict(spec))
    except ValidationError as exc:
        raise spec_errors(exc, "spec") from None


def parse_resource(doc: Any) -> MiniMaxM3Deployment:
    """Validate one whole manifest. Raises SpecErrors (several problems are reported at once)."""
    if not isinstance(doc, Mapping):
        raise SpecErrors([SpecError("(document)", "is not a mapping", f"give a {KIND} manifest")])
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if kind != KIND or api_version != API_VERSION:
        raise SpecErrors(
            [
                SpecError(
                    "kind" if kind != KIND else "apiVersion",
                    f"{api_version}/{kind} is not a {API_VERSION} {KIND}",
                    f"set apiVersion: {API_VERSION} and kind: {KIND}",
                )
            ]
        )
    errors: list[SpecError] = []
    try:
        spec = parse_spec(doc.get("spec"))
    except SpecErrors as exc:
        errors.extend(exc.errors)
    meta = doc.get("metadata") or {}
    if not isinstance(meta, Mapping) or not meta.get("name"):
        errors.append(SpecError("metadata.name", "is missing", "give the resource a name"))
    else:
        try:
            ObjectMeta.model_validate(dict(meta))
        except ValidationError as exc:
            errors.extend(spec_errors(exc, "metadata").errors)
    if errors:
        raise SpecErrors(errors)
    try:
        return MiniMaxM3Deployment.model_validate(
            {
                "apiVersion": api_version,
                "kind": kind,
                "metadata": dict(meta),
                "spec": spec.model_dump(by_alias=True),
            }
        )
    except ValidationError as exc:
        raise spec_errors(exc, "") from None


def parse_cache(doc: Any) -> MiniMaxM3ModelCache:
    """Validate one MiniMaxM3ModelCache manifest. Raises SpecErrors."""
    if not isinstance(doc, Mapping) or doc.get("kind") != CACHE_KIND or doc.get("apiVersion") != API_VERSION:
        raise SpecErrors([SpecError("kind", "is not a MiniMaxM3ModelCache", f"set apiVersion: {API_VERSION}")])
    meta = doc.get("metadata") or {}
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise SpecErrors([SpecError("metadata.name", "is missing", "give the cache a name")])
    try:
        return MiniMaxM3ModelCache.model_validate(
            {"apiVersion": API_VERSION, "kind": CACHE_KIND, "metadata": dict(meta), "spec": doc.get("spec")}
        )
    except ValidationError as exc:
        raise spec_errors(exc, "") from None

"""Whose object is it? The one rule for touching an existing object that has a child's name. Pure.

m3fleet changes, mounts or deletes an object only when it carries a controller owner reference to this
very resource (its UID, not only its name: a deleted and re-created resource of the same name is another
owner). Anything else with a child's name — made by hand, by another tool, by another resource, or left
over from a deleted resource whose garbage collection is still running — is foreign: it is reported as a
`NameConflict` (m3fleet.api.conditions) and left exactly as it is, and nothing else of the fleet is applied until
the name is free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with `controller: true`, if any (Kubernetes allows at most one)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` is controlled by the resource with this UID: the only objects m3fleet may change or delete."""
    ref = controller_of(obj)
    return bool(uid) and ref is not None and ref.get("uid") == uid


@dataclass(frozen=True)
class NameConflict:
    """An existing object with a child's name that this resource does not control."""

    kind: str
    namespace: str
    name: str
    holder: str  # who controls it, in words

    def describe(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name} already exists and {self.holder}"


def conflict(kind: str, existing: Mapping[str, Any] | None, uid: str, resource_name: str) -> NameConflict | None:
    """None when the name is free (`existing` is None) or the object is controlled by the resource with this
    UID; else what holds the name (`resource_name`: this resource's name, to recognise a predecessor)."""
    if existing is None or controlled_by(existing, uid):
        return None
    meta = existing.get("metadata") or {}
    ref = controller_of(existing)
    if ref is None:
        holder = "has no controller (it was not created by this MiniMaxM3Deployment)"
    elif ref.get("kind") == "MiniMaxM3Deployment" and ref.get("name") == resource_name:
        holder = (
            f"is controlled by an earlier MiniMaxM3Deployment of the same name (uid {ref.get('uid')}), which "
            "was deleted; garbage collection removes it"
        )
    else:
        holder = f"is controlled by {ref.get('kind')}/{ref.get('name')}"
    return NameConflict(kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""), holder)


def conflict_message(conflicts: Iterable[NameConflict]) -> str:
    """The Degraded message: what holds which name, what m3fleet does about it (nothing) and the fix."""
    found = list(conflicts)
    if not found:
        raise ValueError("conflict_message needs at least one conflict")
    what = "; ".join(c.describe() for c in found)
    deletes = ", ".join(f"kubectl -n {c.namespace} delete {c.kind.lower()} {c.name}" for c in found)
    return (
        f"{what}. m3fleet never changes, mounts or deletes an object it does not control, so nothing is "
        f"applied until the name is free; fix: delete or rename the other object ({deletes}) or give this "
        "MiniMaxM3Deployment another name. The operator checks again every few seconds."
    )

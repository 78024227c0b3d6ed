"""The pure ownership rule: only an object controlled by this resource's UID is ours to change or delete."""

from __future__ import annotations

from typing import Any

import pytest

from m3fleet.render.ownership import NameConflict, conflict, conflict_message, controlled_by

UID = "3f1c0d6e-0000-4000-8000-000000000001"


def obj(name: str = "chat-api", *refs: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "llm"}
    if refs:
        meta["ownerReferences"] = list(refs)
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta}


def ref(
    uid: str = UID, *, controller: bool | None = True, kind: str = "MiniMaxM3Deployment", name: str = "chat"
) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "m3fleet.dev/v1alpha1", "kind": kind, "name": name, "uid": uid}
    if controller is not None:
        out["controller"] = controller
    return out


def test_ours_only_with_a_controller_reference_to_our_uid() -> None:
    assert controlled_by(obj("chat-api", ref()), UID)
    assert not controlled_by(obj("chat-api"), UID)  # made by hand
    assert not controlled_by(obj("chat-api", ref(controller=False)), UID)  # only an owner, not the controller
    assert not controlled_by(obj("chat-api", ref(controller=None)), UID)
    assert not controlled_by(obj("chat-api", ref("another-uid")), UID)  # same name, another resource
    assert not controlled_by(obj("chat-api", ref()), "")  # no uid never matches a reference without one
    assert not controlled_by({"metadata": {"ownerReferences": [{"controller": True}]}}, "")


def test_a_free_name_or_our_own_object_is_no_conflict() -> None:
    assert conflict("Service", None, UID, "chat") is None
    assert conflict("Service", obj("chat-api", ref(controller=False, uid="x"), ref()), UID, "chat") is None


@pytest.mark.parametrize(
    ("existing", "holder"),
    [
        (obj("chat-api"), "has no controller"),
        (obj("chat-api", ref(controller=False)), "has no controller"),
        (obj("chat-api", ref("old-uid")), "earlier MiniMaxM3Deployment of the same name (uid old-uid)"),
        (obj("chat-api", ref("x", kind="Deployment", name="web")), "is controlled by Deployment/web"),
        (obj("chat-api", ref("x", name="other")), "is controlled by MiniMaxM3Deployment/other"),
    ],
)
def test_a_foreign_object_is_a_conflict_saying_who_holds_the_name(existing: dict[str, Any], holder: str) -> None:
    found = conflict("Service", existing, UID, "chat")
    assert found is not None
    assert (found.kind, found.namespace, found.name) == ("Service", "llm", "chat-api")
    assert holder in found.holder


def test_the_message_names_each_object_and_the_fix() -> None:
    conflicts = [
        NameConflict("Service", "llm", "chat-api", "has no controller"),
        NameConflict("ConfigMap", "llm", "chat-engine-config", "is controlled by Deployment/web"),
    ]
    message = conflict_message(conflicts)
    assert "Service llm/chat-api already exists and has no controller" in message
    assert "ConfigMap llm/chat-engine-config already exists and is controlled by Deployment/web" in message
    assert "kubectl -n llm delete service chat-api, kubectl -n llm delete configmap chat-engine-config" in message
    assert "never changes, mounts or deletes" in message and "fix:" in message
    with pytest.raises(ValueError):
        conflict_message([])

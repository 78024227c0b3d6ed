"""kopf wiring: which events call the reconciler, and the operator's settings, made explicit.

Handlers only read, call the core (through `Reconciler`), apply and report; they return nothing, so
kopf's bookkeeping never leaks into `status`. There is no delete handler, so kopf adds no finalizer:
children go by garbage collection and deletion never waits for the operator.
"""

from __future__ import annotations

from typing import Any

import kopf

from m3fleet.api.models import GROUP, PLURAL, VERSION
from m3fleet.controller import kube
from m3fleet.controller.kube import KubeApi
from m3fleet.controller.reconcile import Reconciler
from m3fleet.render.labels import MANAGED_BY, MANAGER

PREFIX = "m3fleet.dev"
RESYNC_SECONDS = 600.0  # level-triggered safety net; writes nothing when nothing changed


def configure(settings: kopf.OperatorSettings, *, peering_name: str = "m3fleet") -> None:
    """Every setting the operator depends on, in one place (conventions, habit 10)."""
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = 20  # logging.INFO: Applied / Pruned / InvalidSpec events reach `kubectl describe`
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.peering.name = peering_name
    settings.peering.mandatory = False  # without the peering CRDs a single replica still runs
    settings.execution.max_workers = 8


def _controller_owner(body: kopf.Body) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == kube.M3D.kind and ref.get("apiVersion") == kube.M3D.api_version:
            name: str = ref["name"]
            return name
    return None


def register(registry: kopf.OperatorRegistry, api: KubeApi, *, resync_seconds: float = RESYNC_SECONDS) -> Reconciler:
    reconciler = Reconciler(api)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, peering_name=settings.peering.name or "m3fleet")

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    async def reconcile(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        await reconciler.reconcile(body, logger)

    @kopf.timer(GROUP, VERSION, PLURAL, interval=resync_seconds, initial_delay=resync_seconds, registry=registry)
    async def resync(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        await reconciler.reconcile(body, logger)

    # A child's readiness changes the parent's status: re-reconcile the parent on workload events.
    @kopf.on.event("apps", "v1", "deployments", labels={MANAGED_BY: MANAGER}, registry=registry)
    @kopf.on.event(
        "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", labels={MANAGED_BY: MANAGER}, registry=registry
    )
    async def child_changed(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        owner = _controller_owner(body)
        if owner is not None:
            await reconciler.reconcile_by_name(body["metadata"]["namespace"], owner, logger)

    return reconciler

"""kopf wiring: which events call the reconciler, and the operator's settings, made explicit.

Handlers only read, call the core (through `Reconciler`), apply and report; they return nothing, so
kopf's bookkeeping never leaks into `status`. There is no delete handler and no kopf timer or daemon
(kopf puts its finalizer on every object a timer serves), so kopf adds no finalizer: children go by
garbage collection and deletion never waits for the operator. The periodic resync and the autoscaler
are operator-wide tasks instead, over the resources the watch has seen.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from m3fleet.api.models import GROUP, PLURAL, VERSION
from m3fleet.controller import kube
from m3fleet.controller.autoscaler import AdapterFactory, Autoscaler, prometheus_adapter
from m3fleet.controller.autoscaler import run_forever as run_autoscaler
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


async def _resync_forever(
    reconciler: Reconciler, known: set[tuple[str, str]], interval: float, logger: logging.Logger
) -> None:
    """Reconcile every known resource every `interval` seconds (writes nothing when nothing changed)."""
    while True:
        await asyncio.sleep(interval)
        for namespace, name in sorted(known):
            try:
                await reconciler.reconcile_by_name(namespace, name, logger)
            except Exception as exc:  # one failing resource must not stop the resync of the others
                logger.warning("Resync of %s/%s failed: %s", namespace, name, exc)


def register(
    registry: kopf.OperatorRegistry,
    api: KubeApi,
    *,
    resync_seconds: float = RESYNC_SECONDS,
    adapters: AdapterFactory = prometheus_adapter,
) -> Reconciler:
    reconciler = Reconciler(api)
    autoscaler = Autoscaler(api, reconciler, adapters=adapters)
    known: set[tuple[str, str]] = set()  # (namespace, name) of every resource the watch shows
    background: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, peering_name=settings.peering.name or "m3fleet")

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        background.clear()

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    async def reconcile(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        await reconciler.reconcile(body, logger)

    # The resync's index; an event handler, unlike a kopf timer, needs no finalizer.
    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def track(type: str | None, body: kopf.Body, **_: Any) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if type == "DELETED":
            known.discard(key)
        else:
            known.add(key)
        if not background:  # started from a handler: they inherit kopf's event-posting context (kopf.info)
            resync = _resync_forever(reconciler, known, resync_seconds, logging.getLogger("m3fleet.resync"))
            background.append(asyncio.create_task(resync, name="m3fleet resync"))
            scaling = run_autoscaler(autoscaler, known, logging.getLogger("m3fleet.autoscaler"))
            background.append(asyncio.create_task(scaling, name="m3fleet autoscaler"))

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

"""kopf wiring: which watch events reach the `Manager`, and the operator's settings, made explicit.

Only `on.event` handlers, which only enqueue: kopf runs no create/update/resume handlers, so it writes
nothing to the resource (no diff-base or progress annotations, no finalizer), and there is no delete
handler, timer or daemon (those need finalizers): children go by garbage collection and deletion never
waits for the operator. Reconciles, retries and autoscaler ticks all run from the manager's one queue.
The validating admission webhook (`m3fleet run --webhook-port`) is wired in `webhook.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kopf

from m3fleet import kubeapi
from m3fleet.api.cache import CACHE_PLURAL
from m3fleet.api.models import GROUP, PLURAL, VERSION
from m3fleet.controller.cache import CacheManager
from m3fleet.controller.manager import Manager
from m3fleet.render.labels import MANAGED_BY, MANAGER

PEERING_NAME = "m3fleet"


def configure(settings: kopf.OperatorSettings, peering_lifetime: int) -> None:
    """Every setting the operator depends on, in one place."""
    settings.posting.level = 20  # logging.INFO: Applied / Pruned / InvalidSpec events reach `kubectl describe`
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.peering.name = PEERING_NAME
    settings.peering.mandatory = False  # without the peering CRDs a single replica still runs
    settings.peering.lifetime = peering_lifetime  # written into our record: how long peers trust it unrenewed
    # watch only our own children, the cache's Jobs/DaemonSets and pods, filtered by the API server
    for kind in (*kubeapi.CHILD_KINDS, kubeapi.JOB, kubeapi.DAEMON_SET, kubeapi.POD):
        settings.watching.label_selectors[kind.group, version_of(kind), kind.plural] = f"{MANAGED_BY}={MANAGER}"


def version_of(kind: kubeapi.Kind) -> str:
    return kind.api_version.rpartition("/")[2]


def register(
    registry: kopf.OperatorRegistry, manager: Manager, caches: CacheManager | None, peering_lifetime: int
) -> None:
    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, peering_lifetime)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await manager.stop()
        if caches is not None:
            await caches.stop()

    def start() -> None:
        """Both queues, and the peering gate that resumes them, start with the first event of either kind: the
        tasks must inherit kopf's context, and a model cache is staged before any deployment exists."""
        manager.start()
        if caches is not None:
            caches.start()

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def resource_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        start()
        manager.resource_event(type, body)
        if caches is not None:
            caches.deployment_event(type, body)

    if caches is not None:
        register_caches(registry, caches, start)

    async def child_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        manager.child_event(type, body)

    for kind in kubeapi.CHILD_KINDS:
        kopf.on.event(
            kind.group, version_of(kind), kind.plural, labels={MANAGED_BY: MANAGER}, registry=registry, id="child"
        )(child_event)

    # Engine pods (grandchildren, no owner reference to the resource) carry its name as a label; their
    # scheduling and readiness changes are what a rollout's status reports.
    @kopf.on.event("", "v1", "pods", labels={MANAGED_BY: MANAGER}, registry=registry)
    async def pod_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        manager.pod_event(type, body)
        if caches is not None:
            caches.pod_event(type, body)


def register_caches(registry: kopf.OperatorRegistry, caches: CacheManager, start: Callable[[], None]) -> None:
    """MiniMaxM3ModelCaches, their Jobs and DaemonSets (labelled), and every node (a node joining the pool is
    staged at once; the manager ignores status heartbeats)."""

    @kopf.on.event(GROUP, VERSION, CACHE_PLURAL, registry=registry)
    async def cache_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        start()
        caches.cache_event(type, body)

    async def cache_child_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        caches.child_event(type, body)

    for kind in (kubeapi.JOB, kubeapi.DAEMON_SET):
        kopf.on.event(
            kind.group, version_of(kind), kind.plural, labels={MANAGED_BY: MANAGER}, registry=registry, id="cache"
        )(cache_child_event)

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        caches.node_event(type, body)

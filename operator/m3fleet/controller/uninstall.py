"""`m3fleet release-caches`: what `helm uninstall` runs first (the chart's pre-delete hook), as the operator's
own ServiceAccount while its RBAC still exists.

With no operator left, a MiniMaxM3ModelCache's finalizer would hold its namespace's deletion for ever and its node
labels would outlive it. So, in this order: stop the operator (its Deployment scaled to 0, its pods gone: a running
peer would put back what is released), then for every cache in scope take its label off every node and drop its
finalizer (`m3fleet.cache.plan.let_go` decides). The staged files, the cache objects and the CRDs stay. Running it
again changes nothing. Not done at the operator's SIGTERM: `helm uninstall` deletes the ServiceAccount and its
bindings in the same breath as the Deployment, so a terminating pod may no longer write anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from m3fleet import kubeapi
from m3fleet.api.cache import node_label_key
from m3fleet.cache.plan import let_go
from m3fleet.controller.cache import node_view
from m3fleet.controller.reconcile import utc_now
from m3fleet.kubeapi import ApiError, KubeApi

STOP_SECONDS = 120.0  # the operator's pods are gone within their grace period (30 s by default)
RELEASED = "Released"  # the Event's reason
CONFLICT_TRIES = 5  # a cache changed between read and write (its status): read it again

log = logging.getLogger(__name__)


class ReleaseError(Exception):
    """The operator did not stop: nothing was released (a running operator would put it back)."""


async def stop_operator(api: KubeApi, namespace: str, deployment: str, timeout: float = STOP_SECONDS) -> None:
    """Scale the operator's Deployment to 0 and wait until its pods are gone; if they are not, scale it back."""
    body = await api.get(kubeapi.DEPLOYMENT, namespace, deployment)
    if body is None:
        return  # no operator of this release runs
    replicas = int((body.get("spec") or {}).get("replicas") or 0)
    labels = body["spec"]["selector"].get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    await api.merge_patch(kubeapi.DEPLOYMENT, namespace, deployment, {"spec": {"replicas": 0}})
    log.info("Scaled Deployment %s/%s to 0 (was %d): no operator may put back what is released", namespace,
             deployment, replicas)  # fmt: skip
    deadline = time.monotonic() + timeout
    while pods := await api.list(kubeapi.POD, namespace, selector):
        if time.monotonic() > deadline:
            await api.merge_patch(kubeapi.DEPLOYMENT, namespace, deployment, {"spec": {"replicas": replicas}})
            names = ", ".join(p["metadata"]["name"] for p in pods)
            raise ReleaseError(
                f"the operator's pods ({names}) did not stop within {timeout:.0f} s; nothing was released and "
                f"Deployment {namespace}/{deployment} is back at {replicas} replica(s); see why with "
                f"kubectl -n {namespace} describe pod {pods[0]['metadata']['name']}, then run helm uninstall again"
            )
        await asyncio.sleep(1.0)


async def release_caches(api: KubeApi, scope: str | None) -> list[str]:
    """Every cache in `scope` (None: all namespaces) let go; returns one line per cache that changed."""
    nodes = [node_view(n, time.time()) for n in await api.list(kubeapi.NODE, None)]
    said = []
    for cache in await api.list(kubeapi.CACHE, scope):
        if (line := await _let_go(api, cache, nodes)) is not None:
            said.append(line)
    return said


async def _let_go(api: KubeApi, cache: dict[str, Any], nodes: list[Any]) -> str | None:
    namespace, name = cache["metadata"]["namespace"], cache["metadata"]["name"]
    label = node_label_key(namespace, name)
    for _ in range(CONFLICT_TRIES):
        meta = cache["metadata"]
        letting = let_go(namespace, name, meta.get("finalizers") or [], nodes)
        for node in letting.unlabel:
            await api.merge_patch(kubeapi.NODE, None, node, {"metadata": {"labels": {label: None}}})
        if letting.finalizers is not None:
            patch = {"metadata": {"finalizers": letting.finalizers or None, "resourceVersion": meta["resourceVersion"]}}
            try:
                await api.merge_patch(kubeapi.CACHE, namespace, name, patch)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                fresh = await api.get(kubeapi.CACHE, namespace, name)
                if fresh is None:
                    return None
                cache, nodes = fresh, [n for n in nodes if n.name not in letting.unlabel]
                continue
        if not letting.unlabel and letting.finalizers is None:
            return None
        line = (
            f"Released MiniMaxM3ModelCache {namespace}/{name}: label {label} off {len(letting.unlabel)} node(s)"
            f"{', finalizer dropped' if letting.finalizers is not None else ''}; its files on the nodes and the "
            "cache object are kept"
        )
        log.info(line)
        await _event(api, cache, line)
        return line
    raise ReleaseError(f"MiniMaxM3ModelCache {namespace}/{name} kept changing; run helm uninstall again")


async def _event(api: KubeApi, cache: dict[str, Any], message: str) -> None:
    """An Event on the cache (`kubectl describe m3cache`): what `helm uninstall` did to it and what it kept."""
    meta, now = cache["metadata"], utc_now()
    await api.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": kubeapi.CACHE.api_version,
                "kind": kubeapi.CACHE.kind,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": "Normal",
            "reason": RELEASED,
            "message": message,
            "source": {"component": "m3fleet"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
    )


async def release(api: KubeApi, scope: str | None, namespace: str, deployment: str) -> list[str]:
    await stop_operator(api, namespace, deployment)
    return await release_caches(api, scope)

"""Time-to-ready of new replicas: read pods and events, measure (pure: autoscaling/time_to_ready.py), record.

The manager asks for a measurement when a watched engine pod is ready and not yet counted in the
resource's `status.timeToReady` (also for the pods kopf lists when it starts, so replicas that became
ready while the operator was down are measured once it is back). One measurement lists the resource's
pods; only when a replica is new does it list the kubelet's `Pulled` events of the namespace (the image
phase) and write `status.timeToReady`. The histograms are observed after that write succeeded, so a
failed write and its retry never count a replica twice, and neither does a restarted operator: status
says which replicas are counted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from m3fleet import kubeapi
from m3fleet.autoscaling import time_to_ready
from m3fleet.controller import metrics
from m3fleet.controller.decide import Understood
from m3fleet.kubeapi import KubeApi
from m3fleet.render import labels

PULLED_EVENTS = "involvedObject.kind=Pod,reason=Pulled"

log = logging.getLogger(__name__)


def counted(body: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether this pod is ready and not yet counted in `status.timeToReady` (then a measurement is due)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    if not ready or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return True
    record = time_to_ready.Record.from_status((body.get("status") or {}).get("timeToReady"))
    return record.knows(str(pod["metadata"].get("uid") or ""))


@dataclass
class TimeToReadyRecorder:
    api: KubeApi

    async def measure(self, body: Mapping[str, Any], understood: Understood) -> dict[str, Any] | None:
        """Measure the replicas of one resource that became ready since its status last said (`understood`: its spec
        parsed and planned; a resource the operator cannot plan has nothing to measure); the resource as the status
        write returned it (None: nothing new, or it is gone)."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if understood.plan is None or meta.get("deletionTimestamp"):
            return None
        size = understood.plan.nodes_per_replica  # pods per replica
        previous = time_to_ready.Record.from_status((body.get("status") or {}).get("timeToReady"))
        pods = await self.api.list(kubeapi.POD, namespace, labels.owned_selector(name))
        if not time_to_ready.unmeasured(pods, previous, size):
            return None
        events = await self.api.list(kubeapi.EVENT, namespace, field_selector=PULLED_EVENTS)
        measured = time_to_ready.record(previous, pods, events, size)
        written = await self.api.patch_status(namespace, name, {"timeToReady": measured.record.to_status()})
        if written is None:
            return None
        for sample in measured.new:
            metrics.TIME_TO_READY.labels(namespace, name).observe(sample.seconds)
            for phase, seconds in sample.phases.items():
                if seconds is not None:
                    metrics.TIME_TO_READY_PHASE.labels(namespace, name, phase).observe(seconds)
            log.info(
                "%s/%s: replica %s ready in %.0f s (%s)",
                namespace,
                name,
                sample.replica,
                sample.seconds,
                ", ".join(f"{k} {v:.0f} s" for k, v in sample.phases.items() if v is not None),
            )
        return written

"""Pods and kubelet events as the API server returns them, at times T0 + seconds (the readiness and policy tests)."""

from __future__ import annotations

from typing import Any

T0 = 1_800_000_000.0  # a round Unix time; every timestamp below is T0 + seconds


def ts(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(T0 + seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str,
    *,
    created: float = 0,
    scheduled: float | None = None,
    started: float | None = None,
    ready: float | None = None,
    first_start: float | None = None,
    restarts: int = 0,
    group: str | None = None,
    role: str = "single",
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A pod as the API server returns it (the kubelet's conditions and containerStatuses)."""
    conditions: list[dict[str, Any]] = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(scheduled)})
    elif unschedulable:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": ts(created),
                "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
            }
        )
    if scheduled is not None:
        conditions.append({"type": "Initialized", "status": "True", "lastTransitionTime": ts(scheduled)})
        conditions.append(
            {
                "type": "Ready",
                "status": "True" if ready is not None else "False",
                "lastTransitionTime": ts(ready or scheduled),
            }
        )
    statuses: list[dict[str, Any]] = []
    if started is not None:
        entry: dict[str, Any] = {
            "name": "engine",
            "image": "vllm/vllm-openai:v0.33.0",
            "ready": ready is not None,
            "restartCount": restarts,
            "started": True,
            "state": {"running": {"startedAt": ts(started)}},
        }
        if first_start is not None:
            entry["lastState"] = {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "startedAt": ts(first_start),
                    "finishedAt": ts(started - 5),
                }
            }
        statuses.append(entry)
    elif scheduled is not None:
        statuses.append(
            {
                "name": "engine",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
        )
    labels = {"app.kubernetes.io/managed-by": "m3fleet", "m3fleet.dev/name": "chat", "m3fleet.dev/role": role}
    if group is not None:
        labels["leaderworkerset.sigs.k8s.io/group-key"] = group
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "llm",
            "uid": f"uid-{name}",
            "creationTimestamp": ts(created),
            "labels": labels,
        },
        "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.33.0"}]},
        "status": {
            "phase": "Running" if started is not None else "Pending",
            "conditions": conditions,
            "containerStatuses": statuses,
        },
    }


def pulled(name: str, at: float, message: str) -> dict[str, Any]:
    """A kubelet `Pulled` event (core/v1) for the pod's engine container."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.18a", "namespace": "llm"},
        "involvedObject": {
            "kind": "Pod",
            "namespace": "llm",
            "name": name,
            "uid": f"uid-{name}",
            "fieldPath": "spec.containers{engine}",
        },
        "reason": "Pulled",
        "message": message,
        "source": {"component": "kubelet", "host": "gpu-node-1"},
        "firstTimestamp": ts(at),
        "lastTimestamp": ts(at),
        "count": 1,
        "type": "Normal",
    }

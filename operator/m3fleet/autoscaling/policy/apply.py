"""What the operator does with decisions: the replica count it applies, the pods' removal costs on a scale-down,
and whether a decision is worth a status write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from m3fleet.api.models import AutoscalingMode, MiniMaxM3DeploymentSpec
from m3fleet.autoscaling.policy.gateway import GATEWAY_WARMING_UP
from m3fleet.autoscaling.signals import ReplicaSignals
from m3fleet.autoscaling.time_to_ready import epoch

# Read by the ReplicaSet controller when it picks the pods a scale-down deletes: the lowest cost goes first
# (an integer in a string; an unannotated pod counts 0). Not-ready pods go before any ready one whatever it says.
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
INT32_MAX = 2**31 - 1


def removal_costs(fresh: Sequence[ReplicaSignals], plan_capacity: float) -> dict[str, int]:
    """What removing each measured replica costs: the KV tokens resident on it, i.e. the work a drain must finish
    or cut short. The replica holding the least goes first, as the simulator drains; left to itself the ReplicaSet
    deletes the newest ready pod, whatever it holds."""
    costs: dict[str, int] = {}
    for replica in fresh:
        resident = replica.used_tokens(plan_capacity)
        if resident is not None:
            costs[replica.replica] = min(INT32_MAX, max(0, round(resident)))
    return costs


def replicas_to_apply(spec: MiniMaxM3DeploymentSpec, status: Mapping[str, Any]) -> int:
    """spec.replicas, unless the built-in autoscaler acts: then its last decision (GitOps keeps spec)."""
    scaling = spec.autoscaling
    if not scaling.enabled or scaling.mode != AutoscalingMode.ACT:
        return spec.replicas
    decided = (status.get("autoscaling") or {}).get("desiredReplicas")
    count = int(decided) if isinstance(decided, int | float) else spec.replicas
    return max(scaling.min_replicas, min(scaling.max_replicas, count))


# A decision that changes nothing is still recorded this often, so the terms shown stay current.
RECORD_HEARTBEAT_SECONDS = 300.0


def worth_recording(previous: Mapping[str, Any], decision: Mapping[str, Any], now: float) -> bool:
    """Record when what is decided changes (the reason's numbers drift every tick and do not count), or the
    horizon's source (the first measured time-to-ready), or whether the metrics or the held-request count are read,
    and otherwise at most every RECORD_HEARTBEAT_SECONDS, so the terms shown stay current without a write per tick."""
    if not previous:
        return True
    keys = ("desiredReplicas", "action", "mode", "panic", "applied")
    if any(previous.get(k) != decision.get(k) for k in keys):
        return True
    if bool(previous.get("unservableRequests")) != bool(decision.get("unservableRequests")):
        return True
    if (previous.get("timeToReady") or {}).get("source") != (decision.get("timeToReady") or {}).get("source"):
        return True  # the horizon went from the prior to a measurement
    if _gateway_use(previous) != _gateway_use(decision):
        return True  # a gateway's series came into use, or its bytes per token were first measured
    if _held_without_metrics(previous) != _held_without_metrics(decision):
        return True  # the metrics went away (status must say so while it holds) or came back
    if _held_requests_read(previous) != _held_requests_read(decision):
        return True  # the endpoint picker's held-request count became readable or stopped being: at zero, the way up
    last = epoch(previous.get("time"))
    return last is None or now - last >= RECORD_HEARTBEAT_SECONDS


def _held_without_metrics(record: Mapping[str, Any]) -> bool:
    """Whether a recorded decision held for want of metrics (it has no need computed from them)."""
    return "needReplicas" not in (record.get("terms") or {})


def _held_requests_read(record: Mapping[str, Any]) -> bool | None:
    """Whether a recorded decision read the endpoint picker's held-request count (None: no zero rule applies). A
    fleet at zero wakes only on that count, so status must say at once when it cannot be read, and when it can."""
    zero = record.get("scaleToZero")
    return None if not isinstance(zero, Mapping) else zero.get("heldRequests") is not None


def _gateway_use(record: Mapping[str, Any]) -> tuple[Any, bool]:
    """(bytes-per-token source, whether the series are used yet) of a recorded decision's gateway status."""
    gateway = (record.get("prefillThroughput") or {}).get("gateway") or {}
    return gateway.get("source"), not str(gateway.get("window", "")).startswith(GATEWAY_WARMING_UP)

"""Reading a running benchmark Job: its progress from the log tail, its pod's trouble. Pure.

Objects are the API's JSON (camelCase), as `ApiClient.sanitize_for_serialization` returns them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from m3fleet.bench.job import PROGRESS

# Waiting reasons that never resolve on their own: stop and say why instead of waiting for the deadline.
FATAL_WAITING: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"}
)
_RUN = re.compile(re.escape(PROGRESS) + r" (run \d+/\d+: concurrency \d+, \d+ prompts)")
_BAR = re.compile(r"(\d{1,3})%\|[^|]*\|\s*(\d+)/(\d+)")


def progress(log_tail: str) -> str | None:
    """ "run 2/6: concurrency 64, 320 prompts: 45% (144/320)" from the last lines of the log."""
    run: str | None = None
    bar: str | None = None
    for line in log_tail.replace("\r", "\n").split("\n"):
        found = _RUN.search(line)
        if found:
            run, bar = found.group(1), None  # a new run: the previous run's bar no longer applies
            continue
        match = _BAR.search(line)
        if match:
            bar = f"{match.group(1)}% ({match.group(2)}/{match.group(3)})"
    if run is None:
        return None
    return f"{run}: {bar}" if bar else f"{run}: starting"


@dataclass(frozen=True)
class PodState:
    text: str  # what to show
    fatal: str | None = None  # set when the pod cannot start: the reason and the message


def pod_state(pod: Mapping[str, Any] | None) -> PodState:
    if pod is None:
        return PodState("waiting for the pod")
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in FATAL_WAITING:
            return PodState(f"{phase}: {reason}", f"{reason}: {waiting.get('message', '').strip() or 'no detail'}")
        if reason:
            return PodState(f"{phase}: {reason}")
    if phase == "Pending":
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return PodState(f"Pending: {condition.get('reason', 'unschedulable')}: {condition.get('message', '')}")
    return PodState(phase)


def job_outcome(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """("Complete" | "Failed", message) once the Job has finished; None while it runs."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            detail = ": ".join(p for p in (condition.get("reason"), condition.get("message")) if p)
            return str(condition["type"]), detail
    return None


def ready(resource: Mapping[str, Any]) -> str | None:
    """Why the resource may not be benchmarked now; None when it is Ready for its current generation."""
    status = resource.get("status") or {}
    generation = (resource.get("metadata") or {}).get("generation")
    for condition in status.get("conditions") or []:
        if condition.get("type") != "Ready":
            continue
        if condition.get("status") != "True":
            detail = ": ".join(p for p in (condition.get("reason"), condition.get("message")) if p)
            return f"it is not Ready ({detail or condition.get('status')})"
        observed = condition.get("observedGeneration") or status.get("observedGeneration")
        if generation is not None and observed is not None and int(observed) < int(generation):
            return f"Ready is for generation {observed} but the spec is at {generation} (a change is rolling out)"
        return None
    return "it has no Ready condition yet (the operator has not reconciled it)"

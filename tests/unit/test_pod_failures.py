"""Why engine pods fail, read from pod statuses and FailedCreate events as the kubelet and the workload
controllers write them, and what the conditions then say (Ready/Progressing False, Degraded True)."""

from __future__ import annotations

from typing import Any

import pytest

from m3fleet.api.conditions import POD_FAILURE_REASONS
from m3fleet.controller.status import (
    Workload,
    conditions,
    create_failure,
    pod_failure,
    pods_per_replica,
)

NOW = "2026-11-28T12:00:00Z"


def pod(name: str, *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {"containerStatuses": list(containers), "initContainerStatuses": list(init)},
    }


def running(name: str = "engine") -> dict[str, Any]:
    return {"name": name, "ready": False, "restartCount": 0, "state": {"running": {"startedAt": NOW}}}


def waiting(reason: str, message: str = "", name: str = "engine", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "vllm/vllm-openai:v0.33.0",
        "state": {"waiting": {"reason": reason, "message": message}},
        **extra,
    }


def crashed(reason: str, exit_code: int, message: str = "", restarts: int = 4) -> dict[str, Any]:
    return waiting(
        "CrashLoopBackOff",
        "back-off 40s restarting failed container=engine",
        restartCount=restarts,
        lastState={"terminated": {"reason": reason, "exitCode": exit_code, "message": message}},
    )


def test_crash_loop_names_pod_container_last_exit_and_engine_error() -> None:
    error = "ValueError: block_size must be 128 for MiniMax-M3\n  (raised in vllm/config.py)"
    failure = pod_failure([pod("m3-abc", running("sidecar")), pod("m3-def", crashed("Error", 1, error))])
    assert failure is not None and failure.reason == "CrashLoopBackOff"
    assert failure.message.startswith("1 of 2 pods failing: pod m3-def, container engine:")
    assert "restarted 4 times" in failure.message and "Error (exit code 1)" in failure.message
    assert "block_size must be 128 for MiniMax-M3 (raised in vllm/config.py)" in failure.message  # one line
    assert "kubectl logs --previous" in failure.message


def test_oom_killed_wins_over_the_crash_loop_it_causes() -> None:
    failure = pod_failure([pod("m3-a", crashed("OOMKilled", 137))])
    assert failure is not None and failure.reason == "OOMKilled"
    assert "exit code 137" in failure.message and "memory" in failure.message
    # A container that was OOM-killed once and now runs again is not failing.
    recovered = running() | {"lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
    assert pod_failure([pod("m3-a", recovered)]) is None


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull", "InvalidImageName"])
def test_image_pull_failures_name_the_image(reason: str) -> None:
    failure = pod_failure([pod("m3-a", waiting(reason, 'Back-off pulling image "vllm/vllm-openai:v0.33.0"'))])
    assert failure is not None and failure.reason == reason
    assert "image vllm/vllm-openai:v0.33.0" in failure.message and "Back-off pulling image" in failure.message


def test_missing_secret_key_is_a_config_error_with_the_kubelets_words() -> None:
    message = "couldn't find key api-key in Secret fleet/m3-keys"
    failure = pod_failure([pod("m3-a", waiting("CreateContainerConfigError", message))])
    assert failure is not None and failure.reason == "CreateContainerConfigError"
    assert failure.message.endswith(f"pod m3-a, container engine: {message}")


def test_init_containers_are_read_first_and_starting_pods_are_not_failing() -> None:
    init = waiting("CreateContainerConfigError", "secret m3-hf not found", name="fetch")
    failure = pod_failure([pod("m3-a", waiting("PodInitializing"), init=(init,))])
    assert failure is not None and "container fetch" in failure.message
    assert pod_failure([pod("m3-a", waiting("ContainerCreating")), pod("m3-b", running())]) is None
    deleting = pod("m3-c", crashed("Error", 1))
    deleting["metadata"]["deletionTimestamp"] = NOW
    assert pod_failure([deleting]) is None


def event(kind: str, name: str, when: str, message: str, reason: str = "FailedCreate") -> dict[str, Any]:
    return {
        "reason": reason,
        "involvedObject": {"kind": kind, "name": name},
        "lastTimestamp": when,
        "message": message,
    }


def test_failed_create_reads_the_newest_recent_event_of_the_workloads_own_sets() -> None:
    refused = 'pods "m3-0" is forbidden: violates PodSecurity "restricted:latest": hostPath volumes (volume "cache")'
    events = [
        event("StatefulSet", "m3", "2026-11-28T11:58:00Z", "an older refusal"),
        event(
            "StatefulSet", "m3", "2026-11-28T11:59:30Z", f"create Pod m3-0 in StatefulSet m3 failed error: {refused}"
        ),
        event("StatefulSet", "other", "2026-11-28T11:59:59Z", "another fleet's refusal"),
        event("StatefulSet", "m3", "2026-11-28T11:59:59Z", "created", reason="SuccessfulCreate"),
        event("Deployment", "m3", "2026-11-28T11:59:59Z", "not a pod creator"),
    ]
    failure = create_failure(events, "m3", NOW)
    assert failure is not None and failure.reason == "FailedCreate"
    assert failure.message.startswith("StatefulSet m3 cannot create pods: create Pod m3-0")
    assert 'violates PodSecurity "restricted:latest"' in failure.message
    stale = [event("ReplicaSet", "m3-5d8f", "2026-11-28T10:00:00Z", "forbidden: exceeded quota")]
    assert create_failure(stale, "m3", NOW) is None  # an hour old: says nothing of the pods today


def test_failing_pods_make_the_fleet_degraded_not_progressing() -> None:
    workload = Workload(desired=2, replicas=2, ready=1, updated=2, observed_current=True).with_pods(
        [pod("m3-a", running()), pod("m3-b", crashed("Error", 1))]
    )
    by_type = {c["type"]: c for c in conditions([], 4, NOW, workload, None)}
    assert by_type["Ready"]["status"] == "False" and by_type["Ready"]["reason"] == "CrashLoopBackOff"
    assert by_type["Ready"]["message"].startswith("1 of 2 replicas ready; 1 of 2 pods failing: pod m3-b")
    assert (by_type["Degraded"]["status"], by_type["Degraded"]["reason"]) == ("True", "CrashLoopBackOff")
    assert by_type["Progressing"]["status"] == "False"  # Flux's health check reads Progressing first
    assert by_type["Available"]["status"] == "True"  # one replica still serves


def test_a_ready_fleet_is_ready_even_with_a_restarting_pod_of_an_old_rollout() -> None:
    done = Workload(desired=1, replicas=1, ready=1, updated=1, observed_current=True)
    by_type = {c["type"]: c for c in conditions([], 1, NOW, done.with_pods([pod("m3-a", crashed("Error", 1))]), None)}
    assert by_type["Ready"]["reason"] == "AllReplicasReady" and by_type["Degraded"]["status"] == "False"


def test_missing_pods_count_a_leaderworkerset_groups_size() -> None:
    lws = {"spec": {"leaderWorkerTemplate": {"size": 2}}}
    workload = Workload(desired=2, pods_per_replica=pods_per_replica(lws))
    assert workload.missing_pods([pod("a"), pod("b"), pod("c")])
    assert not workload.missing_pods([pod("a"), pod("b"), pod("c"), pod("d")])
    assert pods_per_replica({"spec": {"template": {}}}) == 1


def test_every_failure_reason_is_catalogued() -> None:
    for found in (
        pod_failure([pod("p", crashed("Error", 1))]),
        pod_failure([pod("p", crashed("OOMKilled", 137))]),
        pod_failure([pod("p", waiting("ErrImagePull"))]),
        pod_failure([pod("p", waiting("CreateContainerError", "no such file"))]),
        create_failure([event("ReplicaSet", "m3-1", NOW, "forbidden")], "m3", NOW),
    ):
        assert found is not None and found.reason in POD_FAILURE_REASONS


def ready_pod(name: str) -> dict[str, Any]:
    return {**pod(name, running()), "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_crash_is_kept_between_restarts_and_group_recreates_until_its_pod_is_ready() -> None:
    """A crash loop runs between crashes and LWS recreates a group whose pod restarted: Degraded must not flip."""
    starting = Workload(desired=1, replicas=1, ready=0, updated=1, observed_current=True, pods_per_replica=2)
    failed = conditions([], 3, NOW, starting.with_pods([pod("m3-0", crashed("Error", 1)), pod("m3-0-1")]), None)
    for between in ([pod("m3-0-1")], [pod("m3-0", running()), pod("m3-0-1")], [pod("m3-0"), pod("m3-0-1")]):
        kept = {c["type"]: c for c in conditions(failed, 3, NOW, starting.with_pods(between), None)}
        assert (kept["Degraded"]["status"], kept["Degraded"]["reason"]) == ("True", "CrashLoopBackOff")
        assert kept["Degraded"]["message"] == {c["type"]: c for c in failed}["Degraded"]["message"]  # no write
        assert kept["Ready"]["reason"] == "CrashLoopBackOff" and kept["Progressing"]["status"] == "False"
    healed = starting.with_pods([ready_pod("m3-0"), pod("m3-0-1")])
    assert {c["type"]: c for c in conditions(failed, 3, NOW, healed, None)}["Degraded"]["status"] == "False"
    gone = starting.with_pods([pod("m3-0-1")])
    assert {c["type"]: c for c in conditions(failed, 4, NOW, gone, None)}["Degraded"]["status"] == "False"  # new spec
    ready = Workload(desired=1, replicas=1, ready=1, updated=1, observed_current=True)
    assert {c["type"]: c for c in conditions(failed, 3, NOW, ready, None)}["Degraded"]["status"] == "False"
    pulling = conditions([], 3, NOW, starting.with_pods([pod("m3-0", waiting("ImagePullBackOff"))]), None)
    pulled = {c["type"]: c for c in conditions(pulling, 3, NOW, starting.with_pods([pod("m3-0", running())]), None)}
    assert pulled["Degraded"]["status"] == "False"  # an image pull that got through is over

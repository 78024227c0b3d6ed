"""Status says why engine pods fail, on the real control plane.

kwok's stages in tests/support/cluster/kwok/pod-failures.yaml make an engine container fail the way a kubelet reports
it, chosen by the engine image: crash-looping with the engine's last error, OOM-killed, an image that cannot be
pulled, a Secret key that is missing. The real ReplicaSet / LeaderWorkerSet controllers create the pods; the
operator, started through `m3fleet run`, reads them. What a user sees: Ready=False with the kubelet's reason and
a message naming the pod, the container and the cause; Degraded=True (what Argo CD and Flux read); a Warning
Event on the resource; and once the image is fixed, Ready again. Pods refused at creation (Pod Security) are in
test_pod_security.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.cluster import dra
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import condition, delete, operated_namespace, pods, renamed, sample, wait_ready

NAMESPACE = "failing"
# name -> (sample, engine image, Ready reason, what the message must say)
CASES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "crash-loop": (
        "vllm-h200-tp8",
        "fault.m3fleet.test/crash-loop:1",
        "CrashLoopBackOff",
        ("restarted 5 times", "Error (exit code 1)", "ValueError: MiniMax-M3 needs --block-size 128"),
    ),
    "oom-killed": ("vllm-h200-tp8", "fault.m3fleet.test/oom-killed:1", "OOMKilled", ("exit code 137",)),
    "image-pull": (
        "sglang-h200-bf16-tp8",
        "fault.m3fleet.test/image-pull:1",
        "ImagePullBackOff",
        ('Back-off pulling image "fault.m3fleet.test/image-pull:1"',),
    ),
    "config-error": (
        "vllm-h200-tp8",
        "fault.m3fleet.test/config-error:1",
        "CreateContainerConfigError",
        (f"couldn't find key api-key in Secret {NAMESPACE}/engine-keys",),
    ),
    "lws-crash-loop": ("trtllm-gb200-2x4-tep", "fault.m3fleet.test/crash-loop:1", "CrashLoopBackOff", ()),
}


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    dra.install(chart)  # GB200 multi-node pods claim a ComputeDomain channel
    with operated_namespace(chart, NAMESPACE, "operator-failures") as running:
        yield running


def fleet(case: str, image: str | None) -> dict[str, Any]:
    stem = CASES[case][0]
    body = renamed(sample(stem), case, NAMESPACE)
    if image is not None:
        body["spec"].setdefault("engine", {})["image"] = image
    return body


def warnings(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.list("events", NAMESPACE)
        if e["involvedObject"].get("kind") == "MiniMaxM3Deployment"
        and e["involvedObject"].get("name") == name
        and e.get("type") == "Warning"
    ]


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_failing_engine_pods_are_named_in_status_and_events(
    chart: Cluster, operator: OperatorProcess, case: str
) -> None:
    _, image, reason, says = CASES[case]
    document = fleet(case, image)
    chart.apply(document)
    if document["spec"]["accelerator"] == "gb200":
        dra.serve_compute_domain(chart, f"{case}-compute-domain", NAMESPACE)  # what the DRA driver does

    def ready_reason() -> dict[str, Any] | None:
        found = condition(chart.get("m3d", case, NAMESPACE), "Ready")
        return found if found.get("reason") == reason else None

    ready = eventually(f"Ready reason {reason} on {case}", ready_reason, 120)
    assert isinstance(ready, dict) and ready["status"] == "False"
    message = ready["message"]
    assert f"pod {case}-" in message and ", container engine: " in message, message
    if document["spec"]["accelerator"] != "gb200":  # a LeaderWorkerSet recreates a group whose pod restarted
        failing = [p["metadata"]["name"] for p in pods(chart, case, NAMESPACE)]
        assert any(f"pod {name}, container engine: " in message for name in failing), (failing, message)
    for text in says:
        assert text in message, message
    body = chart.get("m3d", case, NAMESPACE)
    degraded = condition(body, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", reason), degraded
    assert condition(body, "Progressing")["status"] == "False"
    events = eventually(
        f"a {reason} Warning Event on {case}",
        lambda: [e for e in warnings(chart, case) if e.get("reason") == reason],
        60,
    )
    assert events and f"pod {case}-" in events[0]["message"], events

    # `kubectl wait` (and a pipeline) does not wait for ever: it reads the failure as not Ready.
    waited = chart.kubectl(
        "wait", "--for=condition=Degraded", f"m3d/{case}", "-n", NAMESPACE, "--timeout=10s", check=False
    )
    assert waited.returncode == 0, waited.stderr

    if case == "crash-loop":  # the fix: the catalog's image, a new rollout, Ready again, Degraded gone
        chart.apply(fleet(case, None))
        healed = wait_ready(chart, case, NAMESPACE, timeout=180)
        assert condition(healed, "Degraded")["status"] == "False"
    delete(chart, case, NAMESPACE)

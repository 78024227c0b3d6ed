"""The operator never takes over, mounts or deletes an object it did not create (real tier).

Objects that already hold a child's name — made by hand, without our labels, or with our labels but no
controller reference to this resource — are reported (`Degraded`, reason `NameConflict`, naming each one and
the fix) and left byte for byte as they were; nothing of the fleet is applied meanwhile. Once they are
deleted, the fleet comes up by itself. Objects that merely carry our labels are never pruned.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.cluster import dra
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import condition, operated_namespace, renamed, sample, wait_ready

NAMESPACE = "ownership"
LABELS = {"app.kubernetes.io/managed-by": "m3fleet"}  # what the operator's watches and listings select on
RETRY_SECONDS = 10.0  # the operator looks at a held name again this often


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    dra.install(chart)
    with operated_namespace(chart, NAMESPACE, "operator-ownership") as running:
        yield running


def _trtllm_h200(name: str) -> dict[str, Any]:
    """A single-node TensorRT-LLM replica: a ConfigMap, a Deployment and a Service."""
    document = renamed(sample("trtllm-gb200-2x4-tep"), name, NAMESPACE)
    document["spec"]["accelerator"] = "h200"
    document["spec"]["parallelism"] = {"strategy": "tp-ep", "tensorParallelSize": 8}
    return document


def _foreign(kind: str, name: str, labels: dict[str, str] | None = None, **body: Any) -> dict[str, Any]:
    api = {"Deployment": "apps/v1"}.get(kind, "v1")
    meta = {"name": name, "namespace": NAMESPACE, "labels": labels or {"app": "someone-else"}}
    return {"apiVersion": api, "kind": kind, "metadata": meta, **body}


def _versions(cluster: Cluster, objects: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """Each object's resourceVersion, uid, labels, annotations, owner references and managed fields."""
    out = {}
    for kind, name in objects:
        body = cluster.get(kind, name, NAMESPACE)
        assert body is not None, (kind, name)
        meta = body["metadata"]
        out[kind, name] = {
            k: meta.get(k) for k in ("resourceVersion", "uid", "labels", "annotations", "ownerReferences")
        } | {"managers": sorted(m["manager"] for m in meta.get("managedFields") or [])}
    return out


def _degraded(cluster: Cluster, name: str) -> dict[str, Any]:
    return condition(cluster.get("m3d", name, NAMESPACE), "Degraded")


def _events(cluster: Cluster, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.list("events", NAMESPACE)
        if e.get("reason") == reason and e["involvedObject"].get("name") == name
    ]


def test_foreign_objects_with_child_names_are_left_alone_until_removed(
    chart: Cluster, operator: OperatorProcess
) -> None:
    name = "taken"
    deployment = _foreign(
        "Deployment",
        name,
        spec={
            "replicas": 0,
            "selector": {"matchLabels": {"app": "someone-else"}},
            "template": {
                "metadata": {"labels": {"app": "someone-else"}},
                "spec": {"containers": [{"name": "web", "image": "registry.example/web:1"}]},
            },
        },
    )
    # With our labels (so the operator's own listing finds it) but no controller reference: still not ours.
    service = _foreign(
        "Service",
        f"{name}-api",
        {**LABELS, "m3fleet.dev/name": name},
        spec={"selector": {"app": "someone-else"}, "ports": [{"port": 80}]},
    )
    config = _foreign("ConfigMap", f"{name}-engine-config", data={"mine": "do not touch"})
    bystander = _foreign("ConfigMap", f"{name}-notes", {**LABELS, "m3fleet.dev/name": name}, data={"k": "v"})
    for obj in (deployment, service, config, bystander):
        chart.apply(obj)
    held = [("deployment", name), ("service", f"{name}-api"), ("configmap", f"{name}-engine-config")]
    before = _versions(chart, [*held, ("configmap", f"{name}-notes")])

    chart.apply(_trtllm_h200(name))
    degraded = eventually(
        "Degraded NameConflict", lambda: (c := _degraded(chart, name)).get("reason") == "NameConflict" and c, 60
    )
    assert degraded["status"] == "True"
    message = degraded["message"]
    for kind, obj_name in (("Deployment", name), ("Service", f"{name}-api"), ("ConfigMap", f"{name}-engine-config")):
        assert f"{kind} {NAMESPACE}/{obj_name} already exists" in message, message
        assert f"kubectl -n {NAMESPACE} delete {kind.lower()} {obj_name}" in message, message
    ready = condition(chart.get("m3d", name, NAMESPACE), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NameConflict")
    assert _events(chart, name, "NameConflict"), "no NameConflict event"

    time.sleep(RETRY_SECONDS * 1.5)  # at least one retry has looked at them again
    assert _versions(chart, [*held, ("configmap", f"{name}-notes")]) == before
    assert chart.get("secret", f"{name}-mpi-ssh", NAMESPACE) is None
    assert chart.list("pods", NAMESPACE, f"m3fleet.dev/name={name}") == []

    # One freed name is not enough: the rest are still held, and still named.
    chart.kubectl("delete", "configmap", f"{name}-engine-config", "-n", NAMESPACE)
    eventually(
        "the message drops the freed ConfigMap",
        lambda: "engine-config" not in _degraded(chart, name).get("message", "engine-config"),
        60,
    )
    assert _degraded(chart, name)["reason"] == "NameConflict"
    assert chart.get("configmap", f"{name}-engine-config", NAMESPACE) is None  # not created meanwhile
    assert _versions(chart, held[:2]) == {k: before[k] for k in held[:2]}

    chart.kubectl("delete", "deployment", name, "-n", NAMESPACE)
    chart.kubectl("delete", "service", f"{name}-api", "-n", NAMESPACE)
    body = wait_ready(chart, name, NAMESPACE, timeout=120)
    uid = body["metadata"]["uid"]
    for kind, obj_name in held:
        child = chart.get(kind, obj_name, NAMESPACE)
        assert child is not None and child["metadata"]["uid"] != before[kind, obj_name]["uid"]
        [ref] = child["metadata"]["ownerReferences"]
        assert ref["uid"] == uid and ref["controller"] is True
    assert _degraded(chart, name)["reason"] == "AsExpected"
    # A bystander with our labels and no controller reference is never pruned (nor changed).
    assert _versions(chart, [("configmap", f"{name}-notes")]) == {
        ("configmap", f"{name}-notes"): before["configmap", f"{name}-notes"]
    }
    chart.kubectl("delete", "m3d", name, "-n", NAMESPACE)
    eventually("children collected", lambda: chart.get("deployment", name, NAMESPACE) is None, 60)
    assert chart.get("configmap", f"{name}-notes", NAMESPACE) is not None  # garbage collection leaves it too


def test_a_foreign_ssh_secret_is_never_mounted(chart: Cluster, operator: OperatorProcess) -> None:
    """Multi-node TensorRT-LLM mounts the SSH key Secret `<name>-mpi-ssh` into every pod of a group: one
    someone else made would let its holder into the group. It is reported, and no group is created."""
    name = "trt-ssh"
    secret = _foreign("Secret", f"{name}-mpi-ssh", stringData={"id_ed25519": "someone else's key"})
    chart.apply(secret)
    before = _versions(chart, [("secret", f"{name}-mpi-ssh")])

    chart.apply(renamed(sample("trtllm-gb200-2x4-tep"), name, NAMESPACE))
    degraded = eventually(
        "Degraded NameConflict", lambda: (c := _degraded(chart, name)).get("reason") == "NameConflict" and c, 60
    )
    assert f"Secret {NAMESPACE}/{name}-mpi-ssh already exists" in degraded["message"]
    time.sleep(RETRY_SECONDS * 1.5)
    assert _versions(chart, [("secret", f"{name}-mpi-ssh")]) == before
    assert chart.get("leaderworkerset", name, NAMESPACE) is None
    assert chart.get("computedomain", f"{name}-compute-domain", NAMESPACE) is None

    chart.kubectl("delete", "secret", f"{name}-mpi-ssh", "-n", NAMESPACE)
    lws = eventually("the group is applied", lambda: chart.get("leaderworkerset", name, NAMESPACE), 60)
    uid = chart.get("m3d", name, NAMESPACE)["metadata"]["uid"]  # type: ignore[index]
    generated = chart.get("secret", f"{name}-mpi-ssh", NAMESPACE)
    assert generated is not None and generated["metadata"]["uid"] != before["secret", f"{name}-mpi-ssh"]["uid"]
    assert generated["metadata"]["ownerReferences"][0]["uid"] == uid
    assert lws["metadata"]["ownerReferences"][0]["uid"] == uid
    chart.kubectl("delete", "m3d", name, "-n", NAMESPACE)

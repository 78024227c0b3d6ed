"""What the emulator shows best: the exact requests and stored versions of a create, an invalid update and
its fix, and hand edits of the children (with the operator running, and while it was stopped).

Normal behaviour beyond this (readiness, scale, deletion, samples to Ready) is the real control plane
tier's (tests/cluster).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.controller.reconcile import what_matters
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.kubeapi import FIELD_MANAGER
from m3fleet.planner import plan as make_plan
from m3fleet.render import POD_SECURITY_ANNOTATION, render
from m3fleet.render.labels import MANAGED_BY, serving_selector_string
from tests.kube.emulator import merge_patch
from tests.kube.waiting import eventually
from tests.operator.harness import (
    CONFIGMAPS,
    DEPLOYMENTS,
    LWS,
    SERVICES,
    TRTLLM,
    VLLM,
    Cluster,
    OperatorProcess,
    is_write,
    operator_requests,
    rbac_rule,
    running_operator,
    sample,
)

STATUS_KEYS = {"observedGeneration", "conditions", "plan", "replicas", "readyReplicas", "selector"}


def statuses(cluster: Cluster, name: str) -> dict[str, str]:
    return {c["type"]: c["status"] for c in cluster.status(name)["conditions"]}


def planner_message(doc: dict[str, Any]) -> str:
    """What m3fleet's own validation says about a spec (parse, plan, render), as `m3fleet plan` would."""
    try:
        resource = parse_resource(doc)
        render(resource, make_plan(resource.spec))
    except (SpecError, SpecErrors) as exc:
        return str(exc)
    raise AssertionError("the spec was expected to be invalid")


async def test_create_applies_children_and_writes_status(cluster: Cluster, operator: OperatorProcess) -> None:
    name = await cluster.create(sample(VLLM))
    await eventually(lambda: cluster.converged(name))
    await cluster.settled()
    m3d = cluster.m3d(name)
    children = cluster.children(name)
    assert sorted(child["kind"] for child in children.values()) == [
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
    ]

    owner = {"apiVersion": "m3fleet.dev/v1alpha1", "kind": "MiniMaxM3Deployment", "name": name}
    for child in children.values():
        meta = child["metadata"]
        assert meta["ownerReferences"] == [
            {**owner, "uid": m3d["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        ]
        assert [(f["manager"], f["operation"]) for f in meta["managedFields"]] == [(FIELD_MANAGER, "Apply")]
        assert meta["labels"][MANAGED_BY] == "m3fleet"
    requests = operator_requests(cluster.kmock)
    applies = [r for r in requests if r.method.value == "PATCH" and "/deployments/" in r.url.path]
    assert applies and all(r.params == {"fieldManager": FIELD_MANAGER, "force": "true"} for r in applies)
    assert all(r.headers["Content-Type"] == "application/apply-patch+yaml" for r in applies)
    # One apply per child, one status write and its Event: kopf writes nothing to the resource (no
    # annotations, no finalizer), and the resource is never read by name (the watch delivers it).
    writes = sorted(rule for r in requests if is_write(r) and (rule := rbac_rule(r.method.value, r.url.path, r.params)))
    assert writes == sorted(
        [
            ("apps", "deployments", "patch"),
            ("", "services", "patch"),
            ("networking.k8s.io", "networkpolicies", "patch"),
            ("policy", "poddisruptionbudgets", "patch"),
            ("m3fleet.dev", "minimaxm3deployments/status", "patch"),
            ("", "events", "create"),
        ]
    )
    assert not [r for r in requests if r.method.value == "GET" and r.url.path.endswith(f"/minimaxm3deployments/{name}")]
    # Each child the owned-label listing did not find is looked up by name once, before it is first applied
    # (an object of that name the resource does not control would be reported, not applied over).
    lookups = sorted(
        r.url.path.rsplit("/", 2)[-2]
        for r in requests
        if r.method.value == "GET"
        and "/namespaces/" in r.url.path
        and r.url.path.rsplit("/", 1)[-1] in (name, f"{name}-api")
    )
    assert lookups == ["deployments", "poddisruptionbudgets", "services"], lookups
    assert "annotations" not in m3d["metadata"] and not m3d["metadata"].get("finalizers")

    status = m3d["status"]
    assert set(status) == STATUS_KEYS
    assert status["observedGeneration"] == 1 and status["plan"]["nodesPerReplica"] == 1
    assert (status["replicas"], status["readyReplicas"]) == (0, 0)
    assert status["selector"] == serving_selector_string(name)
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Ready", "False", "RolloutInProgress"),
        ("Available", "False", "NoReplicasReady"),
        ("Progressing", "True", "RolloutInProgress"),
        ("Degraded", "False", "AsExpected"),
    ]
    assert all(c["observedGeneration"] == 1 for c in status["conditions"])

    # The Deployment controller reports the pods ready: a status-only change of a child reaches the parent.
    await cluster.report_workload(DEPLOYMENTS, name)
    ready = {"Ready": "True", "Available": "True", "Progressing": "False", "Degraded": "False"}
    await eventually(lambda: statuses(cluster, name) == ready)
    assert cluster.events(name) == [("Applied", ", ".join(sorted(children)))]


async def test_invalid_update_degrades_touches_nothing_and_the_fix_applies_at_once(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    invalid, fix = {"parallelism": {"tensorParallelSize": 2}}, {"parallelism": {"tensorParallelSize": None}}
    name = await cluster.create(sample(VLLM))
    await eventually(lambda: cluster.converged(name))
    await cluster.report_workload(DEPLOYMENTS, name)
    await eventually(lambda: statuses(cluster, name)["Ready"] == "True")
    await cluster.settled()
    before = cluster.children(name)
    cluster.kmock.reset_writes()

    await cluster.patch_spec(name, invalid)
    await eventually(lambda: statuses(cluster, name)["Degraded"] == "True")
    degraded = cluster.condition(name, "Degraded")
    expected = planner_message(merge_patch(sample(VLLM), {"spec": invalid}))
    assert (degraded["reason"], degraded["message"]) == ("InvalidSpec", expected)
    assert cluster.status(name)["observedGeneration"] == 2
    assert statuses(cluster, name)["Available"] == "True"  # the running replica still serves
    await cluster.settled()
    assert cluster.children(name) == before  # byte for byte, resourceVersions included
    assert set(cluster.kmock.writes()) <= {"minimaxm3deployments", "minimaxm3deployments/status", "events"}

    # Back to the original spec: applied within seconds, not degraded any more, children never touched.
    await cluster.patch_spec(name, fix)
    await eventually(lambda: statuses(cluster, name)["Degraded"] == "False", timeout=3)
    await eventually(lambda: statuses(cluster, name)["Ready"] == "True")
    assert cluster.status(name)["observedGeneration"] == 3
    assert cluster.children(name) == before


def hand_edits(cluster: Cluster, vllm: str, trtllm: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(resource, name, a strategic merge patch as `kubectl edit` sends it) changing fields the operator
    owns; a field someone adds beside ours (a selector key, a data key) is theirs to keep, as with SSA."""
    deployment, service = cluster.child(vllm, "Deployment"), cluster.child(vllm, "Service")
    config, lws = cluster.child(trtllm, "ConfigMap"), cluster.child(trtllm, "LeaderWorkerSet")
    engine = deployment["spec"]["template"]["spec"]["containers"][0]["name"]
    image = {"spec": {"template": {"spec": {"containers": [{"name": engine, "image": "evil:1"}]}}}}
    return [
        (DEPLOYMENTS, deployment["metadata"]["name"], {"spec": {"replicas": 5}}),
        (DEPLOYMENTS, deployment["metadata"]["name"], image),
        (SERVICES, service["metadata"]["name"], {"spec": {"type": "NodePort"}}),
        (CONFIGMAPS, config["metadata"]["name"], {"data": dict.fromkeys(config["data"], "evil: true")}),
        (LWS, lws["metadata"]["name"], {"spec": {"replicas": 3}}),
        (LWS, lws["metadata"]["name"], {"metadata": {"labels": {MANAGED_BY: "someone-else"}}}),  # out of sight
    ]


@pytest.mark.parametrize("running", [True, False], ids=["operator-running", "operator-stopped"])
async def test_hand_edits_of_children_are_undone(cluster: Cluster, tmp_path: Path, running: bool) -> None:
    """Compared against what the API server holds (a dry-run apply), not memory nor generations: also for
    ConfigMaps and Services, which have no generation, and for edits made while the operator was down.
    A deleted child is created again; what others add beside our fields (an annotation) stays."""

    async def edit_all() -> None:
        for resource, name, patch in hand_edits(cluster, names[VLLM], names[TRTLLM]):
            await cluster.edit(resource, name, patch)
        await cluster.edit(DEPLOYMENTS, cluster.child(names[VLLM], "Deployment")["metadata"]["name"], added)
        await cluster.delete(cluster.child(names[TRTLLM], "Service")["metadata"]["name"], SERVICES)  # re-created

    added = {"metadata": {"annotations": {"team": "ml"}}}
    async with running_operator(cluster.kmock, tmp_path):
        names = {VLLM: await cluster.create(sample(VLLM)), TRTLLM: await cluster.create(sample(TRTLLM))}
        await eventually(lambda: all(cluster.converged(n) for n in names.values()))
        await cluster.settled()
        intended = {n: restored(cluster, n) for n in names.values()}
        if running:
            await edit_all()
            await eventually(lambda: all(intended[n] == restored(cluster, n) for n in names.values()))
            await cluster.settled()
    if not running:
        await edit_all()
        async with running_operator(cluster.kmock, tmp_path):
            await eventually(lambda: all(intended[n] == restored(cluster, n) for n in names.values()))
            await cluster.settled()
    assert cluster.child(names[VLLM], "Deployment")["metadata"]["annotations"] == {
        "team": "ml",  # another manager's annotation is kept next to the operator's own
        POD_SECURITY_ANNOTATION: "restricted",
    }


def restored(cluster: Cluster, name: str) -> dict[str, Any]:
    """The children as the operator intends them: what matters of each, without annotations others added."""
    found = {k: what_matters(c) for k, c in cluster.children(name).items()}
    for child in found.values():
        child["annotations"].pop("team", None)
    return found

"""The operator's lifecycle against the emulator: create, update, scale, readiness, invalid input, deletion."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.controller.kube import FIELD_MANAGER
from m3fleet.controller.reconcile import INTENT_ANNOTATION
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan as make_plan
from m3fleet.render import render
from m3fleet.render.labels import MANAGED_BY, serving_selector_string
from tests.kube.conftest_helpers import eventually
from tests.kube.emulator import merge_patch
from tests.operator.harness import (
    DEPLOYMENTS,
    LWS,
    M3D,
    NS,
    ONE_MILLION,
    PVCS,
    SECRETS,
    SERVICES,
    TRTLLM,
    VLLM,
    Cluster,
    create_trtllm,
    sample,
)

STATUS_KEYS = {"observedGeneration", "conditions", "plan", "replicas", "readyReplicas", "selector"}


def conditions(cluster: Cluster, name: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in cluster.status(name)["conditions"]}


def statuses(cluster: Cluster, name: str) -> dict[str, str]:
    return {t: c["status"] for t, c in conditions(cluster, name).items()}


def ready(cluster: Cluster, name: str) -> bool:
    return statuses(cluster, name)["Ready"] == "True"


def planner_message(doc: dict[str, Any]) -> str:
    """What m3fleet's own validation says about a spec (parse, plan, render), as `m3fleet plan` would."""
    try:
        resource = parse_resource(doc)
        render(resource, make_plan(resource.spec))
    except (SpecError, SpecErrors) as exc:
        return str(exc)
    raise AssertionError("the spec was expected to be invalid")


async def test_create_applies_children_and_writes_status(operator: Cluster) -> None:
    name = await operator.create(sample(VLLM))
    await eventually(lambda: operator.converged(name))
    m3d = operator.m3d(name)
    children = operator.children(name)
    assert set(children) == {f"Deployment/{name}", f"Service/{name}"}

    owner = {"apiVersion": "m3fleet.dev/v1alpha1", "kind": "MiniMaxM3Deployment", "name": name}
    for child in children.values():
        meta = child["metadata"]
        assert meta["ownerReferences"] == [
            {**owner, "uid": m3d["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        ]
        assert [(f["manager"], f["operation"]) for f in meta["managedFields"]] == [(FIELD_MANAGER, "Apply")]
        assert meta["labels"][MANAGED_BY] == "m3fleet" and INTENT_ANNOTATION in meta["annotations"]
    applies = [r for r in operator.kmock if r.method.value == "PATCH" and "/deployments/" in r.url.path]
    assert applies and all(r.params == {"fieldManager": FIELD_MANAGER, "force": "true"} for r in applies)
    assert all(r.headers["Content-Type"] == "application/apply-patch+yaml" for r in applies)

    status = m3d["status"]
    assert set(status) == STATUS_KEYS  # kopf's bookkeeping never lands in status
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
    assert not m3d["metadata"].get("finalizers")


async def test_readiness_rollout_and_transition_times(operator: Cluster) -> None:
    name = await operator.create(sample(VLLM))
    await eventually(lambda: operator.converged(name))
    created = conditions(operator, name)

    # A status-only change of the child reaches the parent through the child event handler.
    await operator.report_workload(DEPLOYMENTS, name)
    await eventually(lambda: ready(operator, name))
    done = conditions(operator, name)
    assert statuses(operator, name) == {
        "Ready": "True",
        "Available": "True",
        "Progressing": "False",
        "Degraded": "False",
    }
    assert done["Ready"]["reason"] == "AllReplicasReady" and done["Progressing"]["reason"] == "RolloutComplete"
    assert (operator.status(name)["replicas"], operator.status(name)["readyReplicas"]) == (1, 1)
    assert done["Degraded"]["lastTransitionTime"] == created["Degraded"]["lastTransitionTime"]  # no flip, no move
    assert done["Ready"]["lastTransitionTime"] != created["Ready"]["lastTransitionTime"]

    # A template change: generation 2 of the Deployment; until its controller reports it, never Ready.
    await operator.patch_spec(name, {"engine": {"name": "vllm", "extraArgs": ["--max-num-seqs=64"]}})
    await eventually(lambda: operator.status(name)["observedGeneration"] == 2)
    assert operator.get(DEPLOYMENTS, name)["metadata"]["generation"] == 2  # type: ignore[index]
    rolling = conditions(operator, name)
    assert statuses(operator, name) == {
        "Ready": "False",
        "Available": "True",
        "Progressing": "True",
        "Degraded": "False",
    }
    await operator.report_workload(DEPLOYMENTS, name, updated=0)  # observed; the new pod is not up yet
    await operator.settled()
    assert not ready(operator, name)
    before_rolled_out = len(operator.history(M3D, name))
    await operator.report_workload(DEPLOYMENTS, name)
    await eventually(lambda: ready(operator, name))
    rolled = conditions(operator, name)
    assert rolled["Available"]["lastTransitionTime"] == done["Available"]["lastTransitionTime"]  # served throughout
    assert rolled["Degraded"]["lastTransitionTime"] == created["Degraded"]["lastTransitionTime"]
    assert rolling["Ready"]["lastTransitionTime"] not in (
        done["Ready"]["lastTransitionTime"],
        rolled["Ready"]["lastTransitionTime"],
    )

    # No stored version of generation 2 said Ready before the Deployment controller reported the rollout done.
    during = [
        v
        for v in operator.history(M3D, name)[:before_rolled_out]
        if v and v.get("status", {}).get("observedGeneration") == 2
    ]
    assert during and not any(
        c["type"] == "Ready" and c["status"] == "True" for v in during for c in v["status"]["conditions"]
    )


async def test_scale_subresource(operator: Cluster) -> None:
    name = await operator.create(sample(VLLM))
    await eventually(lambda: operator.converged(name))
    await operator.report_workload(DEPLOYMENTS, name)
    await eventually(lambda: ready(operator, name))

    scale = await operator.scale(name, 3)  # kubectl scale m3d/<name> --replicas=3
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    assert operator.m3d(name)["spec"]["replicas"] == 3
    await eventually(lambda: operator.get(DEPLOYMENTS, name)["spec"]["replicas"] == 3)  # type: ignore[index]
    await eventually(lambda: operator.status(name)["observedGeneration"] == 2)
    assert conditions(operator, name)["Ready"]["reason"] == "RolloutInProgress"
    await operator.report_workload(DEPLOYMENTS, name)
    await eventually(lambda: ready(operator, name) and operator.status(name)["replicas"] == 3)

    reported = await operator.get_scale(name)
    assert reported["spec"]["replicas"] == 3
    assert reported["status"] == {"replicas": 3, "selector": serving_selector_string(name)}
    assert operator.status(name)["readyReplicas"] == 3


@pytest.mark.parametrize(
    ("invalid", "fix"),
    [
        pytest.param(
            {"parallelism": {"tensorParallelSize": 2}},
            {"parallelism": {"tensorParallelSize": None}},
            id="tensorParallelSize-2",
        ),
        pytest.param(
            {"engine": {"extraArgs": ["--max-model-len=4096"]}},
            {"engine": {"extraArgs": None}},
            id="extraArgs-owned-flag",
        ),
    ],
)
async def test_invalid_update_degrades_and_touches_nothing(
    operator: Cluster, invalid: dict[str, Any], fix: dict[str, Any]
) -> None:
    name = await operator.create(sample(VLLM))
    await eventually(lambda: operator.converged(name))
    await operator.report_workload(DEPLOYMENTS, name)
    await eventually(lambda: ready(operator, name))
    await operator.settled()
    before = operator.children(name)
    operator.kmock.reset_writes()

    await operator.patch_spec(name, invalid)
    await eventually(lambda: statuses(operator, name)["Degraded"] == "True")
    degraded = conditions(operator, name)["Degraded"]
    expected = planner_message(merge_patch(sample(VLLM), {"spec": invalid}))
    assert (degraded["reason"], degraded["message"]) == ("InvalidSpec", expected)
    assert operator.status(name)["observedGeneration"] == 2
    await operator.settled()
    assert operator.children(name) == before  # byte for byte, resourceVersions included
    assert set(operator.kmock.writes()) <= {"minimaxm3deployments", "minimaxm3deployments/status", "events"}

    # Back to the original spec: not degraded any more, and the children were never touched.
    await operator.patch_spec(name, fix)
    await eventually(lambda: statuses(operator, name)["Degraded"] == "False")
    await eventually(lambda: ready(operator, name))
    assert operator.status(name)["observedGeneration"] == 3
    assert operator.children(name) == before


async def test_deployment_to_leaderworkerset_and_back(operator: Cluster) -> None:
    name = await operator.create(sample(VLLM))
    await eventually(lambda: operator.converged(name))
    service = operator.children(name)[f"Service/{name}"]
    await operator.patch_spec(name, {"context": {"maxModelLen": ONE_MILLION}})
    await eventually(
        lambda: (
            operator.converged(name) and set(operator.children(name)) == {f"LeaderWorkerSet/{name}", f"Service/{name}"}
        )
    )
    lws = operator.get(LWS, name)
    assert lws is not None and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert operator.status(name)["plan"]["nodesPerReplica"] == 2
    assert operator.children(name)[f"Service/{name}"]["metadata"]["uid"] == service["metadata"]["uid"]
    prunes = [r for r in operator.kmock if r.method.value == "DELETE"]
    assert [r.url.path for r in prunes] == [f"/apis/apps/v1/namespaces/{NS}/deployments/{name}"]
    assert prunes[0].data["preconditions"]["uid"]  # exactly the object it saw

    await operator.report_workload(LWS, name)
    await eventually(lambda: ready(operator, name))

    await operator.patch_spec(name, {"context": {"maxModelLen": 131072}})
    await eventually(
        lambda: operator.converged(name) and set(operator.children(name)) == {f"Deployment/{name}", f"Service/{name}"}
    )
    assert operator.status(name)["plan"]["nodesPerReplica"] == 1
    assert not ready(operator, name)  # the new Deployment has not reported anything yet


@pytest.mark.parametrize(
    ("doc", "update", "reason", "says"),
    [
        pytest.param(  # a running one-node Deployment, then a context that needs two nodes
            VLLM,
            {"context": {"maxModelLen": ONE_MILLION}},
            "LeaderWorkerSetNotInstalled",
            "a replica spans 2 nodes and needs the LeaderWorkerSet API",
            marks=pytest.mark.apis(lws=False),
            id="LeaderWorkerSet",
        ),
        pytest.param(  # a multi-node GB200 resource from scratch
            TRTLLM,
            None,
            "ComputeDomainNotInstalled",
            "ComputeDomain API (resource.nvidia.com/v1beta1)",
            marks=pytest.mark.apis(compute_domains=False),
            id="ComputeDomain",
        ),
    ],
)
async def test_missing_api_degrades_and_touches_nothing(
    operator: Cluster, doc: str, update: dict[str, Any] | None, reason: str, says: str
) -> None:
    name = sample(doc)["metadata"]["name"]
    before: dict[str, Any] = {}
    if update is not None:
        await operator.create(sample(doc))
        await eventually(lambda: operator.converged(name))
        await operator.settled()
        before = operator.children(name)
    operator.kmock.reset_writes()
    await (operator.patch_spec(name, update) if update is not None else operator.create(sample(doc)))

    await eventually(lambda: statuses(operator, name)["Degraded"] == "True")
    degraded = conditions(operator, name)["Degraded"]
    assert degraded["reason"] == reason and says in degraded["message"]
    assert conditions(operator, name)["Ready"]["reason"] == reason
    await operator.settled()
    assert operator.children(name) == before  # nothing created, nothing touched
    assert set(operator.kmock.writes()) <= {"minimaxm3deployments", "minimaxm3deployments/status", "events"}


async def test_trtllm_ssh_secret_is_created_once_and_never_logged(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with cluster.operator():
        name = await create_trtllm(cluster)
        secret_name = f"{name}-mpi-ssh"
        secret = cluster.get(SECRETS, secret_name)
        assert secret is not None and set(cluster.children(name)) == {
            f"ConfigMap/{name}-engine-config",
            f"ComputeDomain/{name}-compute-domain",
            f"LeaderWorkerSet/{name}",
            f"Service/{name}",
            f"Secret/{secret_name}",
        }
        assert secret["metadata"]["ownerReferences"][0]["uid"] == cluster.m3d(name)["metadata"]["uid"]
        assert set(secret["data"]) == {"id_ed25519", "id_ed25519.pub", "authorized_keys"}
        await cluster.patch_spec(name, {"replicas": 2})  # re-render: the LWS changes, the Secret must not
        await eventually(lambda: cluster.get(LWS, name)["spec"]["replicas"] == 2)  # type: ignore[index]
        await eventually(lambda: cluster.converged(name))
    async with cluster.operator():  # a restart
        await cluster.settled()
    assert cluster.history(SECRETS, secret_name) == [secret]  # created once, never written again
    assert sum(1 for r in cluster.kmock if r.method.value == "POST" and r.url.path.endswith("/secrets")) == 1

    private_key = base64.b64decode(secret["data"]["id_ed25519"]).decode()
    secrets_seen = [secret["data"]["id_ed25519"], *private_key.strip().splitlines()[1:-1]]
    assert caplog.records and not [s for s in secrets_seen if s in caplog.text]


async def test_resync_repairs_a_deleted_child(cluster: Cluster) -> None:
    """Services are not watched: only the resync notices one is gone, re-applies it and says so in an Event."""
    async with cluster.operator(resync=0.2):
        name = await cluster.create(sample(VLLM))
        await eventually(lambda: cluster.converged(name))
        await cluster.delete(name, SERVICES)
        await eventually(lambda: cluster.get(SERVICES, name) is not None)
        await eventually(lambda: cluster.events(name)[-1] == ("Applied", f"Service/{name}"))
        await cluster.settled()


@pytest.mark.parametrize("running", [True, False], ids=["operator-running", "operator-stopped"])
async def test_deletion_needs_no_operator_and_keeps_the_pvc(cluster: Cluster, running: bool) -> None:
    claim = sample(VLLM)["spec"]["model"]["source"]["pvc"]["claimName"]
    cluster.kmock.seed(PVCS, {"metadata": {"name": claim, "namespace": NS}, "spec": {"accessModes": ["ReadOnlyMany"]}})
    async with cluster.operator():
        name = await cluster.create(sample(VLLM))
        await eventually(lambda: cluster.converged(name))
        if running:
            await cluster.delete(name)
            assert cluster.get(M3D, name) is None  # gone at once: no finalizer
            # A reconcile already under way may still apply a child after the owner is gone; the garbage
            # collector (which runs continuously in a real cluster) removes it, as it does here once at rest.
            await cluster.settled()
            cluster.kmock.collect_garbage()
            await cluster.settled()
    if not running:
        await cluster.delete(name)
        assert cluster.get(M3D, name) is None
        cluster.kmock.collect_garbage()
        async with cluster.operator():  # a restarted operator recreates nothing
            await cluster.settled()
    assert all(not (v or {}).get("metadata", {}).get("finalizers") for v in cluster.history(M3D, name))
    assert cluster.children(name) == {}
    assert cluster.get(PVCS, claim) is not None
    assert not [r for r in cluster.kmock if r.method.value == "DELETE" and "persistentvolumeclaims" in r.url.path]


async def test_generated_secret_is_deleted_when_no_longer_needed(operator: Cluster) -> None:
    name = await create_trtllm(operator)
    secret_name = f"{name}-mpi-ssh"
    assert operator.status(name)["generatedSecrets"] == [secret_name]
    # TensorRT-LLM -> vLLM: one GB200 node runs the replica, no mpirun, no SSH key (found by name, never listed).
    await operator.patch_spec(name, {"engine": {"name": "vllm"}, "parallelism": {"strategy": "tp"}})
    await eventually(lambda: operator.get(SECRETS, secret_name) is None)
    await eventually(lambda: operator.converged(name))
    assert operator.status(name)["generatedSecrets"] == []
    # kopf posts Events from a queue: wait for it rather than racing it.
    await eventually(
        lambda: any(
            reason == "Pruned" and f"Secret/{secret_name}" in message for reason, message in operator.events(name)
        )
    )


async def test_a_manual_edit_of_the_workload_is_undone(operator: Cluster) -> None:
    name = await operator.create(sample(VLLM))
    await eventually(lambda: operator.converged(name))
    # Someone edits the Deployment's spec by hand (our intent hash on it is unchanged).
    await operator._send("PATCH", operator._path(DEPLOYMENTS, name), {"spec": {"replicas": 5}})
    assert operator.get(DEPLOYMENTS, name)["spec"]["replicas"] == 5  # type: ignore[index]
    # Its controller's event brings the parent back to reconcile, which sees the generation moved.
    await eventually(lambda: operator.get(DEPLOYMENTS, name)["spec"]["replicas"] == 1)  # type: ignore[index]

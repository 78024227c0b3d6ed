"""spec.podTemplate: where each field lands on the rendered engine pods and workload, that it never changes the plan
or the engine's command, and that every name m3fleet renders is one the CRD refuses there."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.api.spec_pod import OWNED_MOUNT_PATHS, OWNED_VOLUMES
from m3fleet.controller.status import unschedulable
from m3fleet.engines.base import CacheMount
from m3fleet.planner import plan
from m3fleet.render import POD_SECURITY_ANNOTATION, render
from tests.support.crd_cases import POD_TEMPLATES_ADMITTED, with_spec
from tests.support.crdtools import admit, failed_rules
from tests.support.samples import SAMPLE_FILES, load_sample

PASSTHROUGH: dict[str, Any] = POD_TEMPLATES_ADMITTED[0]
WORKLOADS = ("Deployment", "LeaderWorkerSet")


def with_pod_template(doc: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(doc)
    changed["spec"]["podTemplate"] = copy.deepcopy(template)
    return changed


def rendered(doc: dict[str, Any]) -> list[dict[str, Any]]:
    resource = parse_resource(doc)
    return render(resource, plan(resource.spec))


def _templates_of(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]
    if "template" in spec:
        return [spec["template"]]
    return [spec["leaderWorkerTemplate"]["leaderTemplate"], spec["leaderWorkerTemplate"]["workerTemplate"]]


def engine_workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workloads that run engines: one per context tier (a gateway's endpoint picker is a workload too, not one
    of them)."""
    return [
        o
        for o in objects
        if o["kind"] in WORKLOADS
        and any(c["name"] == "engine" for t in _templates_of(o) for c in t["spec"]["containers"])
    ]


def workload(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The one engine workload of a fleet without context tiers."""
    (found,) = engine_workloads(objects)
    return found


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for found in engine_workloads(objects):
        yield from _templates_of(found)


def engine(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == "engine"]
    return container


SAMPLES = pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])


@SAMPLES
def test_each_field_lands_on_every_engine_pod_and_the_workload(path: Path) -> None:
    objects = rendered(with_pod_template(load_sample(path), PASSTHROUGH))
    meta = PASSTHROUGH["metadata"]
    # Kueue reads the queue name on the LeaderWorkerSet (and on a Deployment's pods); Volcano reads pods.
    owners = engine_workloads(objects)
    for owner in owners:
        assert meta["labels"].items() <= owner["metadata"]["labels"].items()
        assert meta["annotations"].items() <= owner["metadata"]["annotations"].items()
        # A group's pods get the queue from Kueue itself, with their Workload: it skips a pod that already has it.
        for template in _templates_of(owner):
            queued = "kueue.x-k8s.io/queue-name" in template["metadata"]["labels"]
            assert queued == (owner["kind"] == "Deployment"), owner["kind"]
    templates = list(pod_templates(objects))
    assert len(templates) == sum(1 if owner["kind"] == "Deployment" else 2 for owner in owners)
    others = {k: v for k, v in meta["labels"].items() if k != "kueue.x-k8s.io/queue-name"}
    for template in templates:
        assert others.items() <= template["metadata"]["labels"].items()
        assert meta["annotations"].items() <= template["metadata"]["annotations"].items()
        pod = template["spec"]
        assert pod["priorityClassName"] == PASSTHROUGH["priorityClassName"]
        assert pod["schedulerName"] == PASSTHROUGH["schedulerName"]
        assert PASSTHROUGH["volumes"] == pod["volumes"][-len(PASSTHROUGH["volumes"]) :]
        mounts = engine(template)["volumeMounts"]
        assert [m["mountPath"] for m in PASSTHROUGH["volumeMounts"]] == [m["mountPath"] for m in mounts[-3:]]
        assert {"name": "site-ca", "mountPath": "/etc/ssl/site", "readOnly": True, "subPath": "certs"} in mounts
        # Only the engine container mounts them: the key guard and the init container stay as they were.
        for other in [*pod.get("initContainers", []), *pod["containers"]]:
            if other is not engine(template):
                assert all(m["mountPath"] != "/scratch" for m in other.get("volumeMounts", []))
    # Nothing else carries them: the Service, the PodDisruptionBudget, the NetworkPolicy, the ConfigMap, a gateway's
    # endpoint picker.
    for other in objects:
        if other not in owners:
            assert "kueue.x-k8s.io/queue-name" not in other["metadata"]["labels"]


@SAMPLES
def test_passthrough_never_changes_the_plan_the_flags_or_the_other_objects(path: Path) -> None:
    doc = load_sample(path)
    changed = with_pod_template(doc, PASSTHROUGH)
    assert plan(parse_resource(changed).spec) == plan(parse_resource(doc).spec)
    before, after = rendered(doc), rendered(changed)
    owners_before, owners_after = engine_workloads(before), engine_workloads(after)
    assert [o for o in after if o not in owners_after] == [o for o in before if o not in owners_before]
    for old, new in zip(pod_templates(before), pod_templates(after), strict=True):
        for field in ("command", "args", "env", "resources", "securityContext", "image", "ports"):
            assert engine(new).get(field) == engine(old).get(field), field
        for field in ("nodeSelector", "tolerations", "affinity", "securityContext"):
            assert new["spec"].get(field) == old["spec"].get(field), field
    # The Pod Security level the pods meet is unchanged by an emptyDir and a configMap.
    for old_owner, new_owner in zip(owners_before, owners_after, strict=True):
        annotation = new_owner["metadata"]["annotations"][POD_SECURITY_ANNOTATION]
        assert annotation == old_owner["metadata"]["annotations"][POD_SECURITY_ANNOTATION]


@SAMPLES
def test_without_the_field_nothing_is_added(path: Path) -> None:
    for template in pod_templates(rendered(load_sample(path))):
        assert "priorityClassName" not in template["spec"] and "schedulerName" not in template["spec"]
        assert {v["name"] for v in template["spec"]["volumes"]} <= set(OWNED_VOLUMES)


@pytest.mark.parametrize(
    ("source", "level"),
    [({"hostPath": {"path": "/data"}}, "privileged"), ({"nfs": {"server": "n", "path": "/"}}, "baseline")],
)
def test_a_volume_restricted_forbids_raises_the_level_the_pods_meet(source: dict[str, Any], level: str) -> None:
    path = next(p for p in SAMPLE_FILES if p.stem == "vllm-h200-tp8")
    before = workload(rendered(load_sample(path)))["metadata"]["annotations"][POD_SECURITY_ANNOTATION]
    doc = with_pod_template(load_sample(path), {"volumes": [{"name": "data", **source}]})
    after = workload(rendered(doc))["metadata"]["annotations"][POD_SECURITY_ANNOTATION]
    assert (before, after) == ("restricted", level)


def _rendered_names() -> tuple[set[str], set[str], set[str], set[str]]:
    """Every volume, mount path, label key and annotation key the samples' engine pods and workloads carry, with a
    model cache (Required and Preferred) as well."""
    volumes: set[str] = set()
    paths: set[str] = set()
    label_keys: set[str] = set()
    annotation_keys: set[str] = set()
    renders = [rendered(load_sample(p)) for p in SAMPLE_FILES]
    for required in (True, False):  # a model cache adds its own volumes (hostPath, the init container's link)
        doc = load_sample(next(p for p in SAMPLE_FILES if p.stem == "trtllm-gb200-2x4-tep"))
        doc["spec"]["model"]["cacheRef"] = {"name": "m3", "nodeAffinity": "Required" if required else "Preferred"}
        resource = parse_resource(doc)
        renders.append(render(resource, plan(resource.spec), cache=CacheMount("m3", "/var/m3", "m3/ready", required)))
    for objects in renders:
        for owner in engine_workloads(objects):
            label_keys |= set(owner["metadata"]["labels"])
            annotation_keys |= set(owner["metadata"].get("annotations", {}))
        for template in pod_templates(objects):
            volumes |= {v["name"] for v in template["spec"]["volumes"]}
            for container in [*template["spec"].get("initContainers", []), *template["spec"]["containers"]]:
                paths |= {m["mountPath"] for m in container.get("volumeMounts", [])}
            label_keys |= set(template["metadata"]["labels"])
            annotation_keys |= set(template["metadata"].get("annotations", {}))
    return volumes, paths, label_keys, annotation_keys


def test_every_name_m3fleet_renders_is_refused_in_pod_template() -> None:
    volumes, paths, label_keys, annotation_keys = _rendered_names()
    assert {"dshm", "home", "model", "model-cache", "model-link", "engine-config", "mpi-ssh"} <= volumes
    assert {"/dev/shm", "/models", "/model-cache", "/m3fleet-model"} <= paths  # the samples did render pods
    cases = [
        *[({"volumes": [{"name": name, "emptyDir": {}}]}, "a volume m3fleet mounts") for name in volumes],
        *[
            (
                {"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": p}]},
                "mount over",
            )
            for p in paths | set(OWNED_MOUNT_PATHS)
        ],
        *[({"metadata": {"labels": {key: "x"}}}, "is m3fleet's") for key in label_keys],
        *[({"metadata": {"annotations": {key: "x"}}}, "is m3fleet's") for key in annotation_keys],
    ]
    for template, fragment in cases:
        failed = failed_rules(with_spec(podTemplate=template))
        assert len(failed) == 1 and fragment in failed[0].message, (template, [r.message for r in failed])
        assert admit(with_spec(podTemplate=template)) != []


def _pending(scheduler: str | None, conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec = {"schedulerName": scheduler} if scheduler else {}
    return {"metadata": {"name": "p"}, "spec": spec, "status": {"phase": "Pending", "conditions": conditions or []}}


def test_status_says_when_the_named_scheduler_has_not_placed_the_pods() -> None:
    said = unschedulable([_pending("volcano"), _pending("volcano")])
    assert said is not None and said.startswith("2 of 2 pods cannot be scheduled: they name scheduler volcano"), said
    assert "fix: check that volcano runs" in said
    # The default scheduler, or a scheduler that has looked at the pod (it sets PodScheduled), says nothing new.
    assert unschedulable([_pending(None), _pending("default-scheduler")]) is None
    tried = {"type": "PodScheduled", "status": "False", "reason": "Pending", "message": "gang of 2 not ready"}
    assert unschedulable([_pending("volcano", [tried])]) is None


def test_status_says_when_scheduling_gates_hold_the_pods() -> None:
    gated = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "gates"}
    pod = _pending(None, [gated])
    pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    said = unschedulable([pod, _pending(None)])
    assert said is not None and said.startswith("1 of 2 pods cannot be scheduled: they wait on scheduling gates "), said
    assert "kueue.x-k8s.io/admission" in said and "kubectl get workloads" in said, said
    # Gates lifted (none left, or the pod already bound to a node): nothing to say.
    pod["spec"]["schedulingGates"] = []
    assert unschedulable([pod]) is None
    pod["spec"].update(schedulingGates=[{"name": "example.com/hold"}], nodeName="h200-0")
    assert unschedulable([pod]) is None

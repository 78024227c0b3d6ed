"""The model cache's pure core: the per-node work plan, the resource's validation, and what a deployment that
names a cache renders (mount and node affinity)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from m3fleet.api import parse_resource
from m3fleet.api.cache import (
    DEFAULT_PATH_PREFIXES,
    MiniMaxM3ModelCache,
    allowed_image_repositories,
    allowed_prefixes,
    foreign_files_message,
    node_label_key,
    path_not_allowed,
)
from m3fleet.cache.plan import (
    BAD_SOURCE_EXIT_CODE,
    CLEAN,
    FINALIZER,
    STAGE,
    UNREACHABLE_SECONDS,
    Inputs,
    JobView,
    Letting,
    NodeView,
    OtherCache,
    let_go,
    plan_cache,
    retry_delay,
)
from m3fleet.controller.cache import of_other_caches
from m3fleet.errors import SpecError
from m3fleet.planner import plan
from m3fleet.render import POD_SECURITY_ANNOTATION, cache_mount, render
from tests.support.samples import SAMPLES_DIR, load_sample

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200", "kubernetes.io/arch": "amd64"}
LABEL = node_label_key("llm", "m3")
NOW = 1_000_000.0


def cache_doc(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "source": {"huggingFace": {"repo": "MiniMaxAI/MiniMax-M3", "revision": "a" * 40}},
        "nodes": {"accelerator": "h200"},
        "path": "/mnt/nvme/m3",
    }
    body.update(spec)
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3ModelCache",
        "metadata": {"name": "m3", "namespace": "llm"},
        "spec": body,
    }


def the_cache(**spec: Any) -> MiniMaxM3ModelCache:
    return MiniMaxM3ModelCache.model_validate(cache_doc(**spec))


def nodes(*names: str, labelled: tuple[str, ...] = ()) -> list[NodeView]:
    return [NodeView(n, {**H200, **({LABEL: "ready"} if n in labelled else {})}) for n in names]


def job(node: str, state: str, attempt: int = 1, cache: MiniMaxM3ModelCache | None = None, **kw: Any) -> JobView:
    spec = (cache or the_cache()).spec
    kw.setdefault("path", spec.path)
    content = spec.content_digest()
    return JobView(f"j-{node}-{attempt}", f"uid-{node}-{attempt}", node, content, STAGE, attempt, state, **kw)


def inputs(cache: MiniMaxM3ModelCache | None = None, **kw: Any) -> Inputs:
    base: dict[str, Any] = {"uid": "u1", "nodes": [], "jobs": [], "images": [], "now": NOW, "stager_image": "op:1"}
    base["allowed_prefixes"] = ("/mnt", "/srv")  # an admin's choice wide enough for the directories used here
    base.update(kw)
    return Inputs(cache=cache or the_cache(), **base)


def test_each_pool_node_gets_one_pinned_staging_job_and_only_pool_nodes() -> None:
    other = NodeView("cpu-0", {"kubernetes.io/arch": "amd64"})
    work = plan_cache(inputs(nodes=[*nodes("h200-0", "h200-1"), other]))
    pinned = [
        j["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        for j in work.create
    ]
    assert [p["nodeSelectorTerms"][0]["matchFields"][0]["values"] for p in pinned] == [["h200-0"], ["h200-1"]]
    container = work.create[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["m3fleet", "stage", "huggingface"]
    assert container["image"] == "op:1"
    assert work.create[0]["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] == "/mnt/nvme/m3"
    rule = work.create[0]["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [BAD_SOURCE_EXIT_CODE]
    assert work.status["nodesSummary"] == "0/2" and work.labels == {}
    assert {n["name"]: n["phase"] for n in work.nodes} == {"h200-0": "Staging", "h200-1": "Staging"}
    assert all(len(j["metadata"]["name"]) <= 63 for j in work.create)


def test_the_token_is_referenced_never_copied() -> None:
    cache = the_cache(
        source={
            "huggingFace": {
                "repo": "MiniMaxAI/MiniMax-M3",
                "revision": "b" * 40,
                "tokenSecretRef": {"name": "hf", "key": "token"},
                "endpoint": "http://mirror:8080",
            }
        }
    )
    env = plan_cache(inputs(cache, nodes=nodes("h200-0"))).create[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in env
    assert {"name": "HF_ENDPOINT", "value": "http://mirror:8080"} in env


def test_only_a_completed_job_of_the_current_content_labels_its_node() -> None:
    work = plan_cache(
        inputs(
            nodes=nodes("h200-0", "h200-1", "h200-2", labelled=("h200-1",)),
            jobs=[job("h200-0", "Complete"), job("h200-1", "Active"), job("h200-2", "Failed", finished_at=NOW)],
        )
    )
    assert work.labels == {"h200-0": "ready", "h200-1": None}  # h200-1 is being rewritten: not ready
    assert work.create == []  # running, or failed and waiting for its backoff
    assert work.status["nodesSummary"] == "1/3"
    assert work.requeue_after == retry_delay(1)
    degraded = next(c for c in work.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "StagingFailed")


def test_a_failed_job_is_retried_with_a_new_attempt_after_its_backoff() -> None:
    failed = job("h200-0", "Failed", attempt=2, finished_at=NOW - retry_delay(2) - 1, message="disk full")
    work = plan_cache(inputs(nodes=nodes("h200-0"), jobs=[failed]))
    assert [j["metadata"]["annotations"]["m3fleet.dev/attempt"] for j in work.create] == ["3"]
    assert retry_delay(1) < retry_delay(2) < retry_delay(20) == 1800.0


def test_a_changed_source_restages_and_removes_the_label_first() -> None:
    old = the_cache()
    new = the_cache(source={"huggingFace": {"repo": "MiniMaxAI/MiniMax-M3", "revision": "c" * 40}})
    work = plan_cache(
        inputs(new, nodes=nodes("h200-0", labelled=("h200-0",)), jobs=[job("h200-0", "Complete", cache=old)])
    )
    assert work.labels == {"h200-0": None} and len(work.create) == 1
    assert work.delete == []  # the old record stays until the new copy is complete


def test_a_rejected_source_keeps_the_copy_staged_before() -> None:
    old = the_cache()
    new = the_cache(source={"huggingFace": {"repo": "MiniMaxAI/MiniMax-M3", "revision": "d" * 40}})
    message = "revision ddd does not exist"
    rejected = job("h200-0", "Failed", cache=new, bad_source=True, message=message, finished_at=NOW)
    work = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[job("h200-0", "Complete", cache=old), rejected]))
    assert work.labels == {"h200-0": "ready"} and work.create == [] and work.delete == []
    degraded = next(c for c in work.conditions if c.type == "Degraded")
    assert degraded.reason == "SourceRejected" and "revision ddd does not exist" in degraded.message


def test_a_pool_with_no_nodes_says_so_and_touches_nothing() -> None:
    cache = the_cache(nodes={"accelerator": "h200", "nodeSelector": {"pool": "typo"}})
    staged = nodes("h200-0", labelled=("h200-0",))
    work = plan_cache(inputs(cache, nodes=staged, jobs=[job("h200-0", "Complete", cache=cache)]))
    assert work.create == [] and work.delete == [] and work.labels == {}
    ready = next(c for c in work.conditions if c.type == "Ready")
    assert ready.reason == "NoNodes" and "nodeSelector {'pool': 'typo'}" in ready.message and "fix:" in ready.message


def test_a_missing_secret_blocks_new_jobs_only() -> None:
    work = plan_cache(
        inputs(nodes=nodes("h200-0", "h200-1"), jobs=[job("h200-0", "Complete")], secret_missing="hf-token")
    )
    assert work.create == [] and work.labels == {"h200-0": "ready"}
    degraded = next(c for c in work.conditions if c.type == "Degraded")
    assert degraded.reason == "SecretNotFound" and "hf-token" in degraded.message
    assert work.requeue_after == 60.0


def test_jobs_of_nodes_that_are_gone_are_deleted() -> None:
    work = plan_cache(inputs(nodes=nodes("h200-0"), jobs=[job("h200-0", "Complete"), job("h200-9", "Complete")]))
    assert [j.node for j in work.delete] == ["h200-9"]


def test_pre_pull_daemonset_runs_each_engine_image_as_an_init_container() -> None:
    work = plan_cache(inputs(nodes=nodes("h200-0"), images=["vllm:2", "vllm:1", "vllm:2"]))
    ds = work.daemonset
    assert ds is not None
    pod = ds["spec"]["template"]["spec"]
    assert [(c["image"], c["command"]) for c in pod["initContainers"]] == [
        ("vllm:1", ["sh", "-c", "exit 0"]),
        ("vllm:2", ["sh", "-c", "exit 0"]),
    ]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert ds["metadata"]["ownerReferences"][0]["kind"] == "MiniMaxM3ModelCache"
    off = plan_cache(inputs(the_cache(prePullImages=False), images=["vllm:1"], daemonset_exists=True))
    assert off.daemonset is None and off.delete_daemonset


def test_removal_drops_labels_and_cleans_files_when_asked() -> None:
    staged = [job("h200-0", "Complete")]
    keep = plan_cache(inputs(nodes=nodes("h200-0", labelled=("h200-0",)), jobs=staged, deleting=True))
    assert keep.labels == {"h200-0": None} and keep.create == [] and not keep.release
    assert plan_cache(inputs(nodes=nodes("h200-0"), jobs=[job("h200-0", "Complete")], deleting=True)).release

    cache = the_cache(deleteFilesOnRemoval=True)
    staged = [job("h200-0", "Complete", cache=cache)]
    work = plan_cache(inputs(cache, nodes=nodes("h200-0"), jobs=staged, deleting=True))
    assert [j["metadata"]["labels"]["m3fleet.dev/cache-action"] for j in work.create] == [CLEAN]
    assert work.create[0]["spec"]["template"]["spec"]["containers"][0]["command"][:3] == ["m3fleet", "stage", "clean"]
    assert not work.release
    cleaned = JobView("c", "cu", "h200-0", cache.spec.content_digest(), CLEAN, 1, "Complete", path=cache.spec.path)
    done = plan_cache(inputs(cache, nodes=nodes("h200-0"), jobs=[*staged, cleaned], deleting=True))
    assert done.release and done.create == []


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"path": "mnt/nvme"}, "path", "absolute"),
        ({"path": "/mnt/../etc"}, "path", "absolute"),
        ({"path": "/etc"}, "path", "system directory"),
        ({"source": {"huggingFace": {"repo": "MiniMaxAI/MiniMax-M3", "revision": "main"}}}, "revision", "pinned"),
        ({"source": {}}, "source", "neither pvc nor huggingFace"),
    ],
)
def test_bad_input_names_the_field_and_the_fix(spec: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ValidationError) as info:
        the_cache(**spec)
    text = str(info.value)
    assert field in text and words in text and "fix" in str(info.value.errors()[0].get("ctx", {}))


def _vllm(cache_ref: dict[str, Any] | None) -> Any:
    doc = copy.deepcopy(load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml"))
    doc["metadata"]["namespace"] = "llm"
    if cache_ref is not None:
        doc["spec"]["model"]["cacheRef"] = cache_ref
    return parse_resource(doc)


def _pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    workload = next(o for o in objects if o["kind"] == "Deployment")
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def test_a_deployment_with_a_required_cache_mounts_the_copy_and_runs_only_where_it_is() -> None:
    resource = _vllm({"name": "m3"})
    p = plan(resource.spec)
    assert (p.model_cache, p.model_cache_node_affinity) == ("m3", "Required")
    pod = _pod(render(resource, p, cache=cache_mount(resource, the_cache())))
    assert {"name": "model-cache", "hostPath": {"path": "/mnt/nvme/m3", "type": "Directory"}} in pod["volumes"]
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model-cache")
    assert mount == {"name": "model-cache", "mountPath": "/models", "readOnly": True}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": LABEL, "operator": "In", "values": ["ready"]} in terms[0]["matchExpressions"]
    assert "/models" in pod["containers"][0]["args"] or "/models" in pod["containers"][0]["command"]


def test_a_preferred_cache_falls_back_to_the_claim_where_there_is_no_copy() -> None:
    resource = _vllm({"name": "m3", "nodeAffinity": "Preferred"})
    pod = _pod(render(resource, plan(resource.spec), cache=cache_mount(resource, the_cache())))
    preferred = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["preference"]["matchExpressions"][0]["key"] == LABEL
    (init,) = pod["initContainers"]
    script = init["command"][2]
    assert "/model-cache/.m3fleet-complete.json" in script and "target=/models" in script
    assert any("persistentVolumeClaim" in v for v in pod["volumes"])
    assert "/m3fleet-model/checkpoint" in pod["containers"][0]["args"] + pod["containers"][0]["command"]


def test_a_deployment_naming_a_missing_cache_is_a_spec_error() -> None:
    resource = _vllm({"name": "nope"})
    with pytest.raises(SpecError) as info:
        render(resource, plan(resource.spec))
    assert info.value.field == "spec.model.cacheRef.name" and "nope" in info.value.problem


def test_preferred_needs_a_claim_to_fall_back_to() -> None:
    doc = copy.deepcopy(load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml"))
    doc["spec"]["model"]["source"] = {"huggingFace": {"cacheClaimName": "hf"}}
    doc["spec"]["model"]["cacheRef"] = {"name": "m3", "nodeAffinity": "Preferred"}
    with pytest.raises(Exception) as info:
        parse_resource(doc)
    assert "spec.model.cacheRef.nodeAffinity" in str(info.value) and "pvc" in str(info.value)


def test_without_a_cache_nothing_changes() -> None:
    resource = _vllm(None)
    p = plan(resource.spec)
    assert p.model_cache is None and "modelCache" not in p.model_dump(by_alias=True, exclude_none=True)
    assert render(resource, p) == render(resource, p, cache=None)


def test_a_job_is_read_from_the_job_controllers_conditions_and_its_pods_termination_message() -> None:
    from m3fleet.controller.cache import job_view

    cache = the_cache()
    job = plan_cache(inputs(cache, nodes=nodes("h200-0"))).create[0]
    job["status"] = {
        "conditions": [
            {"type": "FailureTarget", "status": "True"},
            {
                "type": "Failed",
                "status": "True",
                "reason": "PodFailurePolicy",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
        ]
    }
    terminated = {"exitCode": BAD_SOURCE_EXIT_CODE, "message": "revision x does not exist"}
    pod = {"status": {"containerStatuses": [{"state": {"terminated": terminated}}]}}
    view = job_view(job, [pod])
    assert (view.node, view.state, view.bad_source, view.attempt) == ("h200-0", "Failed", True, 1)
    assert view.message == "revision x does not exist" and view.content == cache.spec.content_digest()
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert job_view(job, []).state == "Complete"
    job["status"] = {}
    assert job_view(job, []).state == "Active"


def test_removal_cleans_a_node_whose_running_staging_job_it_stopped() -> None:
    cache = the_cache(deleteFilesOnRemoval=True)
    running = job("h200-0", "Active", cache=cache)
    first = plan_cache(inputs(cache, nodes=nodes("h200-0"), jobs=[running], deleting=True))
    assert first.delete == [running] and first.create == []  # stop writing first
    assert [n["name"] for n in first.nodes] == ["h200-0"] and not first.release  # the record is the status
    reported = [{"name": "h200-0", "phase": "Removing", "attempts": 0}]
    second = plan_cache(inputs(cache, nodes=nodes("h200-0"), jobs=[], deleting=True, reported_nodes=reported))
    assert [j["metadata"]["labels"]["m3fleet.dev/cache-action"] for j in second.create] == [CLEAN]
    assert not second.release


def test_a_new_spec_waits_until_the_old_spec_s_job_has_stopped_writing() -> None:
    """Two Jobs must never write one directory: the old one is deleted (foreground), and the new one is created only
    once it is gone."""
    old = the_cache()
    new = the_cache(source={"huggingFace": {"repo": "MiniMaxAI/MiniMax-M3", "revision": "c" * 40}})
    writing = job("h200-0", "Active", cache=old)
    work = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[writing]))
    assert work.create == [] and work.delete == [writing] and work.requeue_after is not None
    stopping = job("h200-0", "Active", cache=old, stopping=True)
    work = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[stopping]))
    assert work.create == [] and work.delete == []  # asked once; its pods are still going
    work = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[]))
    assert len(work.create) == 1


def test_a_rejected_source_with_a_new_path_keeps_no_label() -> None:
    """The pods mount the new path, which the old copy is not in."""
    old = the_cache()
    source = {"huggingFace": {"repo": "MiniMaxAI/MiniMax-M3", "revision": "d" * 40}}
    new = the_cache(path="/mnt/nvme/elsewhere", source=source)
    rejected = job("h200-0", "Failed", cache=new, bad_source=True, message="no such revision", finished_at=NOW)
    work = plan_cache(
        inputs(new, nodes=nodes("h200-0", labelled=("h200-0",)), jobs=[job("h200-0", "Complete", cache=old), rejected])
    )
    assert work.labels == {"h200-0": None}


def test_a_retried_attempt_replaces_the_failed_one() -> None:
    failed = job("h200-0", "Failed", finished_at=NOW - 3600, message="disk full")
    work = plan_cache(inputs(nodes=nodes("h200-0"), jobs=[failed]))
    assert len(work.create) == 1 and work.delete == [failed]


def test_removal_cleans_cordoned_nodes_that_staged_and_skips_those_that_never_did() -> None:
    cache = the_cache(deleteFilesOnRemoval=True)
    cordoned = [NodeView(n, dict(H200), False) for n in ("h200-0", "h200-1")]
    reported = [
        {"name": "h200-0", "phase": "Failed", "attempts": 2},
        {"name": "h200-1", "phase": "Pending", "attempts": 0, "message": "node is cordoned (unschedulable)"},
    ]
    work = plan_cache(inputs(cache, nodes=cordoned, deleting=True, reported_nodes=reported))
    (created,) = work.create
    assert created["metadata"]["annotations"]["m3fleet.dev/node"] == "h200-0"
    tolerations = created["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def _host_path(created: dict[str, Any]) -> str:
    (volume,) = [v for v in created["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
    return str(volume["hostPath"]["path"])


def test_a_path_change_removes_the_old_directory_once_the_new_copy_is_complete() -> None:
    old = the_cache(deleteFilesOnRemoval=True)
    new = the_cache(deleteFilesOnRemoval=True, path="/mnt/nvme/m3-v2")
    before = job("h200-0", "Complete", cache=old)
    staging = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[before, job("h200-0", "Active", 2, cache=new)]))
    assert staging.create == [] and staging.delete == []  # the pods may still use the old copy: nothing goes yet

    staged = job("h200-0", "Complete", 2, cache=new)
    work = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[before, staged]))
    (cleanup,) = work.create
    assert cleanup["metadata"]["labels"]["m3fleet.dev/cache-action"] == CLEAN and _host_path(cleanup) == "/mnt/nvme/m3"
    assert cleanup["metadata"]["labels"]["m3fleet.dev/cache-content"] == old.spec.content_digest()
    assert work.delete == [] and work.labels == {"h200-0": "ready"}  # the old Job stays the record of the old copy
    assert work.nodes[0]["phase"] == "Ready" and "removing the copy in /mnt/nvme/m3" in work.nodes[0]["message"]

    def cleaned(state: str, **kw: Any) -> JobView:
        return JobView("c", "cu", "h200-0", old.spec.content_digest(), CLEAN, 1, state, path="/mnt/nvme/m3", **kw)

    running = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[before, staged, cleaned("Active")]))
    assert running.create == [] and running.delete == []
    failed = cleaned("Failed", finished_at=NOW, message="permission denied")
    waiting = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[before, staged, failed]))
    assert (
        waiting.create == [] and waiting.requeue_after == retry_delay(1) and "permission denied" in str(waiting.nodes)
    )
    later = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[before, staged, failed], now=NOW + retry_delay(1)))
    assert [(_host_path(j), j["metadata"]["annotations"]["m3fleet.dev/attempt"]) for j in later.create] == [
        ("/mnt/nvme/m3", "2")
    ]
    done = cleaned("Complete")
    finished = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[before, staged, done]))
    assert finished.create == [] and finished.delete == [before, done] and finished.nodes[0]["message"] == ""


def test_a_path_change_keeps_the_old_files_unless_asked_and_never_touches_a_nested_directory() -> None:
    for old, new in (
        (the_cache(), the_cache(path="/mnt/nvme/m3-v2")),  # deleteFilesOnRemoval is off: files are the user's
        (the_cache(deleteFilesOnRemoval=True), the_cache(deleteFilesOnRemoval=True, path="/mnt/nvme/m3/v2")),
        (the_cache(deleteFilesOnRemoval=True, path="/mnt/nvme/m3/v2"), the_cache(deleteFilesOnRemoval=True)),
    ):
        before, staged = job("h200-0", "Complete", cache=old), job("h200-0", "Complete", 2, cache=new)
        work = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[before, staged]))
        assert work.create == [] and work.delete == [before], new.spec.path


def test_removal_cleans_a_directory_a_path_change_left_behind_too() -> None:
    old = the_cache(deleteFilesOnRemoval=True)
    new = the_cache(deleteFilesOnRemoval=True, path="/mnt/nvme/m3-v2")
    jobs = [job("h200-0", "Complete", cache=old), job("h200-0", "Complete", 2, cache=new)]
    work = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=jobs, deleting=True))
    assert sorted(_host_path(j) for j in work.create) == ["/mnt/nvme/m3", "/mnt/nvme/m3-v2"] and not work.release
    cleaned = [
        JobView(f"c{i}", f"cu{i}", "h200-0", c.spec.content_digest(), CLEAN, 1, "Complete", path=c.spec.path)
        for i, c in enumerate((old, new))
    ]
    assert plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[*jobs, *cleaned[1:]], deleting=True)).release is False
    assert plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[*jobs, *cleaned], deleting=True)).release


def test_removal_waits_for_a_node_that_is_not_ready_then_leaves_its_copy_and_says_so() -> None:
    cache = the_cache(deleteFilesOnRemoval=True)
    staged = [job("h200-0", "Complete", cache=cache), job("h200-1", "Complete", cache=cache)]
    down = NodeView("h200-1", dict(H200), True, not_ready_since=NOW - UNREACHABLE_SECONDS + 60)
    cleaned = JobView("c", "cu", "h200-0", cache.spec.content_digest(), CLEAN, 1, "Complete", path=cache.spec.path)
    jobs = [*staged, cleaned]
    waiting = plan_cache(inputs(cache, nodes=[*nodes("h200-0"), down], jobs=jobs, deleting=True))
    assert [j["metadata"]["annotations"]["m3fleet.dev/node"] for j in waiting.create] == ["h200-1"]
    assert not waiting.release and waiting.left_behind == []  # a reboot: it may come back
    later = plan_cache(inputs(cache, nodes=[*nodes("h200-0"), down], jobs=jobs, deleting=True, now=NOW + 60))
    assert later.release and later.create == []
    (message,) = later.left_behind
    assert "node h200-1 has not been Ready for 15 minutes: its copy in /mnt/nvme/m3 is left there" in message
    assert "remove it by hand" in message


def test_a_directory_another_cache_uses_is_never_cleaned() -> None:
    old = the_cache(deleteFilesOnRemoval=True)
    new = the_cache(deleteFilesOnRemoval=True, path="/mnt/nvme/m3-v2")
    before, staged = job("h200-0", "Complete", cache=old), job("h200-0", "Complete", 2, cache=new)
    for other in ("/mnt/nvme/m3", "/mnt/nvme/m3/weights", "/mnt/nvme"):  # the old directory, inside it, holding it
        work = plan_cache(
            inputs(new, nodes=nodes("h200-0"), jobs=[before, staged], others=[OtherCache("llm/b", other)])
        )
        assert work.create == [] and work.delete == [before], other
    moved = plan_cache(
        inputs(new, nodes=nodes("h200-0"), jobs=[before, staged], others=[OtherCache("llm/b", "/srv/b")])
    )
    assert [_host_path(j) for j in moved.create] == ["/mnt/nvme/m3"]  # an unrelated directory changes nothing

    shared = plan_cache(
        inputs(old, nodes=nodes("h200-0"), jobs=[before], deleting=True, others=[OtherCache("team/b", "/mnt/nvme/m3")])
    )
    assert shared.create == [] and shared.release
    assert shared.left_behind == ["the files in /mnt/nvme/m3 are left on every node: cache team/b uses them"]


def _cleaned(cache: MiniMaxM3ModelCache, state: str, attempt: int = 1, **kw: Any) -> JobView:
    content = cache.spec.content_digest()
    return JobView(f"c{attempt}", f"cu{attempt}", "h200-0", content, CLEAN, attempt, state, path=cache.spec.path, **kw)


def test_a_path_changed_back_to_a_directory_being_emptied_waits_then_stages_again() -> None:
    a = the_cache(deleteFilesOnRemoval=True)
    b = the_cache(deleteFilesOnRemoval=True, path="/mnt/nvme/m3-v2")
    staged_a = job("h200-0", "Complete", cache=a, finished_at=NOW - 600)
    staged_b = job("h200-0", "Complete", 2, cache=b, finished_at=NOW - 300)
    jobs = [staged_a, staged_b]
    labelled = nodes("h200-0", labelled=("h200-0",))
    waiting = plan_cache(inputs(a, nodes=labelled, jobs=[*jobs, _cleaned(a, "Active")]))
    assert waiting.create == [] and waiting.delete == [] and waiting.labels == {"h200-0": None}
    assert "waiting for cleanup job c1" in waiting.nodes[0]["message"] and waiting.requeue_after is not None

    emptied = _cleaned(a, "Complete", finished_at=NOW - 60)  # after A's copy completed: that copy is gone
    again = plan_cache(inputs(a, nodes=nodes("h200-0"), jobs=[*jobs, emptied]))
    (created,) = again.create
    assert created["metadata"]["labels"]["m3fleet.dev/cache-action"] == STAGE and _host_path(created) == "/mnt/nvme/m3"
    assert created["metadata"]["annotations"]["m3fleet.dev/attempt"] == "2"  # a new attempt: a new Job name
    assert staged_a in again.delete and emptied in again.delete and again.labels == {}

    restaged = job("h200-0", "Complete", 2, cache=a, finished_at=NOW)
    ready = plan_cache(inputs(a, nodes=nodes("h200-0"), jobs=[staged_b, restaged]))
    assert ready.labels == {"h200-0": "ready"} and [_host_path(j) for j in ready.create] == ["/mnt/nvme/m3-v2"]


def test_no_staging_into_a_directory_inside_one_being_emptied() -> None:
    a = the_cache(deleteFilesOnRemoval=True)
    inner = the_cache(deleteFilesOnRemoval=True, path="/mnt/nvme/m3/sub")
    work = plan_cache(inputs(inner, nodes=nodes("h200-0"), jobs=[_cleaned(a, "Active")]))
    assert work.create == [] and "waiting for cleanup job" in work.nodes[0]["message"]


def test_the_old_directory_stays_while_engine_pods_on_the_node_mount_it() -> None:
    old = the_cache(deleteFilesOnRemoval=True)
    new = the_cache(deleteFilesOnRemoval=True, path="/mnt/nvme/m3-v2")
    jobs = [job("h200-0", "Complete", cache=old), job("h200-0", "Complete", 2, cache=new)]
    mounted = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=jobs, mounts={"h200-0": ["/mnt/nvme/m3"]}))
    assert mounted.create == [] and mounted.delete == [] and mounted.requeue_after == 60.0
    assert "keeping the copy in /mnt/nvme/m3 while pods on the node mount it" in mounted.nodes[0]["message"]
    elsewhere = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=jobs, mounts={"h200-1": ["/mnt/nvme/m3"]}))
    assert [_host_path(j) for j in elsewhere.create] == ["/mnt/nvme/m3"]


def test_removal_does_not_trust_a_cleanup_older_than_the_last_copy() -> None:
    cache = the_cache(deleteFilesOnRemoval=True)
    staged = job("h200-0", "Complete", 2, cache=cache, finished_at=NOW - 60)
    stale = _cleaned(cache, "Complete", finished_at=NOW - 600)
    work = plan_cache(inputs(cache, nodes=nodes("h200-0"), jobs=[staged, stale], deleting=True))
    assert [j["metadata"]["annotations"]["m3fleet.dev/attempt"] for j in work.create] == ["2"] and not work.release


def test_removal_with_a_shared_directory_still_cleans_one_only_it_left_behind() -> None:
    old = the_cache(deleteFilesOnRemoval=True, path="/mnt/nvme/old")
    new = the_cache(deleteFilesOnRemoval=True)
    jobs = [job("h200-0", "Complete", cache=old), job("h200-0", "Complete", 2, cache=new)]
    work = plan_cache(
        inputs(new, nodes=nodes("h200-0"), jobs=jobs, deleting=True, others=[OtherCache("x/b", "/mnt/nvme/m3")])
    )
    assert [_host_path(j) for j in work.create] == ["/mnt/nvme/old"]


def test_a_copy_stopped_half_way_by_a_path_change_is_remembered_and_emptied() -> None:
    old = the_cache(deleteFilesOnRemoval=True)
    new = the_cache(deleteFilesOnRemoval=True, path="/mnt/nvme/m3-v2")
    writer = job("h200-0", "Active", cache=old)
    stopping = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[writer]))
    assert stopping.delete == [writer] and stopping.nodes[0]["leftBehind"] == ["/mnt/nvme/m3"]

    # The Job is gone: status is the record. It is carried through staging, then emptied once the new copy is in.
    staging = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[], reported_nodes=stopping.nodes))
    assert [_host_path(j) for j in staging.create] == ["/mnt/nvme/m3-v2"]
    assert staging.nodes[0]["leftBehind"] == ["/mnt/nvme/m3"]
    staged = job("h200-0", "Complete", cache=new)
    work = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[staged], reported_nodes=staging.nodes))
    (cleanup,) = work.create
    assert cleanup["metadata"]["labels"]["m3fleet.dev/cache-action"] == CLEAN and _host_path(cleanup) == "/mnt/nvme/m3"
    assert work.nodes[0]["leftBehind"] == ["/mnt/nvme/m3"]
    content = cleanup["metadata"]["labels"]["m3fleet.dev/cache-content"]
    done = JobView("c", "cu", "h200-0", content, CLEAN, 1, "Complete", path="/mnt/nvme/m3", finished_at=NOW)
    finished = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[staged, done], reported_nodes=work.nodes))
    assert finished.create == [] and finished.delete == [done] and "leftBehind" not in finished.nodes[0]

    # Deleted before that: the removal empties both directories, and keeps the record until both are done.
    removal = plan_cache(inputs(new, nodes=nodes("h200-0"), jobs=[staged], deleting=True, reported_nodes=work.nodes))
    assert sorted(_host_path(j) for j in removal.create) == ["/mnt/nvme/m3", "/mnt/nvme/m3-v2"]
    assert removal.nodes == [
        {
            "name": "h200-0",
            "phase": "Removing",
            "attempts": 0,
            "message": "removing the copy",
            "leftBehind": ["/mnt/nvme/m3"],
        }
    ]


def _named(name: str, **spec: Any) -> MiniMaxM3ModelCache:
    doc = cache_doc(**spec)
    doc["metadata"]["name"] = name
    return MiniMaxM3ModelCache.model_validate(doc)


def _condition(work: Any, kind: str) -> Any:
    return next(c for c in work.conditions if c.type == kind)


def test_the_cache_created_second_stages_nothing_into_the_first_ones_directory() -> None:
    first = OtherCache("team/a", "/mnt/nvme", "2026-11-01T00:00:00Z", _named("a", path="/mnt/nvme"))
    for others in ([first], [OtherCache("team/a", "/mnt/nvme/m3", first.created, first.cache)]):
        work = plan_cache(inputs(nodes=nodes("h200-0", "h200-1"), created="2026-11-02T00:00:00Z", others=others))
        assert work.create == [] and work.labels == {}
        assert {n["phase"] for n in work.nodes} == {"Pending"}
        assert "is the directory of cache team/a (created first) here" in work.nodes[0]["message"]
        degraded = _condition(work, "Degraded")
        assert (degraded.status, degraded.reason) == ("True", "PathConflict")
        assert "spec.path: /mnt/nvme/m3" in degraded.message and "h200-0 (team/a), h200-1 (team/a)" in degraded.message
        assert "fix: give this cache a directory of its own" in degraded.message
        assert _condition(work, "Ready").reason == "PathConflict"
    # The first cache is not held back by the second; same-second creations go by namespace/name.
    second = OtherCache("team/b", "/mnt/nvme/m3", "2026-11-02T00:00:00Z", _named("b"))
    assert len(plan_cache(inputs(nodes=nodes("h200-0"), created="2026-11-01T00:00:00Z", others=[second])).create) == 1
    tie = OtherCache("llm/l", "/mnt/nvme/m3", "2026-11-01T00:00:00Z", _named("l"))
    assert plan_cache(inputs(nodes=nodes("h200-0"), created=tie.created, others=[tie])).create == []  # llm/l < llm/m3
    # A cache whose spec does not parse stages nothing and holds no directory.
    broken = OtherCache("team/a", "/mnt/nvme/m3", "2026-11-01T00:00:00Z", None)
    assert len(plan_cache(inputs(nodes=nodes("h200-0"), created="2026-11-02T00:00:00Z", others=[broken])).create) == 1


def test_one_directory_serves_two_caches_whose_pools_do_not_meet() -> None:
    gb200 = OtherCache("team/a", "/mnt/nvme/m3", "2026-11-01T00:00:00Z", _named("a", nodes={"accelerator": "gb200"}))
    work = plan_cache(inputs(nodes=nodes("h200-0"), created="2026-11-02T00:00:00Z", others=[gb200]))
    assert len(work.create) == 1 and _condition(work, "Degraded").reason == "AsExpected"
    # Only where the pools meet: a node the first cache's nodeSelector leaves out is staged.
    picky = _named("a", nodes={"accelerator": "h200", "nodeSelector": {"pool": "a"}})
    mixed = [NodeView("h200-0", {**H200, "pool": "a"}), *nodes("h200-1")]
    first = OtherCache("team/a", "/mnt/nvme/m3", "2026-11-01T00:00:00Z", picky)
    work = plan_cache(inputs(nodes=mixed, created="2026-11-02T00:00:00Z", others=[first]))
    assert [j["metadata"]["annotations"]["m3fleet.dev/node"] for j in work.create] == ["h200-1"]
    assert "h200-0 (team/a)" in _condition(work, "Degraded").message


def test_a_cache_moved_onto_a_directory_in_use_is_refused_and_the_copy_there_stays() -> None:
    """The first cache edited onto the second's directory: where the second's copy is in use (Ready) the second keeps
    it and the first stages nothing (PathConflict); where the second was still staging, the first's comes first."""
    first = OtherCache("team/a", "/mnt/nvme/m3", "2026-11-01T00:00:00Z", _named("a"))
    jobs = [job("h200-0", "Complete"), job("h200-1", "Active")]
    work = plan_cache(
        inputs(nodes=nodes("h200-0", "h200-1", labelled=("h200-0",)), jobs=jobs, created="2026-11-02", others=[first])
    )
    assert work.labels == {} and work.delete == [jobs[1]] and work.create == []
    # The first, as it sees the second: Ready on h200-0 for its current spec (its status says so).
    second = OtherCache("team/b", "/mnt/nvme/m3", "2026-11-02T00:00:00Z", _named("b"), frozenset({"h200-0"}))
    moved = plan_cache(inputs(nodes=nodes("h200-0", "h200-1"), created="2026-11-01", others=[second]))
    reason, message = verdict(moved, "Degraded")
    assert reason == "PathConflict" and "h200-0 (team/b)" in message and "h200-1" not in message
    assert [j["metadata"]["annotations"]["m3fleet.dev/node"] for j in moved.create] == ["h200-1"]


def test_a_directory_another_cache_is_emptying_is_staged_once_its_cleanup_ended() -> None:
    theirs = JobView("b-clean", "ub", "h200-0", "c", CLEAN, 1, "Active", path="/mnt/nvme/m3")
    waiting = plan_cache(inputs(nodes=nodes("h200-0"), foreign_cleans=[theirs]))
    assert waiting.create == [] and waiting.requeue_after is not None
    assert waiting.nodes[0]["message"] == "waiting for cleanup job b-clean of /mnt/nvme/m3"
    done = JobView("b-clean", "ub", "h200-0", "c", CLEAN, 1, "Complete", finished_at=NOW - 5, path="/mnt/nvme/m3")
    assert len(plan_cache(inputs(nodes=nodes("h200-0"), foreign_cleans=[done])).create) == 1
    # A copy completed before another cache's cleanup of its directory ended is gone: staged again, never trusted.
    staged = job("h200-0", "Complete", finished_at=NOW - 60)
    again = plan_cache(inputs(nodes=nodes("h200-0", labelled=("h200-0",)), jobs=[staged], foreign_cleans=[done]))
    assert again.labels == {"h200-0": None} and len(again.create) == 1 and done not in again.delete
    # Elsewhere (another node, an unrelated directory) it changes nothing; another cache's Jobs are never deleted.
    elsewhere = JobView("b-clean", "ub", "h200-1", "c", CLEAN, 1, "Active", path="/mnt/nvme/m3")
    unrelated = JobView("b-clean2", "ub2", "h200-0", "c", CLEAN, 1, "Active", path="/mnt/nvme/other")
    work = plan_cache(inputs(nodes=nodes("h200-0"), foreign_cleans=[elsewhere, unrelated]))
    assert len(work.create) == 1 and work.delete == []


@pytest.mark.parametrize("affinity", ["Required", "Preferred"])
def test_a_deployment_with_a_cache_is_not_labelled_restricted_it_mounts_a_host_path(affinity: str) -> None:
    """Pod Security baseline (and so restricted) forbids hostPath volumes: the honest level is privileged."""
    resource = _vllm({"name": "m3", "nodeAffinity": affinity})
    objects = render(resource, plan(resource.spec), cache=cache_mount(resource, the_cache()))
    workload = next(o for o in objects if o["kind"] == "Deployment")
    assert any("hostPath" in v for v in _pod(objects)["volumes"])
    assert workload["metadata"]["annotations"][POD_SECURITY_ANNOTATION] == "privileged"
    without = _vllm(None)
    plain = next(o for o in render(without, plan(without.spec)) if o["kind"] == "Deployment")
    assert plain["metadata"]["annotations"][POD_SECURITY_ANNOTATION] == "restricted"  # the same pod, no cache


def verdict(work: Any, kind: str) -> tuple[str, str]:
    found = next(v for v in work.conditions if v.type == kind)
    return found.reason, found.message


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/mnt/nvme/m3fleet/m3", True),
        ("/var/lib/m3fleet/models/m3", True),
        ("/mnt/nvme/m3fleet", False),  # the prefix itself: every cache's directory would be inside it
        ("/mnt/nvme/m3", False),
        ("/raid", False),
        ("/var/lib/kubelet", False),
        ("/etc/kubernetes/manifests", False),
        ("/home/someone", False),
    ],
)
def test_a_cache_writes_only_inside_the_prefixes_the_admin_allows(path: str, allowed: bool) -> None:
    cache = the_cache(path=path)
    staged = [job("h200-0", "Complete", cache=cache)]
    # The admin's defaults (/var/lib/m3fleet, /mnt/*/m3fleet): Inputs as the operator builds it with no setting.
    work = plan_cache(Inputs(cache, "u1", nodes("h200-0", labelled=("h200-0",)), staged, [], NOW, "op:1"))
    if allowed:
        assert verdict(work, "Ready")[0] != "PathNotAllowed"
        return
    reason, message = verdict(work, "Degraded")
    assert reason == "PathNotAllowed" and f"spec.path: {path} is not inside" in message
    assert "/var/lib/m3fleet, /mnt/*/m3fleet" in message and "modelCache.allowedPathPrefixes" in message
    assert work.create == [] and work.delete == [] and work.labels == {}  # the node's copy of this spec stays labelled


def test_a_stager_image_the_admin_does_not_allow_runs_nothing_and_an_allowed_one_runs() -> None:
    pool = nodes("h200-0")
    work = plan_cache(inputs(the_cache(stagerImage="docker.io/evil/root:1"), nodes=pool))
    reason, message = verdict(work, "Degraded")
    assert (
        reason == "StagerImageNotAllowed"
        and "docker.io/evil/root:1" in message
        and "allowed repositories: op" in message
    )
    assert work.create == []
    work = plan_cache(
        inputs(
            the_cache(stagerImage="mirror.local/m3fleet/operator@sha256:" + "a" * 64),
            nodes=pool,
            allowed_images=("mirror.local/m3fleet/operator",),
        )
    )
    [created] = work.create
    assert created["spec"]["template"]["spec"]["containers"][0]["image"].startswith("mirror.local/m3fleet/operator@")


def test_admin_settings_are_checked_at_startup() -> None:
    assert allowed_prefixes(None) == ("/var/lib/m3fleet", "/mnt/*/m3fleet")
    assert allowed_prefixes(" /data/m3fleet , /mnt/*/models") == ("/data/m3fleet", "/mnt/*/models")
    for bad in ("/", "relative/dir", "/mnt/../etc", "/etc"):
        with pytest.raises(ValueError, match=r"modelCache\.allowedPathPrefixes"):
            allowed_prefixes(bad)
    assert allowed_image_repositories("", "ghcr.io/m3fleet/operator:0.1.0") == ("ghcr.io/m3fleet/operator",)
    with pytest.raises(ValueError, match=r"modelCache\.allowedStagerImages"):
        allowed_image_repositories("ghcr.io/m3fleet/operator:latest", "op:1")


def test_files_the_cache_did_not_write_are_a_condition_naming_node_path_and_file_and_retried() -> None:
    said = foreign_files_message("/cache", "team-b/llama/model.safetensors", 3) + "; fix: ..."
    failed = job("h200-0", "Failed", finished_at=NOW - 10, bad_source=True, message=said)
    work = plan_cache(inputs(nodes=nodes("h200-0"), jobs=[failed]))
    reason, message = verdict(work, "Degraded")
    assert reason == "ForeignFiles"
    assert message.startswith(
        "spec.path: /mnt/nvme/m3 on node h200-0 holds files m3fleet did not write (first: "
        "team-b/llama/model.safetensors)"
    ), message
    assert work.create == [] and work.requeue_after == pytest.approx(retry_delay(1) - 10)
    later = plan_cache(inputs(nodes=nodes("h200-0"), jobs=[failed], now=NOW + retry_delay(1)))
    assert [j["metadata"]["annotations"]["m3fleet.dev/attempt"] for j in later.create] == ["2"]


def test_a_path_moved_around_the_copy_pods_mount_stages_nothing_until_they_are_off_it() -> None:
    """The issue's case: a live cache's path edited to its parent while engine pods run from the old copy."""
    old = job("h200-0", "Complete", finished_at=NOW - 100)  # the copy in /mnt/nvme/m3
    moved = the_cache(path="/mnt/nvme", deleteFilesOnRemoval=True)
    mounts = {"h200-0": ["/mnt/nvme/m3"]}
    work = plan_cache(inputs(moved, nodes=nodes("h200-0", labelled=("h200-0",)), jobs=[old], mounts=mounts))
    reason, message = verdict(work, "Degraded")
    assert reason == "PathNested" and "/mnt/nvme is nested with /mnt/nvme/m3" in message and "h200-0" in message
    assert work.create == [] and work.delete == []
    inside = the_cache(path="/mnt/nvme/m3/v2", deleteFilesOnRemoval=True)
    work = plan_cache(inputs(inside, nodes=nodes("h200-0"), jobs=[old], mounts=mounts))
    assert verdict(work, "Degraded")[0] == "PathNested" and work.create == []
    # Off it: staged (the staging program itself refuses a directory holding files it did not write), never cleaned.
    work = plan_cache(inputs(moved, nodes=nodes("h200-0"), jobs=[old], mounts={}))
    assert [j["metadata"]["labels"]["m3fleet.dev/cache-action"] for j in work.create] == [STAGE]


def test_cleanup_jobs_count_only_when_a_live_cache_controls_them_in_its_namespace() -> None:
    def clean_job(namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "c", "namespace": namespace, "labels": {}}
        if owner is not None:
            meta["ownerReferences"] = [{"kind": "MiniMaxM3ModelCache", "controller": True, **owner}]
        return {"metadata": meta}

    caches = [
        {"metadata": {"name": "a", "namespace": "team-a", "uid": "ua"}},
        {"metadata": {"name": "me", "namespace": "llm", "uid": "me"}},
    ]
    real = clean_job("team-a", {"uid": "ua"})
    forged = [
        clean_job("forger", None),  # no owner
        clean_job("forger", {"uid": "ua"}),  # a live cache's uid, another namespace
        clean_job("team-a", {"uid": "gone"}),  # a cache that no longer exists
        clean_job("llm", {"uid": "me"}),  # the cache's own: not another's
    ]
    assert of_other_caches([real, *forged], caches, "me") == [real]


def test_every_sample_cache_is_inside_the_charts_default_prefixes() -> None:
    samples = sorted((SAMPLES_DIR.parent / "cache").glob("*.yaml"))
    caches = [d for p in samples for d in yaml.safe_load_all(p.read_text()) if d and d["kind"] == "MiniMaxM3ModelCache"]
    assert caches
    for body in caches:
        assert path_not_allowed(body["spec"]["path"], DEFAULT_PATH_PREFIXES) is None, body["spec"]["path"]


def test_an_uninstall_lets_go_of_only_its_own_label_and_finalizer_and_twice_changes_nothing() -> None:
    other_label = node_label_key("llm", "m3-other")
    nodes = [
        NodeView("h200-0", {**H200, LABEL: "ready", other_label: "ready"}),
        NodeView("h200-1", {**H200, LABEL: ""}),  # a copy being rewritten: its label is still the cache's
        NodeView("h200-2", {**H200, other_label: "ready"}),
    ]
    letting = let_go("llm", "m3", ["example.com/keep", FINALIZER], nodes)
    assert letting.unlabel == ("h200-0", "h200-1")
    assert letting.finalizers == ["example.com/keep"]  # someone else's finalizer stays
    assert let_go("llm", "m3", [FINALIZER], nodes).finalizers == []
    after = [NodeView(n.name, {k: v for k, v in n.labels.items() if k != LABEL}) for n in nodes]
    assert let_go("llm", "m3", ["example.com/keep"], after) == Letting((), None)  # nothing left to write

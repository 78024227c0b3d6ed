"""The deployment reconcile's pure decision (m3fleet.controller.decide): from what a reconcile observed to the work
it does. No cluster: the observations are built here as observe would read them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from m3fleet.controller.decide import (
    CONFLICT_RETRY_SECONDS,
    SERVED_TTL_SECONDS,
    Observed,
    Prune,
    Understood,
    decide,
    failure_to_tell,
    key_of,
    understand,
    want,
)
from m3fleet.controller.status import PodFailure, Workload
from m3fleet.permissions import SECRETS_REFUSED, SECRETS_RETRY_SECONDS
from m3fleet.render import render, required_secrets, set_owner

SAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "samples"
UID = "0b9d7a52-0000-4000-8000-000000000001"
ALL_KINDS = frozenset(
    {"ConfigMap", "ComputeDomain", "Deployment", "LeaderWorkerSet", "NetworkPolicy", "PodDisruptionBudget", "Service"}
)
SINGLE_NODE, MULTI_NODE = "vllm-h200-tp8.yaml", "trtllm-gb200-2x4-tep.yaml"


def body(sample: str = SINGLE_NODE, **spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES / sample).read_text())
    doc["metadata"].update(uid=UID, generation=3, resourceVersion="41")
    doc["spec"].update(spec)
    return doc


def owner(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": doc["apiVersion"],
        "kind": doc["kind"],
        "metadata": {"name": doc["metadata"]["name"], "uid": UID},
    }


def ours(obj: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """A child as the API lists it, controlled by the resource `doc`."""
    child = set_owner(obj, owner(doc))
    child["metadata"]["uid"] = f"uid-of-{obj['kind']}-{obj['metadata']['name']}"
    return child


def observed(
    doc: dict[str, Any],
    *,
    cache: dict[str, Any] | None = None,
    served: frozenset[str] = ALL_KINDS,
    live: list[dict[str, Any]] = (),  # type: ignore[assignment]
    named: list[dict[str, Any]] = (),  # type: ignore[assignment]
    secrets: dict[str, dict[str, Any] | None] | None = None,
    forbidden: bool = False,
) -> Observed:
    understood = understand(doc)
    wanted = want(understood, cache, doc.get("status") or {})
    return Observed(
        doc,
        understood,
        cache,
        wanted,
        served,
        {key_of(o): o for o in live},
        {key_of(o): o for o in named},
        {} if secrets is None else secrets,
        forbidden,
    )


def rendered(doc: dict[str, Any]) -> list[dict[str, Any]]:
    understood = understand(doc)
    assert understood.resource is not None and understood.plan is not None
    return render(understood.resource, understood.plan)


def test_understood_once_per_version_of_the_spec() -> None:
    doc = body()
    understood = understand(doc)
    assert understood.error is None and understood.plan is not None and understood.plan.engine == "vllm"
    written = {**doc, "status": {"observedGeneration": 3}, "metadata": {**doc["metadata"], "resourceVersion": "42"}}
    assert understood.of(written)  # a status write: the same spec
    assert not understood.of({**doc, "metadata": {**doc["metadata"], "generation": 4}})  # a spec change
    assert not understood.of({**doc, "metadata": {**doc["metadata"], "uid": "another"}})  # a namesake
    broken = understand(body(replicas=-1))
    assert broken.resource is None and broken.plan is None and "spec.replicas" in str(broken.error)


def test_a_new_resource_applies_every_child_in_render_order_owned_and_prunes_nothing() -> None:
    doc = body()
    work = decide(observed(doc))
    assert work.blocked is None and work.retry_after is None
    assert work.apply == [set_owner(o, owner(doc)) for o in rendered(doc)]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == UID for o in work.apply)
    assert work.prune == [] and work.generate == [] and work.prune_secrets == [] and work.replaced == {}
    assert work.workload is not None and work.workload["kind"] == "Deployment"
    assert work.status.plan is not None and work.status.plan["engine"] == "vllm"
    assert work.status.selector == "m3fleet.dev/name=m3-vllm-h200-tp8,m3fleet.dev/serving=true"
    assert work.status.secrets == [] and work.status.model_cache is None and work.status.autoscaling is False


def test_deciding_reads_nothing_and_changes_nothing_it_was_given() -> None:
    doc = body()
    live = [ours(o, doc) for o in rendered(doc)]
    seen = observed(doc, live=live)
    before = copy.deepcopy((seen.body, seen.live, seen.named, seen.secrets))
    assert decide(seen) == decide(seen)
    assert (seen.body, seen.live, seen.named, seen.secrets) == before


def test_an_invalid_spec_is_reported_with_the_running_workload_and_no_child_is_touched() -> None:
    good = body()
    running = ours(next(o for o in rendered(good) if o["kind"] == "Deployment"), good)  # from before it broke
    running["status"] = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
    work = decide(observed(body(replicas=-1), live=[running]))
    assert work.blocked is not None and work.blocked.reason == "InvalidSpec" and "spec.replicas" in work.blocked.message
    assert work.apply == [] and work.prune == [] and work.generate == []
    assert work.status.plan is None  # the last plan stays in status
    assert work.blocked_report is not None and (work.blocked_report.desired, work.blocked_report.ready) == (1, 1)


def test_a_model_cache_that_is_not_there_is_its_own_reason() -> None:
    doc = body(model={**body()["spec"]["model"], "cacheRef": {"name": "weights"}})
    work = decide(observed(doc, cache=None))
    assert work.blocked is not None and work.blocked.reason == "ModelCacheNotFound"
    assert "MiniMaxM3ModelCache weights does not exist in namespace llm" in work.blocked.message


def test_a_missing_api_blocks_and_looks_again_after_discovery_is_asked_again() -> None:
    doc = body(MULTI_NODE)
    work = decide(observed(doc, served=ALL_KINDS - {"LeaderWorkerSet"}))
    assert work.blocked is not None and work.blocked.reason == "LeaderWorkerSetNotInstalled"
    assert "spans 2 nodes" in work.blocked.message and work.retry_after == SERVED_TTL_SECONDS
    assert work.apply == [] and work.status.plan is not None  # the plan is reported: it is valid
    no_dra = decide(observed(doc, served=ALL_KINDS - {"ComputeDomain"}))
    assert no_dra.blocked is not None and no_dra.blocked.reason == "ComputeDomainNotInstalled"


def test_the_ssh_key_secret_is_generated_once_and_never_over_someone_elses() -> None:
    doc = body(MULTI_NODE)
    understood = understand(doc)
    assert understood.resource is not None and understood.plan is not None
    (secret_name,) = required_secrets(understood.resource, understood.plan)
    fresh = decide(observed(doc, secrets={secret_name: None}))
    assert fresh.blocked is None and fresh.generate == [secret_name] and fresh.status.secrets == [secret_name]
    ours_already = {"metadata": {"name": secret_name, "ownerReferences": owner_refs(UID)}}
    assert decide(observed(doc, secrets={secret_name: ours_already})).generate == []
    foreign = {"metadata": {"name": secret_name, "namespace": "llm"}}
    held = decide(observed(doc, secrets={secret_name: foreign}))
    assert held.blocked is not None and held.blocked.reason == "NameConflict" and secret_name in held.blocked.message
    refused = decide(observed(doc, forbidden=True))
    assert refused.blocked is not None and refused.blocked.reason == SECRETS_REFUSED
    assert refused.retry_after == SECRETS_RETRY_SECONDS and "namespace llm" in refused.blocked.message


def owner_refs(uid: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "m3fleet.dev/v1alpha1",
            "kind": "MiniMaxM3Deployment",
            "name": "x",
            "uid": uid,
            "controller": True,
        }
    ]


def test_a_name_held_by_an_object_we_do_not_control_blocks_everything() -> None:
    doc = body()
    service = next(o for o in rendered(doc) if o["kind"] == "Service")
    by_hand = copy.deepcopy(service)  # found by name: it lacks our labels
    work = decide(observed(doc, named=[by_hand]))
    assert work.blocked is not None and work.blocked.reason == "NameConflict"
    assert "Service llm/m3-vllm-h200-tp8-api already exists" in work.blocked.message
    assert work.retry_after == CONFLICT_RETRY_SECONDS and work.apply == [] and work.prune == []


def test_only_our_children_no_longer_wanted_are_pruned_and_a_replaced_workload_is_told() -> None:
    single = body()
    old_deployment = ours(next(o for o in rendered(single) if o["kind"] == "Deployment"), single)
    old_deployment["metadata"]["name"] = "m3-trtllm-gb200"  # the same resource name, before the spec went multi-node
    doc = body(MULTI_NODE)
    look_alike = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m3-trtllm-gb200-extra", "uid": "u"}}
    work = decide(observed(doc, live=[old_deployment, look_alike]))
    assert work.blocked is None
    assert work.prune == [Prune("apps/v1", "Deployment", "m3-trtllm-gb200", old_deployment["metadata"]["uid"])]
    assert "the Deployment is replaced by a LeaderWorkerSet" in work.replaced["Deployment"]
    assert work.workload is not None and work.workload["kind"] == "LeaderWorkerSet"


def test_generated_secrets_no_longer_needed_are_pruned_by_the_name_status_recorded() -> None:
    doc = body()
    doc["status"] = {"generatedSecrets": ["m3-old-mpi-ssh"]}
    work = decide(observed(doc))
    assert work.prune_secrets == ["m3-old-mpi-ssh"] and work.status.secrets == []


def test_autoscaling_act_mode_renders_the_last_decision() -> None:
    scaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 4}
    doc = body(replicas=1, autoscaling=scaling)
    doc["status"] = {"autoscaling": {"desiredReplicas": 3}}
    work = decide(observed(doc))
    assert work.workload is not None and work.workload["spec"]["replicas"] == 3
    assert work.status.autoscaling is True


def test_a_pod_failure_is_told_when_it_is_news() -> None:
    doc = body()
    failing = Workload(1, failure=PodFailure("CrashLoopBackOff", "1 of 1 pods failing: pod p, container c: ..."))
    assert failure_to_tell(doc, failing) == failing.failure
    doc["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "CrashLoopBackOff"}]}
    assert failure_to_tell(doc, failing) is None  # said already
    assert failure_to_tell(doc, Workload(1)) is None


def test_an_unplannable_understanding_wants_nothing() -> None:
    wanted = want(Understood("u", 1), None, {})
    assert wanted.objects == [] and wanted.blocked is not None and wanted.blocked.reason == "InvalidSpec"

"""The admission decision (m3fleet.admission.review): what the validating webhook answers, decided in the core.

Refusals carry the planner's own message — the text `m3fleet plan` prints for the same file — and the
decision stays out of what is not its to decide (schema questions, metadata-only updates, deletion).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from m3fleet.admission import ALLOWED, review
from m3fleet.api.parse import parse_cache
from m3fleet.cli import main
from m3fleet.errors import SpecErrors
from tests.support.samples import SAMPLE_FILES, load_sample

BASE = load_sample(next(p for p in SAMPLE_FILES if p.stem == "vllm-h200-tp8"))


def changed(base: dict[str, Any] = BASE, **spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    doc["spec"].update(copy.deepcopy(spec))
    return doc


# Specs the CRD admits (schema and CEL) and only the planner or the renderer refuses: (changes, field, fragment).
REFUSED = {
    "kv-cache-does-not-fit": (
        {
            "parallelism": {"strategy": "tp", "tensorParallelSize": 8},
            "context": {"maxModelLen": 524288, "kvCacheDtype": "bf16", "minSequencesAtMaxLen": 2},
        },
        "spec.context.maxModelLen",
        "leave tensorParallelSize 0",
    ),
    "variant-not-served": (
        {"engine": {"name": "sglang"}, "model": {"variant": "mxfp8", "source": {"pvc": {"claimName": "w"}}}},
        "spec.model.variant",
        "is not served by sglang on h200",
    ),
    "gpus-beyond-the-plan": (
        {"nodePool": {"extraResources": {"nvidia.com/gpu": 9}}},
        "spec.nodePool.extraResources[nvidia.com/gpu]",
        "holds up to 8 nvidia.com/gpu",
    ),
    "too-few-gpus-for-the-weights": (
        {"parallelism": {"strategy": "tp", "tensorParallelSize": 2}},
        "spec.parallelism.tensorParallelSize",
        "GiB of weights",
    ),
    "trtllm-language-model-only": (
        {
            "engine": {"name": "trtllm"},
            "accelerator": "gb200",
            "parallelism": {"strategy": "tp"},
            "model": {"source": {"pvc": {"claimName": "w"}}, "languageModelOnly": True},
        },
        "spec.model.languageModelOnly",
        "config.json",
    ),
    "vllm-bf16-past-native-on-nvidia": (
        {"context": {"maxModelLen": 1048576, "kvCacheDtype": "bf16"}},
        "spec.context.maxModelLen",
        "rope_scaling",
    ),
    "pod-memory-below-shm": (
        {"nodePool": {"resources": {"memoryGiB": 8}}},
        "spec.nodePool.resources.memoryGiB",
        "/dev/shm",
    ),
    "owned-flag-in-extra-args": (
        {"engine": {"name": "vllm", "extraArgs": ["--max-model-len", "4096"]}},
        "spec.engine.extraArgs[0]",
        "derives from the plan",
    ),
}


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def test_every_sample_is_admitted_without_warnings(path: Path) -> None:
    verdict = review("CREATE", load_sample(path))
    assert verdict.allowed and verdict.message == "" and verdict.warnings == ()


@pytest.mark.parametrize(("changes", "field", "fragment"), REFUSED.values(), ids=REFUSED.keys())
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_planner_refusals_are_refused_with_the_field_and_a_fix(
    operation: str, changes: dict[str, Any], field: str, fragment: str
) -> None:
    verdict = review(operation, changed(**changes), BASE)
    assert not verdict.allowed
    assert verdict.message.startswith(f"{field}: ")
    assert fragment in verdict.message and "; fix: " in verdict.message


@pytest.mark.parametrize(("changes", "field", "fragment"), REFUSED.values(), ids=REFUSED.keys())
def test_the_message_is_what_m3fleet_plan_or_render_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], field: str, fragment: str
) -> None:
    document = changed(**changes)
    path = tmp_path / "refused.yaml"
    path.write_text(yaml.safe_dump(document))
    name = document["metadata"]["name"]
    for command in ("plan", "render"):  # plan refuses what render refuses: one verdict, wherever it is asked
        assert main([command, "-f", str(path)]) == 2
        printed = capsys.readouterr().err
        assert printed == f"error: {path}#0 (MiniMaxM3Deployment/{name}): {review('CREATE', document).message}\n"


def test_a_cache_ref_is_admitted_before_its_model_cache_exists() -> None:
    """The webhook cannot look the MiniMaxM3ModelCache up (it is pure), and GitOps may apply it second: the operator
    says ModelCacheNotFound in status until it exists. What else the spec asks is still judged in full."""
    cached = changed(model={**BASE["spec"]["model"], "cacheRef": {"name": "m3", "nodeAffinity": "Required"}})
    assert review("CREATE", cached).allowed
    owned = changed(cached, engine={"name": "vllm", "extraArgs": ["--block-size", "16"]})
    verdict = review("CREATE", owned)
    assert not verdict.allowed and verdict.message.startswith("spec.engine.extraArgs[0]: ")


def test_an_update_that_keeps_a_refused_spec_is_admitted() -> None:
    """Relabelling, annotating or removing a finalizer of a resource admitted before (while the webhook was
    down) is never refused: the verdict is on the spec, and a finalizer must always be removable."""
    refused = changed(**REFUSED["kv-cache-does-not-fit"][0])
    relabelled = copy.deepcopy(refused)
    relabelled["metadata"]["labels"] = {"team": "search"}
    relabelled["metadata"]["finalizers"] = []
    assert review("UPDATE", relabelled, refused).allowed
    # ...but any change to such a spec is judged in full
    still_refused = changed(refused, replicas=2)
    assert not review("UPDATE", still_refused, refused).allowed
    assert review("UPDATE", BASE, refused).allowed  # the fix is admitted


def test_an_update_of_a_running_resource_to_a_refused_spec_is_refused() -> None:
    verdict = review("UPDATE", changed(**REFUSED["kv-cache-does-not-fit"][0]), BASE)
    assert not verdict.allowed and "spec.context.maxModelLen" in verdict.message


def test_deletion_is_never_refused() -> None:
    refused = changed(**REFUSED["kv-cache-does-not-fit"][0])
    assert review("DELETE", None, refused).allowed
    assert review("DELETE", refused, refused).allowed
    deleting = copy.deepcopy(refused)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert review("UPDATE", deleting, changed(refused, replicas=3)).allowed


def test_what_only_the_schema_decides_is_left_to_the_schema() -> None:
    """A document the models cannot read never reaches the webhook unless the CRD admitted it: the webhook does
    not overrule the CRD with a second opinion on shape; it admits it with a warning naming the field."""
    unreadable = changed(parallelism={"strategy": "tp", "tensorParallelSize": 12})
    verdict = review("CREATE", unreadable)
    assert verdict.allowed and verdict.message == ""
    assert len(verdict.warnings) == 1 and "spec.parallelism.tensorParallelSize" in verdict.warnings[0]
    # A CEL rule of the CRD (TensorRT-LLM serves its guide's NVIDIA pools only) is the CRD's to enforce, before the
    # webhook.
    cel_refused = review("CREATE", changed(engine={"name": "trtllm"}, accelerator="mi355x"))
    assert cel_refused.allowed and "trtllm runs only on the NVIDIA pools" in cel_refused.warnings[0]
    assert review("CREATE", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}).allowed


def test_same_document_same_verdict() -> None:
    """Every operator replica answers alike: the verdict depends on the document alone."""
    document = changed(**REFUSED["kv-cache-does-not-fit"][0])
    assert len({review("CREATE", copy.deepcopy(document)) for _ in range(3)}) == 1


def _at_one_million(sequences: int) -> dict[str, Any]:
    """The MXFP8 checkpoint at 1M tokens: one H200 node holds two such sequences, three need a second node."""
    return changed(
        model={"variant": "mxfp8", "source": {"pvc": {"claimName": "m3-weights-mxfp8"}}},
        parallelism={"strategy": "tp"},
        context={"maxModelLen": 1_048_576, "minSequencesAtMaxLen": sequences},
    )


@pytest.mark.parametrize(
    ("old", "new", "running", "replacement"),
    [(1, 3, "Deployment", "LeaderWorkerSet"), (3, 1, "LeaderWorkerSet", "Deployment")],
    ids=["onto-two-nodes", "back-onto-one"],
)
def test_an_update_that_moves_replicas_to_the_other_workload_kind_is_admitted_with_a_warning(
    old: int, new: int, running: str, replacement: str
) -> None:
    verdict = review("UPDATE", _at_one_million(new), _at_one_million(old))
    assert verdict.allowed and verdict.message == ""
    assert len(verdict.warnings) == 1, verdict.warnings
    warning = verdict.warnings[0]
    assert warning.startswith(f"spec: each replica now spans {2 if new == 3 else 1} node(s): ")
    assert f"the {running} is replaced by a {replacement}" in warning
    assert "serves nothing until the new replicas are ready" in warning


def test_no_warning_when_the_kind_stays_or_nothing_was_running() -> None:
    assert review("UPDATE", _at_one_million(2), _at_one_million(1)).warnings == ()  # still one node
    assert review("UPDATE", changed(replicas=3), BASE).warnings == ()
    assert review("CREATE", _at_one_million(3)).warnings == ()  # a new fleet replaces nothing
    refused = changed(**REFUSED["kv-cache-does-not-fit"][0])
    assert review("UPDATE", _at_one_million(3), refused).warnings == ()  # the old spec never ran


# --- MiniMaxM3ModelCache: the same contract, the same webhook ----------------------------------------------

CACHE: dict[str, Any] = {
    "apiVersion": "m3fleet.dev/v1alpha1",
    "kind": "MiniMaxM3ModelCache",
    "metadata": {"name": "m3", "namespace": "llm"},
    "spec": {
        "source": {"pvc": {"claimName": "weights"}},
        "nodes": {"accelerator": "h200"},
        "path": "/mnt/nvme/m3fleet/m3",
    },
}


def cache_with(**spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(CACHE)
    doc["spec"].update(copy.deepcopy(spec))
    return doc


def test_a_valid_cache_is_admitted() -> None:
    assert review("CREATE", CACHE) == ALLOWED


def test_a_cache_whose_node_label_cannot_be_written_is_refused_naming_the_name() -> None:
    doc = copy.deepcopy(CACHE)
    doc["metadata"]["namespace"] = "n" * 40  # CEL sees no namespace: only the webhook can refuse this
    doc["metadata"]["name"] = "c" * 30
    verdict = review("CREATE", doc)
    assert not verdict.allowed and verdict.message.startswith("metadata.name: ") and "63" in verdict.message


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"source": {"pvc": {"claimName": "other/k"}}}, "spec.source.pvc.claimName"),
        ({"source": {"pvc": {"claimName": "w", "subPath": "../x"}}}, "spec.source.pvc.subPath"),
        ({"stagerImage": "my image"}, "spec.stagerImage"),
        ({"nodes": {"accelerator": "h200", "node_selector": {}}}, "spec.nodes.node_selector"),
        ({"pathh": "/mnt/nvme/x"}, "spec.pathh"),
    ],
)
def test_a_cache_is_judged_by_its_crd_as_a_deployment_is(spec: dict[str, Any], field: str, tmp_path: Path) -> None:
    """The CLI reads a cache through the CRD's own contract (unknown fields, CEL, child values): the line it
    prints names the field, and the webhook (after the apiserver's own schema check) is not asked to guess."""
    doc = cache_with(**spec)
    file = tmp_path / "cache.yaml"
    file.write_text(yaml.safe_dump(doc))
    assert main(["plan", "-f", str(file)]) == 2
    with pytest.raises(SpecErrors) as info:
        parse_cache(doc)
    assert [e.field for e in info.value.errors] == [field], info.value
    verdict = review("CREATE", doc)  # what the CRD refuses never reaches the webhook; if it did, it would warn
    assert verdict.allowed and verdict.warnings

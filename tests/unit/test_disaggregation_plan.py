"""spec.disaggregation at the planner: each role's layout for its own job, the ratio from the time model, pinned
counts, and one clear message for what cannot work (the CLI's and the webhook's answer)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from m3fleet.admission import review
from m3fleet.api import parse_resource
from m3fleet.catalog.throughput import PREFILL_TOKENS_PER_GPU_SECOND
from m3fleet.disaggregation import PREFILL_TARGET_UTILIZATION
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan
from tests.support.samples import SAMPLES_DIR, load_sample

SAMPLE = SAMPLES_DIR / "disaggregated" / "trtllm-gb200-disagg-32k.yaml"


def sample(**disaggregation: Any) -> dict[str, Any]:
    doc = load_sample(SAMPLE)
    doc["spec"]["disaggregation"].update(disaggregation)
    return doc


def planned(doc: dict[str, Any]) -> Any:
    return plan(parse_resource(copy.deepcopy(doc)).spec)


def refusal(doc: dict[str, Any]) -> str:
    with pytest.raises((SpecError, SpecErrors)) as caught:
        planned(doc)
    return str(caught.value)


def test_sample_roles_follow_the_trtllm_guide_layouts() -> None:
    p = planned(load_sample(SAMPLE))
    d = p.disaggregation
    assert d is not None
    assert (d.prefill.strategy, d.prefill.tensor_parallel_size, d.prefill.expert_parallel_size) == ("tp-ep", 8, 8)
    assert (d.decode.strategy, d.decode.data_parallel_size, d.decode.expert_parallel_size) == ("dp-ep", 8, 8)
    assert d.prefill.nodes_per_worker == d.decode.nodes_per_worker == 2  # 8 GB200 GPUs, 4 per node
    # The top-level fields are one decode worker's (what spec.replicas counts).
    assert (p.strategy, p.data_parallel_size, p.gpus_per_replica) == ("dp-ep", 8, 8)
    assert p.image == d.image == "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.6.1"
    assert not p.validated


def test_each_role_holds_its_own_job() -> None:
    """Prefill holds one prompt per rank (TEP: one pool); decode holds whole sequences in every DP rank."""
    d = planned(load_sample(SAMPLE)).disaggregation
    assert d.prefill.kv_cache_tokens_per_worker == d.prefill.kv_cache_tokens_per_rank >= 131072
    assert d.decode.kv_cache_tokens_per_worker == 8 * d.decode.kv_cache_tokens_per_rank
    assert "prompts in flight" in d.prefill.holds and "whole sequences" in d.decode.holds


def test_ratio_is_decode_completions_over_prefill_capacity() -> None:
    d = planned(load_sample(SAMPLE)).disaggregation
    prefill_rate = PREFILL_TOKENS_PER_GPU_SECOND["gb200"] * 8 * 0.85 / 32768  # two nodes: multi-node efficiency
    assert d.prefill.requests_per_second == pytest.approx(prefill_rate, rel=1e-3)
    expected = d.decode.requests_per_second / (d.prefill.requests_per_second * PREFILL_TARGET_UTILIZATION)
    assert d.derived_ratio == pytest.approx(expected, rel=1e-3)
    assert d.prefill.replicas == math.ceil(1 * expected)  # spec.replicas 1 decode worker
    assert d.ratio == f"{d.prefill.replicas}:1"
    assert any(line.startswith("derived ratio") for line in d.reasoning)


def test_longer_prompts_need_more_prefill_per_decode_worker() -> None:
    ratios = [planned(sample(inputTokens=n)).disaggregation.derived_ratio for n in (2048, 8192, 32768)]
    assert ratios == sorted(ratios) and ratios[0] < ratios[-1]


def test_decode_replicas_come_from_spec_replicas_and_prefill_follows() -> None:
    doc = sample()
    doc["spec"]["replicas"] = 4
    d = planned(doc).disaggregation
    assert d.decode.replicas == 4
    assert d.prefill.replicas == math.ceil(4 * d.derived_ratio)


def test_pinned_ratio_and_counts_are_kept() -> None:
    d = planned(sample(ratio="4:1")).disaggregation
    assert (d.ratio, d.prefill.replicas, d.decode.replicas) == ("4:1", 4, 1)
    pinned = sample(prefill={"replicas": 5, "parallelism": {"strategy": "tp-ep"}})
    assert planned(pinned).disaggregation.prefill.replicas == 5


def test_pinned_ratio_that_starves_prefill_is_refused_with_the_minimum() -> None:
    message = refusal(sample(ratio="1:4"))
    assert message.startswith("spec.disaggregation.ratio: ")
    assert "queue without bound" in message and "fix: use at least " in message


def test_ratio_with_the_prefill_count_pinned_is_refused_by_the_schema() -> None:
    doc = sample(ratio="1:1")
    doc["spec"]["disaggregation"]["prefill"]["replicas"] = 2
    assert refusal(doc).startswith("spec.disaggregation.ratio: cannot be pinned together with prefill.replicas")


def test_decode_workers_are_counted_by_spec_replicas_only() -> None:
    # One field for the decode count: the scale subresource's, which status.replicas reports back (kubectl scale).
    doc = sample()
    doc["spec"]["disaggregation"]["decode"]["replicas"] = 2
    assert refusal(doc) == (
        "spec.disaggregation.decode.replicas: is not a field of this object; fix: remove it; the fields here are: "
        "parallelism"
    )


def test_role_that_does_not_fit_names_the_roles_field() -> None:
    doc = sample(prefill={"parallelism": {"strategy": "tp-ep", "tensorParallelSize": 2}})
    message = refusal(doc)
    assert message.startswith("spec.disaggregation.prefill.parallelism.tensorParallelSize: prefill workers: ")


def test_dep_decode_falls_back_to_tep_when_a_sequence_does_not_fit_one_rank() -> None:
    doc = sample(decode={})
    doc["spec"]["accelerator"] = "h200"  # 140 GB: no DEP world holds a 512k-token sequence in one rank
    doc["spec"]["context"]["maxModelLen"] = 524288
    p = planned(doc)
    assert p.disaggregation.decode.strategy == "tp-ep"
    assert any("does not fit one DEP rank" in note for note in p.notes)


def test_sglang_roles_need_equal_tp() -> None:
    doc = sample(prefill={"parallelism": {"strategy": "tp-ep", "tensorParallelSize": 8}})
    doc["spec"]["engine"]["name"] = "sglang"
    doc["spec"]["model"]["variant"] = "mxfp8"
    doc["spec"]["disaggregation"]["decode"] = {"parallelism": {"strategy": "tp-ep", "tensorParallelSize": 4}}
    assert "both roles need the same TP size" in refusal(doc)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"accelerator": "mi355x", "engine": {"name": "vllm"}}, "spec.disaggregation"),
        ({"model": {"variant": "mxfp8", "source": {"pvc": {"claimName": "w"}}}}, "spec.model.variant"),
    ],
)
def test_engine_or_accelerator_dynamo_cannot_serve_is_refused(change: dict[str, Any], field: str) -> None:
    doc = sample()
    doc["spec"].update(change)
    assert refusal(doc).startswith(f"{field}: ")


def test_the_autoscaler_is_accepted_and_the_plan_is_where_it_starts() -> None:
    doc = sample()
    doc["spec"]["autoscaling"] = {"enabled": True, "prometheus": {"url": "http://prometheus.monitoring:9090"}}
    assert planned(doc).disaggregation == planned(sample()).disaggregation


def test_expected_lengths_must_fit_the_context() -> None:
    message = refusal(sample(inputTokens=131072))
    assert message.startswith(
        "spec.disaggregation.inputTokens: together with outputTokens is longer than context.maxModelLen"
    )


def test_admission_refuses_bad_disaggregation_with_the_planners_message() -> None:
    verdict = review("CREATE", sample(ratio="1:4"))
    assert not verdict.allowed and verdict.message == refusal(sample(ratio="1:4"))


def test_without_the_field_nothing_changes() -> None:
    doc = load_sample(SAMPLES_DIR / "trtllm-gb200-2x4-tep.yaml")
    p = planned(doc)
    assert p.disaggregation is None
    assert "disaggregation" not in p.model_dump(by_alias=True, exclude_none=True)


def test_sample_lives_apart_from_the_aggregated_samples() -> None:
    """The aggregated tiers iterate manifests/samples/*.yaml; the disaggregated sample has its own tests."""
    assert SAMPLE.parent != SAMPLES_DIR and Path(SAMPLE).is_file()

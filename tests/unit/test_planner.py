"""The planner: recipe shapes, hand-checked capacities, and properties over the whole grid."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from m3fleet.api import parse_resource, parse_spec
from m3fleet.api.models import (
    Accelerator,
    EngineName,
    KvCacheDtype,
    MiniMaxM3DeploymentSpec,
    Strategy,
    Variant,
)
from m3fleet.catalog import ENGINES, PARALLEL_CANDIDATES
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan
from m3fleet.sizing import Layout, evaluate, kv_bytes_per_token_per_gpu
from tests.support.samples import SAMPLES_DIR, load_sample

# file -> (engine, accelerator, variant, strategy, TP, DP, EP, nodes per replica).
RECIPE_SHAPES = {
    "vllm-h200-tp8": ("vllm", "h200", "bf16", "tp", 8, 1, 1, 1),
    "vllm-h200-gateway-tiers": ("vllm", "h200", "bf16", "tp", 8, 1, 1, 1),  # its main tier; the short one too
    "vllm-h200-tp8-ep": ("vllm", "h200", "bf16", "tp-ep", 8, 1, 8, 1),
    "vllm-h200-dp8-ep": ("vllm", "h200", "bf16", "dp-ep", 1, 8, 8, 1),
    "vllm-mi355x-bf16-tp8": ("vllm", "mi355x", "bf16", "tp", 8, 1, 1, 1),
    "vllm-mi355x-mxfp8": ("vllm", "mi355x", "mxfp8", "tp", 4, 1, 1, 1),
    "vllm-mi355x-mxfp4": ("vllm", "mi355x", "mxfp4", "tp", 4, 1, 1, 1),
    "vllm-mi355x-1m-fp8kv": ("vllm", "mi355x", "bf16", "tp", 8, 1, 1, 1),
    "sglang-h200-bf16-tp8": ("sglang", "h200", "bf16", "tp", 8, 1, 1, 1),
    "sglang-mi355x-mxfp8-tp8-ep8": ("sglang", "mi355x", "mxfp8", "tp-ep", 8, 1, 8, 1),
    "sglang-gb200-mxfp8-2x4-tp8-ep8": ("sglang", "gb200", "mxfp8", "tp-ep", 8, 1, 8, 2),
    "trtllm-gb200-2x4-tep": ("trtllm", "gb200", "bf16", "tp-ep", 8, 1, 8, 2),
    "vllm-gb200-nvfp4-tp4": ("vllm", "gb200", "nvfp4", "tp", 4, 1, 1, 1),
    "vllm-gb200-nvfp4-eagle3-tp4": ("vllm", "gb200", "nvfp4", "tp", 4, 1, 1, 1),
    "vllm-h200-mtp-tp8": ("vllm", "h200", "bf16", "tp", 8, 1, 1, 1),
    "sglang-gb200-mxfp8-eagle3-tp4": ("sglang", "gb200", "mxfp8", "tp", 4, 1, 1, 1),
    "sglang-b200-mxfp8-tp8-ep8": ("sglang", "b200", "mxfp8", "tp-ep", 8, 1, 8, 1),
    "sglang-gb300-mxfp8-tp4": ("sglang", "gb300", "mxfp8", "tp", 4, 1, 1, 1),
    "sglang-mi300x-mxfp8-tp8": ("sglang", "mi300x", "mxfp8", "tp", 8, 1, 1, 1),
    "vllm-h100-mxfp8-tp8": ("vllm", "h100", "mxfp8", "tp", 8, 1, 1, 1),
}
# Samples whose shape no published recipe runs exactly: NV-BLOG's SGLang TP8+EP8 command is CUDA-only on one
# 8-GPU Blackwell node, so neither its MI355X nor its 2 x 4 GB200 form is `validated`.
# No published recipe serves nvidia/MiniMax-M3-NVFP4 on the pinned engines either, and none runs M3's MTP or
# EAGLE3 on SGLang (catalog.speculative.RECIPES).
NOT_PUBLISHED = {
    "sglang-mi355x-mxfp8-tp8-ep8",
    "sglang-gb200-mxfp8-2x4-tp8-ep8",
    "vllm-gb200-nvfp4-tp4",
    "vllm-gb200-nvfp4-eagle3-tp4",
    "vllm-h200-mtp-tp8",
    "sglang-gb200-mxfp8-eagle3-tp4",
    "vllm-h100-mxfp8-tp8",  # the vLLM recipe's TP8 names H200 and the 141 GB H20, no recipe H100
}


def test_every_sample_has_a_recipe_shape() -> None:
    assert {p.stem for p in SAMPLES_DIR.glob("*.yaml")} == set(RECIPE_SHAPES)


@pytest.mark.parametrize("name", sorted(RECIPE_SHAPES))
def test_sample_plans_to_its_recipe_shape(name: str) -> None:
    p = plan(parse_resource(load_sample(SAMPLES_DIR / f"{name}.yaml")).spec)
    got = (
        p.engine,
        p.accelerator,
        p.variant,
        p.strategy,
        p.tensor_parallel_size,
        p.data_parallel_size,
        p.expert_parallel_size,
        p.nodes_per_replica,
    )
    assert got == RECIPE_SHAPES[name]
    assert p.validated is (name not in NOT_PUBLISHED)
    assert p.max_sequences_at_max_len >= 1


def test_sglang_gb200_plan_names_every_departure_from_the_blog() -> None:
    p = plan(parse_resource(load_sample(SAMPLES_DIR / "sglang-gb200-mxfp8-2x4-tp8-ep8.yaml")).spec)
    notes = "\n".join(p.notes)
    for departure in ("--attention-backend flashinfer", "--moe-runner-backend deep_gemm", "quantizes the BF16",
                      "--chunked-prefill-size 16384", "LeaderWorkerSet group"):  # fmt: skip
        assert departure in notes
    assert p.gpu_memory_utilization == 0.8  # the blog's --mem-fraction-static


# Worked out by hand from the model config (HF-CFG) and vLLM's KV layout (VLLM-SPA, VLLM-IDX), not from the
# planner. Per GPU with TP>=4 one token costs 60 layers x 2 (K,V) x 1 head x 128 x 2 B = 30,720 B plus the
# unsharded index 57 x 128 x 2 B = 14,592 B,
# i.e. 45,312 B in BF16 and 15,360 + 14,592 = 29,952 B with fp8 K/V. DP ranks keep all 4 heads: 137,472 B.
# Weights: BF16 854.08 GB; replicated (non-expert) 26.12 GB of which 1.2 GB vision encoder (replicated per
# GPU when loaded). 1 GiB = 1.073741824 GB. vLLM budget = mem x 0.92 (its default) - weights - 4 GiB - the
# multimodal encoder cache when the encoder is loaded (min(192,000, maxModelLen) tokens x 6144 x 2 B);
# SGLang = mem x 0.75 - weights; TensorRT-LLM = (mem - weights - 4 GiB) x 0.7. Capacities are whole 128-token blocks.
HAND_CHECKED = [
    # H200 TP8 vision on: (854.08-1.2)/8+1.2 = 107.81 GB = 100.406 GiB; encoder cache 131072 x 12288 B = 1.5 GiB;
    # 128.8-100.406-4-1.5 = 22.894 GiB / 45,312 -> 542.5k
    ("vllm", "h200", "bf16", "tp", 8, False, "bf16", 131072, 542_464),
    # text only: 852.88/8 = 106.61 GB = 99.288 GiB; 25.512 GiB / 45,312 -> 604.4k
    ("vllm", "h200", "bf16", "tp", 8, True, "bf16", 131072, 604_416),
    # same budget with fp8 K/V: 25.512 GiB / 29,952 -> 914.6k
    ("vllm", "h200", "bf16", "tp", 8, True, "fp8", 131072, 914_560),
    # MI355X TP8 text only: 264.96-99.288-4 = 161.672 GiB / 45,312 -> 3,831.0k
    ("vllm", "mi355x", "bf16", "tp", 8, True, "bf16", 131072, 3_831_040),
    # DP8+EP on H200: 24.92 + 827.96/8 + 1.2 = 129.615 GB = 120.713 GiB; encoder cache 8192 x 12288 B = 0.094 GiB;
    # 128.8-120.713-4-0.094 = 3.993 GiB / 137,472 -> 243 blocks x 8 ranks
    ("vllm", "h200", "bf16", "dp-ep", 8, False, "bf16", 8192, 248_832),
    # SGLang H200 TP8: 105 - 100.405 = 4.595 GiB / 45,312 -> 108.9k
    ("sglang", "h200", "bf16", "tp", 8, False, "bf16", 65536, 108_900),
    # TensorRT-LLM GB200 TEP8: (184-100.405-4) x 0.7 = 55.717 GiB / 45,312 -> 1,320.3k
    ("trtllm", "gb200", "bf16", "tp-ep", 8, False, "bf16", 131072, 1_320_300),
    # NVFP4 on one GB200 tray: routed 413.977B x 4.5 bits / 8 = 232.862 GB + 26.126 GB BF16 = 258.988 GB;
    # (258.988-1.2)/4+1.2 = 65.647 GB = 61.138 GiB; 169.28-61.138-4-1.5 = 102.642 GiB / 45,312 -> 2,432.3k
    ("vllm", "gb200", "nvfp4", "tp", 4, False, "bf16", 131072, 2_432_300),
    # The same on H200 (Marlin, FP4 weights with BF16 activations): 128.8-61.138-4-1.5 = 62.162 GiB -> 1,473.0k
    ("vllm", "h200", "nvfp4", "tp", 4, False, "bf16", 131072, 1_473_000),
]


def spec_for(
    engine: str,
    accel: str,
    variant: str,
    strategy: str,
    world: int | None,
    lmo: bool,
    kv: str,
    max_len: int,
    min_seqs: int = 1,
) -> MiniMaxM3DeploymentSpec:
    parallelism: dict[str, Any] = {"strategy": strategy}
    if world:
        parallelism["dataParallelSize" if strategy == "dp-ep" else "tensorParallelSize"] = world
    return parse_spec(
        {
            "model": {"variant": variant, "source": {"pvc": {"claimName": "w"}}, "languageModelOnly": lmo},
            "engine": {"name": engine},
            "accelerator": accel,
            "parallelism": parallelism,
            "context": {"maxModelLen": max_len, "kvCacheDtype": kv, "minSequencesAtMaxLen": min_seqs},
        }
    )


@pytest.mark.parametrize("row", HAND_CHECKED, ids=[f"{r[0]}-{r[1]}-{r[3]}{r[4]}-{r[6]}" for r in HAND_CHECKED])
def test_hand_checked_capacity(row: tuple[Any, ...]) -> None:
    engine, accel, variant, strategy, world, lmo, kv, max_len, expected_tokens = row
    p = plan(spec_for(engine, accel, variant, strategy, world, lmo, kv, max_len))
    assert p.gpus_per_replica == world
    assert p.kv_cache_tokens_per_replica == pytest.approx(expected_tokens, rel=0.002)


def test_pipeline_stages_hold_their_own_layers() -> None:
    # TP8 x PP2 (vLLM/SGLang split 60 layers 30/30): stage 1 holds layers 30-59, all sparse. Per GPU and token:
    # 30 x 2 x 1 head x 128 x 2 B = 15,360 B of K/V plus 30 x 128 x 2 B = 7,680 B of index = 23,040 B, half of
    # TP16's 45,312 B (where every rank keeps every layer and the 4 KV heads are duplicated 4 times).
    assert kv_bytes_per_token_per_gpu(8, KvCacheDtype.BF16, pp=2) == 23_040
    assert kv_bytes_per_token_per_gpu(16, KvCacheDtype.BF16) == 45_312
    # Weights: stage 1 holds 30 of the 57 MoE layers' experts: 827.96 x 30/57 / 8 + 24.92 / 16 + 1.2 GB.
    from m3fleet.catalog import ACCELERATORS, VARIANTS

    variant = VARIANTS[Variant.BF16]
    fit = evaluate(
        Layout(Strategy.TP, 8, 1, KvCacheDtype.BF16, pp=2), variant, ENGINES[EngineName.VLLM],
        ACCELERATORS[Accelerator.H200], True, 8192,
    )  # fmt: skip
    expected_gb = 827.96 * 30 / 57 / 8 + 24.92 / 16 + 1.2
    assert fit.weights_gib_per_gpu == pytest.approx(expected_gb / 1.073741824, rel=1e-3)


def test_two_h200_nodes_run_tp8_x_pp2_by_default() -> None:
    for engine in ("vllm", "sglang"):
        p = plan(spec_for(engine, "h200", "bf16", "tp-ep", None, False, "bf16", 524_288, min_seqs=2))
        assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.nodes_per_replica) == (8, 2, 2)
        assert p.expert_parallel_size == 8 and p.gpus_per_replica == 16
        assert any("pipeline parallel 2 across the 2 nodes" in n for n in p.notes)
        assert any("over TCP" in n for n in p.notes)  # no RDMA resource in nodePool.extraResources
    # An explicit tensorParallelSize 16 is honoured, with a note on the all-reduce crossing nodes.
    p = plan(spec_for("vllm", "h200", "bf16", "tp", 16, False, "bf16", 524_288, min_seqs=2))
    assert (p.tensor_parallel_size, p.pipeline_parallel_size) == (16, 1)
    assert any("crosses the network" in n for n in p.notes)
    # TensorRT-LLM's M3 guide documents no pipeline parallelism: TP spans the nodes, and the plan says so.
    p = plan(spec_for("trtllm", "h200", "bf16", "tp", None, False, "bf16", 400_000, min_seqs=2))
    assert p.pipeline_parallel_size == 1 and p.nodes_per_replica == 2
    assert any("documents no pipeline parallelism" in n for n in p.notes)


def test_rdma_resource_silences_the_tcp_note() -> None:
    data = spec_for("sglang", "h200", "bf16", "tp", None, False, "bf16", 524_288, min_seqs=2).model_dump(by_alias=True)
    data["nodePool"]["extraResources"] = {"rdma/ib": 1}
    assert not any("over TCP" in n for n in plan(parse_spec(data)).notes)


def test_kv_bytes_per_token_match_the_facts_sheet() -> None:
    cases = {("tp", 8, "bf16"): 45_312, ("tp", 8, "fp8"): 29_952, ("dp-ep", 8, "bf16"): 137_472}
    for (strategy, world, kv), expected in cases.items():
        p = plan(spec_for("vllm", "mi355x", "bf16", strategy, world, False, kv, 8192))
        assert p.kv_bytes_per_token_per_gpu == expected
    # No allowed layout runs TP2 on this model, so check the per-rank arithmetic directly: 2 heads per rank.
    assert kv_bytes_per_token_per_gpu(2, KvCacheDtype.BF16) == 76_032
    assert kv_bytes_per_token_per_gpu(1, KvCacheDtype.FP8) == 61_440 + 14_592


def test_one_million_tokens_do_not_fit_one_h200_node() -> None:
    p = plan(spec_for("sglang", "h200", "bf16", "tp", None, False, "bf16", 1_048_576))
    assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.nodes_per_replica, p.gpus_per_node) == (8, 2, 2, 8)
    assert p.rope_scaling_factor == 2.0 and any("YaRN" in n for n in p.notes)


def test_auto_kv_dtype_prefers_bf16_and_takes_fp8_only_to_save_gpus() -> None:
    assert plan(spec_for("vllm", "h200", "bf16", "tp", None, False, "auto", 131072)).kv_cache_dtype == "bf16"
    # 2 x 400k tokens: bf16 needs 2 nodes on H200 (604k on TP8 with text only), fp8 fits TP8 (914k).
    p = plan(spec_for("vllm", "h200", "bf16", "tp", None, True, "auto", 400_000, min_seqs=2))
    assert (p.kv_cache_dtype, p.tensor_parallel_size, p.nodes_per_replica) == ("fp8", 8, 1)
    assert any("chose fp8" in n for n in p.notes)


def test_mxfp4_never_gets_fp8_kv_automatically() -> None:
    p = plan(spec_for("vllm", "mi355x", "mxfp4", "tp", None, True, "auto", 1_048_576))
    assert p.kv_cache_dtype == "bf16"


def test_floor_is_kept_and_noted() -> None:
    p = plan(spec_for("vllm", "mi355x", "mxfp8", "tp", None, False, "auto", 8192))
    assert p.tensor_parallel_size == 4
    assert any("memory alone allows fewer" in n for n in p.notes)


# --- invalid specs: each gets its own message -----------------------------------------------

INVALID = [
    (
        ("vllm", "h200", "bf16", "tp", 8, False, "bf16", 524_288, 2),
        "spec.context.maxModelLen",
        "leave tensorParallelSize 0",
    ),
    (("vllm", "h200", "bf16", "tp", None, False, "bf16", 1_048_576), "spec.context.maxModelLen", "rope_scaling"),
    (("trtllm", "gb200", "bf16", "tp", None, True, "auto", 8192), "spec.model.languageModelOnly", "config.json"),
    (
        ("vllm", "h200", "bf16", "tp", 2, False, "bf16", 8192),
        "spec.parallelism.tensorParallelSize",
        "GiB of weights",
    ),
    (
        ("vllm", "h200", "bf16", "dp-ep", 8, False, "bf16", 131072),
        "spec.context.maxModelLen",
        "use strategy tp",
    ),
    (
        ("vllm", "mi355x", "bf16", "tp", 4, False, "bf16", 8192),
        "spec.parallelism.tensorParallelSize",
        "minimum of 8",
    ),
    (("sglang", "h200", "mxfp8", "tp", None, False, "auto", 8192), "spec.model.variant", "engine vllm"),
    (("trtllm", "gb200", "bf16", "tp", None, False, "fp8", 8192), "spec.context.kvCacheDtype", "bf16"),
    (("trtllm", "gb200", "bf16", "tp", None, False, "auto", 600_000), "spec.context.maxModelLen", "YaRN"),
    (
        ("trtllm", "gb200", "bf16", "tp", 4, False, "auto", 8192),
        "spec.parallelism.tensorParallelSize",
        "8 ranks",
    ),
]


def test_the_planner_refuses_what_admission_refuses_too() -> None:
    # The CRD's CEL rejects trtllm on mi355x at admission (and m3fleet.api.contract with it); the planner
    # refuses it again for a spec that skipped admission (read into the model directly).
    with pytest.raises(SpecErrors, match="NVIDIA"):
        spec_for("trtllm", "mi355x", "bf16", "tp", None, False, "auto", 8192)
    spec = MiniMaxM3DeploymentSpec.model_validate(
        {"model": {"source": {"pvc": {"claimName": "w"}}}, "engine": {"name": "trtllm"}, "accelerator": "mi355x"}
    )
    with pytest.raises(SpecError, match="does not run on") as info:
        plan(spec)
    assert info.value.field == "spec.accelerator" and info.value.fix


def test_nvfp4_fits_one_gb200_tray_where_bf16_needs_two() -> None:
    # BF16 at TP4 is (854.08-1.2)/4+1.2 = 214.42 GB = 199.7 GiB of weights per GPU, more than a GB200 holds.
    bf16 = plan(spec_for("vllm", "gb200", "bf16", "tp", None, False, "bf16", 131072))
    nvfp4 = plan(spec_for("vllm", "gb200", "nvfp4", "tp", 4, False, "bf16", 131072))
    assert (bf16.gpus_per_replica, bf16.nodes_per_replica) == (8, 2)
    assert (nvfp4.gpus_per_replica, nvfp4.nodes_per_replica) == (4, 1)
    with pytest.raises(SpecError):
        plan(spec_for("vllm", "gb200", "bf16", "tp", 4, False, "bf16", 131072))


@pytest.mark.parametrize(
    ("engine", "accel", "reason"),
    [
        ("vllm", "mi355x", "MI355X's FP4 tensor cores take MXFP4"),
        ("sglang", "gb200", "M3.1 checkpoint"),
        ("sglang", "h200", "M3.1 checkpoint"),
        ("trtllm", "h200", "guide serves BF16 only"),
    ],
)
def test_nvfp4_is_refused_with_the_reason_where_it_is_not_served(engine: str, accel: str, reason: str) -> None:
    spec = MiniMaxM3DeploymentSpec.model_validate(
        {
            "model": {"variant": "nvfp4", "source": {"pvc": {"claimName": "w"}}},
            "engine": {"name": engine},
            "accelerator": accel,
        }
    )
    with pytest.raises(SpecError) as info:
        plan(spec)
    assert info.value.field == "spec.model.variant"
    assert reason in info.value.problem
    assert "nvfp4" not in info.value.fix.split("use variant ")[1].split(",")[0]  # the fix names a served variant


@pytest.mark.parametrize(
    ("args", "field", "fragment"), INVALID, ids=[f"{i}-{f}" for i, (_, f, _) in enumerate(INVALID)]
)
def test_invalid_spec_message(args: tuple[Any, ...], field: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        plan(spec_for(*args))
    assert info.value.field == field
    assert fragment in str(info.value)
    assert info.value.fix  # every message carries a fix


def test_data_parallel_size_needs_dp_ep() -> None:
    spec = parse_spec({"model": {"source": {"pvc": {"claimName": "w"}}}, "parallelism": {"dataParallelSize": 4}})
    with pytest.raises(SpecError, match="dp-ep"):
        plan(spec)


# --- properties over the grid -----------------------------------------------------------------

COMBOS = [(e, a, v) for e, facts in ENGINES.items() for a, variants in facts.support.items() for v in variants]

specs = st.builds(
    lambda combo, strategy, kv, max_len, min_seqs, lmo: spec_for(
        combo[0].value,
        combo[1].value,
        combo[2].value,
        strategy,
        None,
        lmo,
        kv,
        max_len,
        min_seqs,
    ),
    combo=st.sampled_from(COMBOS),
    strategy=st.sampled_from(["tp", "tp-ep", "dp-ep"]),
    kv=st.sampled_from(["auto", "bf16", "fp8"]),
    max_len=st.integers(min_value=1024, max_value=1_048_576),
    min_seqs=st.integers(min_value=1, max_value=8),
    lmo=st.booleans(),
).filter(lambda s: not (s.engine.name == "trtllm" and s.context.kv_cache_dtype == "fp8"))


def gpus_or_none(spec: MiniMaxM3DeploymentSpec) -> int | None:
    try:
        return plan(spec).gpus_per_replica
    except SpecError:
        return None


def with_context(spec: MiniMaxM3DeploymentSpec, **changes: Any) -> MiniMaxM3DeploymentSpec:
    data = spec.model_dump(by_alias=True)
    data["context"].update(changes)
    return parse_spec(copy.deepcopy(data))


GRID = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


@GRID
@given(spec=specs, extra=st.integers(min_value=1, max_value=500_000))
def test_more_context_never_needs_fewer_gpus(spec: MiniMaxM3DeploymentSpec, extra: int) -> None:
    longer = with_context(spec, maxModelLen=min(spec.context.max_model_len + extra, 1_048_576))
    short, long = gpus_or_none(spec), gpus_or_none(longer)
    if short is None:
        assert long is None
    elif long is not None:
        assert long >= short


@GRID
@given(spec=specs)
def test_fp8_kv_never_needs_more_gpus_than_bf16(spec: MiniMaxM3DeploymentSpec) -> None:
    if spec.engine.name == "trtllm":
        return
    bf16, fp8 = (
        gpus_or_none(with_context(spec, kvCacheDtype="bf16")),
        gpus_or_none(with_context(spec, kvCacheDtype="fp8")),
    )
    if bf16 is not None:
        assert fp8 is not None and fp8 <= bf16


def refused_by_rule(spec: MiniMaxM3DeploymentSpec) -> bool:
    """Specs the planner refuses whatever the memory: past the native context where the engine's M3 model applies
    no YaRN (TensorRT-LLM; vLLM on NVIDIA), and languageModelOnly where the engine cannot leave the encoder out."""
    from m3fleet.catalog import ACCELERATORS, VARIANTS

    engine = ENGINES[EngineName(spec.engine.name)]
    vendor = ACCELERATORS[Accelerator(spec.accelerator)].vendor
    past_native = spec.context.max_model_len > VARIANTS[Variant(spec.model.variant)].native_max_model_len
    no_text_only = spec.model.language_model_only and engine.language_model_only == "unsupported"
    return (past_native and vendor not in engine.yarn_vendors) or no_text_only


def brute_force_min_gpus(spec: MiniMaxM3DeploymentSpec, floor: int) -> int | None:
    """Every (TP, DP, dtype) on the grid, independent of the planner's search order. A world larger than a node is
    TP = the node's GPUs x one pipeline stage per node where the engine and pool call for it."""
    from m3fleet.catalog import ACCELERATORS, VARIANTS
    from m3fleet.planner import pipeline_across_nodes

    strategy = Strategy.TP if spec.parallelism.strategy == "auto" else Strategy(spec.parallelism.strategy)
    engine = ENGINES[EngineName(spec.engine.name)]
    accel = ACCELERATORS[Accelerator(spec.accelerator)]
    variant = VARIANTS[Variant(spec.model.variant)]
    encoder = not spec.model.language_model_only or engine.language_model_only != "skips_encoder"
    asked = KvCacheDtype(spec.context.kv_cache_dtype)
    dtypes = [KvCacheDtype.BF16, KvCacheDtype.FP8] if asked == KvCacheDtype.AUTO else [asked]
    if asked == KvCacheDtype.AUTO and (not variant.kv_scales_calibrated or engine.name == EngineName.TRTLLM):
        dtypes = [KvCacheDtype.BF16]
    best = None
    for tp in PARALLEL_CANDIDATES:
        for dp in PARALLEL_CANDIDATES:
            if (strategy != Strategy.DP_EP and dp != 1) or (strategy == Strategy.DP_EP and tp != 1):
                continue
            if tp * dp not in PARALLEL_CANDIDATES or tp * dp < floor:
                continue
            world, stage_tp, pp = tp * dp, tp, 1
            if pipeline_across_nodes(engine, accel, strategy) and world > accel.gpus_per_node:
                stage_tp, pp = accel.gpus_per_node, world // accel.gpus_per_node
            for dtype in dtypes:
                layout = Layout(strategy, stage_tp, dp, dtype, pp)
                fit = evaluate(layout, variant, engine, accel, encoder, spec.context.max_model_len)
                if fit.sequences_at(spec.context.max_model_len) >= spec.context.min_sequences_at_max_len:
                    best = tp * dp if best is None else min(best, tp * dp)
    return best


@GRID
@given(spec=specs)
def test_chosen_layout_fits_and_nothing_smaller_does(spec: MiniMaxM3DeploymentSpec) -> None:
    from m3fleet.planner import _floor

    floor, _ = _floor(EngineName(spec.engine.name), Accelerator(spec.accelerator), Variant(spec.model.variant))
    expected = brute_force_min_gpus(spec, floor)
    try:
        p = plan(spec)
    except SpecError:
        assert expected is None or refused_by_rule(spec)
        return
    assert not refused_by_rule(spec)
    assert p.gpus_per_replica == expected
    assert p.max_sequences_at_max_len >= spec.context.min_sequences_at_max_len
    assert p.gpus_per_replica == p.tensor_parallel_size * p.data_parallel_size * p.pipeline_parallel_size
    assert p.gpus_per_replica == p.gpus_per_node * p.nodes_per_replica
    assert p.expert_parallel_size in (1, p.tensor_parallel_size * p.data_parallel_size)
    assert p.strategy != "auto"


def test_sample_files_parse() -> None:
    for path in Path(SAMPLES_DIR).glob("*.yaml"):
        parse_resource(load_sample(path))


@pytest.mark.parametrize(("engine", "accel"), [("trtllm", "gb200"), ("trtllm", "h200"), ("vllm", "h200")])
def test_every_engine_a_too_long_context_error_suggests_does_plan(engine: str, accel: str) -> None:
    with pytest.raises(SpecError) as refused:
        plan(spec_for(engine, accel, "bf16", "auto", None, False, "auto", 1_048_576))
    suggestions = str(refused.value).split("fix: ", 1)[1]
    offered = [s for s in ("sglang", "vllm", "trtllm") if f"engine {s}" in suggestions]
    assert offered, suggestions
    for other in offered:
        variant = "mxfp8" if f"engine {other} with model.variant mxfp8" in suggestions else "bf16"
        planned = plan(spec_for(other, accel, variant, "auto", None, False, "auto", 1_048_576))
        assert planned.max_model_len == 1_048_576


def test_the_docs_sample_table_says_which_samples_are_validated() -> None:
    # docs/planning.md "Samples": one row per sample, its validated column equal to the plan's.
    text = (SAMPLES_DIR.parents[1] / "docs" / "planning.md").read_text()
    section = text.split("\n## Samples\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| `")]
    table = {cells[1].strip().strip("`"): cells[2].strip() for cells in rows}
    assert set(table) == {p.stem for p in SAMPLES_DIR.glob("*.yaml")}
    for name, said in table.items():
        p = plan(parse_resource(load_sample(SAMPLES_DIR / f"{name}.yaml")).spec)
        assert said == ("yes" if p.validated else "no"), name

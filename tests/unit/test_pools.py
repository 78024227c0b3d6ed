"""The GPU pools beyond the seeds' three: HGX Blackwell (b200, b300) with the NVIDIA blog's SGLang command (NV-BLOG)
reproduced on one 8-GPU B200 node (`manifests/samples/sglang-b200-mxfp8-tp8-ep8.yaml`); GB300 trays, HGX H100/H20 and
AMD MI300X/MI325X (gfx942) and MI350X (gfx950): their node shape, labels, memory, what fits, and each engine's flags;
and the flag twins the parser grid checks through their twin."""

from __future__ import annotations

import re
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.api.models import Accelerator, Variant
from m3fleet.catalog import ACCELERATORS, ENGINES
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan
from tests.support.engines import grid
from tests.support.samples import SAMPLES_DIR, load_sample, resource

# The NVIDIA blog's SGLang command ("8 GPUs node case", NV-BLOG), flag by flag; its --tool-call-parser value is cut
# off in the archived copy after "minimax-m3" (the SGLang spelling m3fleet's parser check accepts).
BLOG_COMMAND = [
    ("--model-path", "MiniMaxAI/MiniMax-M3"),
    ("--dtype", "bfloat16"),
    ("--tp-size", "8"),
    ("--ep-size", "8"),
    ("--trust-remote-code", None),
    ("--mem-fraction-static", "0.8"),
    ("--enable-multimodal", None),
    ("--quantization", "mxfp8"),
    ("--attention-backend", "flashinfer"),
    ("--mm-attention-backend", "flashinfer_cudnn"),
    ("--moe-runner-backend", "deep_gemm"),
    ("--chunked-prefill-size", "8192"),
    ("--reasoning-parser", "minimax-m3"),
    ("--tool-call-parser", "minimax-m3"),
]
# What m3fleet adds for serving in a pod: its name, where it listens (behind the key guard), the context the plan
# sized, and the metrics the autoscaler reads.
SERVING_FLAGS = {"--served-model-name", "--host", "--port", "--context-length", "--enable-metrics"}


def parsed(argv: list[str]) -> dict[str, str | None]:
    """flag -> its value (None for a switch)."""
    flags: dict[str, str | None] = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            following = argv[i + 1] if i + 1 < len(argv) else None
            flags[arg] = None if following is None or following.startswith("--") else following
    return flags


def test_the_blogs_sglang_command_is_rendered_exactly_on_one_b200_node() -> None:
    doc = load_sample(SAMPLES_DIR / "sglang-b200-mxfp8-tp8-ep8.yaml")
    p = plan(parse_resource(doc).spec)
    assert (p.accelerator, p.nodes_per_replica, p.gpus_per_node, p.validated) == ("b200", 1, 8, True)
    (command,) = grid.commands(grid.render_document("sample/sglang-b200", doc))
    flags = parsed(command.argv)
    assert {flag: flags.get(flag, "absent") for flag, _ in BLOG_COMMAND} == dict(BLOG_COMMAND)
    assert set(flags) - {flag for flag, _ in BLOG_COMMAND} == SERVING_FLAGS


@pytest.mark.parametrize("accelerator", [Accelerator.B200, Accelerator.B300])
def test_hgx_blackwell_pools_are_8_gpu_x86_nodes(accelerator: Accelerator) -> None:
    facts = ACCELERATORS[accelerator]
    assert (facts.gpus_per_node, facts.vendor, facts.blackwell, facts.nvlink_spans_nodes) == (8, "nvidia", True, False)
    assert facts.node_labels["kubernetes.io/arch"] == ("amd64",)
    assert facts.node_labels["nvidia.com/gpu.product"][0].startswith("NVIDIA-B")
    assert set(facts.sources) >= {"memory_gib", "node_labels"}


def document(engine: str, accelerator: str, variant: str, **spec: Any) -> dict[str, Any]:
    return resource(engine, accelerator, variant, name="pool", **spec)


@pytest.mark.parametrize("accelerator", ["b200", "b300"])
def test_the_recipes_mxfp8_shapes_on_hgx_blackwell_are_validated(accelerator: str) -> None:
    # INFX: the vLLM recipe's MXFP8 TP8, TP4 and TP8+EP8 on one B200 / B300 node; NV-BLOG: SGLang TP8+EP8.
    for engine, parallelism in (
        ("vllm", {"tensorParallelSize": 8}),
        ("vllm", {"tensorParallelSize": 4}),
        ("vllm", {"strategy": "tp-ep", "tensorParallelSize": 8}),
        ("sglang", {"strategy": "tp-ep", "tensorParallelSize": 8}),
    ):
        p = plan(parse_resource(document(engine, accelerator, "mxfp8", parallelism=parallelism)).spec)
        assert p.validated and p.nodes_per_replica == 1, (engine, parallelism)
    # A larger GPU holds more: B300's 288 GB against B200's 179 GB at the same shape.
    kv = {
        a: plan(parse_resource(document("vllm", a, "mxfp8", parallelism={"tensorParallelSize": 8})).spec)
        for a in ("b200", "b300")
    }
    assert kv["b300"].kv_cache_tokens_per_replica > kv["b200"].kv_cache_tokens_per_replica


def test_the_vision_encoder_takes_sglangs_blackwell_backend_on_every_blackwell_pool() -> None:
    for accelerator, variant in (("b200", "mxfp8"), ("b300", "bf16"), ("gb200", "mxfp8"), ("h200", "bf16")):
        doc = document(
            "sglang", accelerator, variant, parallelism={"tensorParallelSize": 8}, context={"maxModelLen": 8192}
        )
        (command, *_) = grid.commands(grid.render_document(accelerator, doc))
        blackwell = ACCELERATORS[Accelerator(accelerator)].blackwell
        assert (parsed(command.argv).get("--mm-attention-backend") == "flashinfer_cudnn") is blackwell, accelerator


def test_tensorrt_llm_stays_on_the_pools_its_guide_documents() -> None:
    with pytest.raises(SpecErrors) as refused:
        parse_resource(document("trtllm", "b200", "bf16"))
    assert "spec.engine.name" in str(refused.value)


def _argv(engine: str, accelerator: str, variant: str, moe_backend: str = "auto", **spec: Any) -> list[str] | None:
    """The engine argv of the leader (or single pod), or None where the planner refuses the spec on this pool."""
    doc = document(engine, accelerator, variant, **spec)
    doc["spec"]["engine"]["moeBackend"] = moe_backend
    try:
        rendered = grid.render_document(accelerator, doc)
    except (SpecError, SpecErrors):
        return None
    (command, *_) = grid.commands(rendered)
    return command.argv


# Layouts a pair of twins may share (nodes of TP): TP over one node, TP over two nodes, and TP x PP over two nodes (two
# full 512k sequences: what a Hopper pool too small for BF16 on one node plans on both).
SHARED_LAYOUTS: tuple[tuple[int, dict[str, Any]], ...] = (
    (1, {"context": {"maxModelLen": 8192}}),
    (2, {"context": {"maxModelLen": 8192}}),
    (0, {"context": {"maxModelLen": 524_288, "minSequencesAtMaxLen": 2}}),
)


# (engine, or None for every engine that serves the pool; pool; its twin)
TWINS = [(None, pool, twin) for pool, twin in grid.FLAG_TWINS.items()] + [
    (engine, pool, twin) for (engine, pool), twin in grid.ENGINE_FLAG_TWINS.items()
]


@pytest.mark.parametrize(("only", "pool", "twin"), TWINS)
def test_a_flag_twin_renders_its_twins_flags_so_the_parser_grid_checks_it_through_the_twin(
    only: str | None, pool: Accelerator, twin: Accelerator
) -> None:
    # tests/support/engines/grid.flag_twin leaves `pool` out of the parser tier's cross product on this ground.
    facts, twin_facts = ACCELERATORS[pool], ACCELERATORS[twin]
    same_everywhere = ("vendor", "gpus_per_node", "nvlink_spans_nodes", "resource_name")
    what_flags_read = same_everywhere if only else (*same_everywhere, "blackwell", "gfx_target")
    assert [getattr(facts, f) for f in what_flags_read] == [getattr(twin_facts, f) for f in what_flags_read]
    compared = 0
    for engine in (e for e in ENGINES.values() if pool in e.support and only in (None, e.name.value)):
        # A pool-wide twin serves what its twin serves; an engine's twin may serve more (MI355X's MX variants).
        assert set(engine.support[pool]) <= set(engine.support[twin]), engine.name
        assert only or engine.support[pool] == engine.support[twin], engine.name
        assert engine.memory_fraction[pool] == engine.memory_fraction[twin], engine.name
        for variant in engine.support[pool]:
            moe = "aiter" if variant == Variant.MXFP4 else "auto"
            for nodes, layout in SHARED_LAYOUTS:
                spec = {**layout, "parallelism": {"tensorParallelSize": nodes * facts.gpus_per_node}}
                ours, theirs = (_argv(engine.name.value, a, variant.value, moe, **spec) for a in (pool, twin))
                if ours is not None and theirs is not None:
                    assert ours == theirs, (engine.name, variant, layout)
                    compared += 1
                    break
            else:
                pytest.fail(f"no layout plans on both {pool} and {twin} for {engine.name} {variant}")
    assert compared > 0


NEW_POOLS = {
    # pool: (GPUs a node, vendor, arch, NVLink across nodes, the pool's GPU memory relative to a sibling)
    Accelerator.GB300: (4, "nvidia", "arm64", True),
    Accelerator.H100: (8, "nvidia", "amd64", False),
    Accelerator.H20: (8, "nvidia", "amd64", False),
    Accelerator.MI300X: (8, "amd", "amd64", False),
    Accelerator.MI325X: (8, "amd", "amd64", False),
    Accelerator.MI350X: (8, "amd", "amd64", False),
}


@pytest.mark.parametrize("pool", list(NEW_POOLS))
def test_the_newer_pools_carry_their_nodes_shape_labels_and_sources(pool: Accelerator) -> None:
    facts = ACCELERATORS[pool]
    gpus, vendor, arch, nvlink = NEW_POOLS[pool]
    assert (facts.gpus_per_node, facts.vendor, facts.nvlink_spans_nodes) == (gpus, vendor, nvlink)
    assert facts.node_labels["kubernetes.io/arch"] == (arch,)
    product_label = "nvidia.com/gpu.product" if vendor == "nvidia" else "amd.com/gpu.product-name"
    assert facts.node_labels[product_label] and all(
        re.sub(r"\D", "", pool.value) in v
        for v in facts.node_labels[product_label]  # 300 of gb300 and mi300x
    )
    assert {"memory_gib", "node_labels"} <= set(facts.sources)
    assert (facts.gfx_target is not None) is (vendor == "amd")


def test_gpu_memory_follows_the_spec_sheets() -> None:
    memory = {a: ACCELERATORS[a].memory_gib for a in Accelerator}
    # H100 80 GB < H20 96 GB < H200 141 GB; MI300X 192 < MI325X 256 < MI350X 288 = MI355X; GB300 > GB200.
    assert memory[Accelerator.H100] < memory[Accelerator.H20] < memory[Accelerator.H200]
    assert memory[Accelerator.MI300X] < memory[Accelerator.MI325X] < memory[Accelerator.MI350X]
    assert memory[Accelerator.MI350X] == memory[Accelerator.MI355X]
    assert memory[Accelerator.GB200] < memory[Accelerator.GB300]


@pytest.mark.parametrize("pool", ["h100", "h20"])
def test_bf16_does_not_fit_one_small_hopper_node_and_the_planner_says_which_variant_does(pool: str) -> None:
    # 854 GB of BF16 weights on 8 x 80 or 8 x 96 GB: no KV room. Left to the planner, the replica spans two nodes.
    p = plan(parse_resource(document("vllm", pool, "bf16")).spec)
    assert (p.nodes_per_replica, p.pipeline_parallel_size, p.validated) == (2, 2, False)
    assert any(
        f"one {pool} node" in n and "variant mxfp8 or nvfp4 serves this context on one node" in n for n in p.notes
    )
    # Pinned to one node's TP8, it is refused with both fixes.
    with pytest.raises(SpecError) as refused:
        plan(parse_resource(document("vllm", pool, "bf16", parallelism={"tensorParallelSize": 8})).spec)
    assert refused.value.field == "spec.parallelism.tensorParallelSize"
    assert "leave the parallel sizes 0" in refused.value.fix and "variant mxfp8 or nvfp4" in refused.value.fix
    # The lighter variants do fit one node.
    for variant in ("mxfp8", "nvfp4"):
        assert plan(parse_resource(document("vllm", pool, variant)).spec).nodes_per_replica == 1, variant


def test_bf16_fits_one_gb300_tray_where_gb200_needs_two() -> None:
    trays = {a: plan(parse_resource(document("vllm", a, "bf16")).spec).nodes_per_replica for a in ("gb200", "gb300")}
    assert trays == {"gb200": 2, "gb300": 1}


def test_a_multi_tray_gb300_replica_gets_the_nvlink_compute_domain_as_gb200() -> None:
    doc = document("vllm", "gb300", "bf16", parallelism={"tensorParallelSize": 8})
    rendered = grid.render_document("gb300", doc)
    kinds = {o["kind"] for o in rendered.objects}
    assert {"LeaderWorkerSet", "ComputeDomain"} <= kinds
    lws = next(o for o in rendered.objects if o["kind"] == "LeaderWorkerSet")
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    assert leader["resourceClaims"] and leader["affinity"]["podAffinity"]


def test_sglang_on_gfx942_takes_the_cookbooks_mi300x_backends_and_gfx950_does_not() -> None:
    cdna3 = ["--attention-backend", "aiter", "--moe-runner-backend", "triton", "--watchdog-timeout", "3600"]
    for pool in ("mi300x", "mi325x", "mi350x", "mi355x"):
        flags = parsed(_argv("sglang", pool, "mxfp8", parallelism={"tensorParallelSize": 8}) or [])
        gfx942 = ACCELERATORS[Accelerator(pool)].gfx_target == "gfx942"
        assert all(flags.get(f) == v for f, v in zip(cdna3[::2], cdna3[1::2], strict=True)) is gfx942, pool
        assert ("--skip-server-warmup" in flags) is gfx942, pool
        assert flags["--quantization"] == "mxfp8"


def test_vllm_runs_the_recipes_one_amd_command_on_gfx942_and_gfx950() -> None:
    # VLLM-RCP's AMD commands are the same for MI300X/MI325X and MI350X/MI355X (TRITON_ATTN, AITER encoder attention).
    argv = {a: _argv("vllm", a, "bf16", parallelism={"tensorParallelSize": 8}) for a in ("mi300x", "mi355x")}
    assert argv["mi300x"] is not None and argv["mi300x"] == argv["mi355x"]
    assert parsed(argv["mi300x"])["--attention-backend"] == "TRITON_ATTN"
    assert plan(
        parse_resource(document("vllm", "mi300x", "bf16", parallelism={"tensorParallelSize": 8})).spec
    ).validated


# (engine, pool, variant) a pool does not serve, and a word of the reason the refusal must give.
UNSERVED_ON_POOL = {
    ("vllm", "mi300x", "mxfp8"): "gfx942",  # the recipe's MX variants are gfx950's
    ("vllm", "mi325x", "mxfp4"): "gfx950",  # the CRD's rule: MXFP4 on gfx950 pools only
    ("sglang", "h100", "mxfp8"): "Hopper",
}


@pytest.mark.parametrize(("engine", "pool", "variant"), list(UNSERVED_ON_POOL))
def test_a_variant_a_pool_does_not_serve_is_refused_with_the_reason(engine: str, pool: str, variant: str) -> None:
    reason = UNSERVED_ON_POOL[(engine, pool, variant)]
    with pytest.raises((SpecError, SpecErrors)) as refused:
        plan(parse_resource(document(engine, pool, variant)).spec)
    assert "spec.model.variant" in str(refused.value) and reason in str(refused.value)


def test_mxfp4_runs_on_both_gfx950_pools() -> None:
    for pool in ("mi350x", "mi355x"):
        spec = document("vllm", pool, "mxfp4")
        spec["spec"]["engine"]["moeBackend"] = "aiter"
        assert plan(parse_resource(spec).spec).tensor_parallel_size == 4, pool


@pytest.mark.parametrize("pool", ["gb300", "h100", "h20"])
def test_tensorrt_llm_is_refused_on_the_newer_nvidia_pools(pool: str) -> None:
    with pytest.raises(SpecErrors) as refused:
        parse_resource(document("trtllm", pool, "bf16"))
    assert "spec.engine.name" in str(refused.value)

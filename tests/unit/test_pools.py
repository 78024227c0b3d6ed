"""The HGX Blackwell pools (b200, b300): 8 GPUs a node, their node labels and memory, each engine's Blackwell flags, and
the NVIDIA blog's SGLang command (NV-BLOG) reproduced on one 8-GPU B200 node
(`manifests/samples/sglang-b200-mxfp8-tp8-ep8.yaml`)."""

from __future__ import annotations

from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.api.models import Accelerator
from m3fleet.catalog import ACCELERATORS
from m3fleet.errors import SpecErrors
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


def test_b300_renders_b200s_flags_so_the_parser_grid_checks_it_through_b200() -> None:
    # tests/support/engines/grid.FLAG_TWINS leaves b300 out of the parser tier's cross product on this ground.
    for engine, variant in (("vllm", "nvfp4"), ("sglang", "mxfp8")):
        argv = {}
        for accelerator in ("b200", "b300"):
            doc = document(engine, accelerator, variant, parallelism={"tensorParallelSize": 8})
            (command, *_) = grid.commands(grid.render_document(accelerator, doc))
            argv[accelerator] = command.argv
        assert argv["b200"] == argv["b300"], engine

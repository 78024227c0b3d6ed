"""vLLM (`vllm serve`) for MiniMax-M3, as the vLLM recipe runs it (VLLM-RCP, VLLM-RCP-AMD).

Multi-node replicas use vLLM's own multi-process launcher (`--nnodes/--node-rank/--master-addr`,
`--headless` on workers; VLLM-PAR), fed from the LeaderWorkerSet environment. Ray is not used.
"""

from __future__ import annotations

from m3fleet.api.models import MoeBackend, Strategy, Variant
from m3fleet.catalog import KV_LAYOUT
from m3fleet.engines.base import (
    LWS_GROUP_SIZE,
    LWS_LEADER_ADDRESS,
    Context,
    EngineLaunch,
    check_extra_args,
    compact_json,
    http_probes,
    node_rank_launch,
    yarn_overrides,
)

OWNED_FLAGS = frozenset(
    {
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--enable-expert-parallel",
        "--block-size",
        "--max-model-len",
        "--kv-cache-dtype",
        "--gpu-memory-utilization",
        "--tool-call-parser",
        "--reasoning-parser",
        "--hf-overrides",
        "--language-model-only",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--headless",
        "--port",
    }
)

# --skip-mm-profiling is never rendered. The AMD recipe needed it above ~32k context because the dummy video grew
# with max_model_len; vLLM 0.33.0 caps it at the largest video M3's processor accepts (500 frames, ~192k tokens,
# models/minimax_m3/common/mm_preprocess.py), so profiling stays bounded and reserves the encoder's peak memory.
# Skipping it would leave that memory to the KV cache, and the first large image or video would run the engine
# out of memory. The planner counts the reserved encoder cache (planner.encoder_cache_gib).


def moe_backend(ctx: Context) -> str | None:
    """MXFP4 on AMD needs an explicit MoE backend; auto takes emulation, which runs on every image (VLLM-RCP)."""
    if ctx.plan.variant != Variant.MXFP4:
        return None
    chosen = MoeBackend(ctx.spec.engine.moe_backend)
    return MoeBackend.EMULATION.value if chosen == MoeBackend.AUTO else chosen.value


def serve_args(ctx: Context) -> list[str]:
    plan, spec = ctx.plan, ctx.spec
    amd = ctx.accelerator.vendor == "amd"
    args = [
        ctx.model_path,
        "--served-model-name",
        ctx.served_model_name,
        "--host",
        "0.0.0.0",
        "--port",
        str(ctx.engine.port),
        "--tensor-parallel-size",
        str(plan.tensor_parallel_size),
    ]
    if plan.pipeline_parallel_size > 1:
        # One stage per node, TP within it (VLLM-PAR's multi-node example: TP8 x PP2 with --nnodes 2).
        args += ["--pipeline-parallel-size", str(plan.pipeline_parallel_size)]
    if plan.strategy == Strategy.DP_EP:
        args += ["--data-parallel-size", str(plan.data_parallel_size)]
    if plan.expert_parallel_size > 1:
        args.append("--enable-expert-parallel")
    args += [
        "--block-size",
        str(KV_LAYOUT.block_size),  # mandatory: MSA's sparse block size (VLLM-RCP troubleshooting)
        "--max-model-len",
        str(plan.max_model_len),
        "--gpu-memory-utilization",
        str(plan.gpu_memory_utilization),
    ]
    if plan.kv_cache_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    if amd:
        args += ["--attention-backend", "TRITON_ATTN"]
    backend = moe_backend(ctx)
    if backend:
        args += ["--moe-backend", backend]
        if backend == MoeBackend.AITER.value:
            args.append("--no-enable-prefix-caching")  # as the recipe's AITER MXFP4 command
    if spec.model.language_model_only:
        args.append("--language-model-only")
    else:
        args += [
            "--mm-encoder-tp-mode",
            "data",
            "--mm-encoder-attn-backend",
            "ROCM_AITER_FA" if amd else "FLASHINFER",
            "--mm-processor-cache-type",
            "shm",
        ]
    if plan.rope_scaling_factor > 1:
        args += ["--hf-overrides", compact_json(yarn_overrides(plan))]
    args += [
        "--tool-call-parser",
        ctx.engine.tool_parser,
        "--reasoning-parser",
        ctx.engine.reasoning_parser,
        "--enable-auto-tool-choice",
        "--trust-remote-code",
    ]
    return args


def env(ctx: Context) -> dict[str, str]:
    values: dict[str, str] = {}
    if ctx.accelerator.vendor == "amd":
        values["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "0"  # keeps CUDA graphs on the M3 decode path (VLLM-RCP)
        if moe_backend(ctx) == MoeBackend.AITER.value:
            values["VLLM_ROCM_USE_AITER"] = "1"
            values["VLLM_ROCM_USE_AITER_MOE"] = "1"
    if ctx.plan.rope_scaling_factor > 1:
        values["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    return values


def launch(ctx: Context) -> EngineLaunch:
    check_extra_args(list(ctx.spec.engine.extra_args), OWNED_FLAGS, "vllm")
    probes = http_probes(ctx.engine.port, ctx.engine.live_path, ctx.engine.ready_path)
    group = ["--nnodes", LWS_GROUP_SIZE, "--master-addr", LWS_LEADER_ADDRESS]
    return node_rank_launch(ctx, ["vllm", "serve"], serve_args(ctx), env(ctx), probes, group, ("--headless",))

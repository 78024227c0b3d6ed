"""vLLM (`vllm serve`) for MiniMax-M3, as the vLLM recipe runs it (VLLM-RCP, VLLM-RCP-AMD).

Multi-node replicas use vLLM's own multi-process launcher (`--nnodes/--node-rank/--master-addr`,
`--headless` on workers; VLLM-PAR), fed from the LeaderWorkerSet environment. Ray is not used.
"""

from __future__ import annotations

from typing import Any

from m3fleet.api.models import MoeBackend, SpeculativeMethod, Strategy, Variant
from m3fleet.catalog import KV_LAYOUT
from m3fleet.engines import flags
from m3fleet.engines.base import (
    LWS_GROUP_SIZE,
    LWS_LEADER_ADDRESS,
    SHUTDOWN_TIMEOUT_SECONDS,
    Context,
    EngineLaunch,
    compact_json,
    http_probes,
    literal,
    node_rank_launch,
    secret_env,
    yarn_overrides,
)
from m3fleet.engines.flags import API_KEY, CATALOG, CONFIG_FILE, PLANNER, OwnedFlag

# Flags m3fleet renders (or deliberately leaves unset) and the spec field that drives each. Every spelling vLLM's own
# parser accepts is refused in spec.engine.extraArgs (engines.flags, from engine-options.json).
OWNED = (
    OwnedFlag("--tensor-parallel-size", "set spec.parallelism.tensorParallelSize instead"),
    OwnedFlag("--pipeline-parallel-size", PLANNER),
    OwnedFlag("--data-parallel-size", "set spec.parallelism.dataParallelSize (strategy dp-ep) instead"),
    # DP wiring: the plan places every DP rank (per node, ranks, the leader's address and port)
    OwnedFlag("--data-parallel-size-local", PLANNER),
    OwnedFlag("--data-parallel-rank", PLANNER),
    OwnedFlag("--data-parallel-start-rank", PLANNER),
    OwnedFlag("--data-parallel-address", PLANNER),
    OwnedFlag("--data-parallel-rpc-port", PLANNER),
    # context parallelism multiplies the GPUs of a replica and splits its KV cache: the plan's figures would lie
    OwnedFlag("--prefill-context-parallel-size", PLANNER),
    OwnedFlag("--decode-context-parallel-size", PLANNER),
    OwnedFlag("--enable-expert-parallel", "set spec.parallelism.strategy (tp-ep or dp-ep) instead"),
    OwnedFlag("--block-size", "nothing: MiniMax-M3's sparse attention needs block size 128"),
    OwnedFlag("--max-model-len", "set spec.context.maxModelLen instead"),
    OwnedFlag("--kv-cache-dtype", "set spec.context.kvCacheDtype instead"),
    OwnedFlag("--gpu-memory-utilization", PLANNER),
    # the KV cache's size, which the plan computes (kvCacheTokensPerReplica, maxSequencesAtMaxLen)
    OwnedFlag("--kv-cache-memory-bytes", PLANNER),
    OwnedFlag("--num-gpu-blocks-override", PLANNER),
    OwnedFlag("--tool-call-parser", CATALOG),
    OwnedFlag("--reasoning-parser", CATALOG),
    OwnedFlag("--speculative-config", "set spec.speculativeDecoding instead"),
    OwnedFlag("--hf-overrides", "set spec.context.maxModelLen instead (m3fleet renders YaRN past the native context)"),
    OwnedFlag("--language-model-only", "set spec.model.languageModelOnly instead"),
    OwnedFlag("--nnodes", PLANNER),
    OwnedFlag("--node-rank", PLANNER),
    OwnedFlag("--master-addr", PLANNER),
    OwnedFlag("--headless", PLANNER),
    OwnedFlag("--port", CATALOG),
    OwnedFlag("--host", CATALOG),
    OwnedFlag("--model", "set spec.model (variant, checkpoint, source) instead"),
    OwnedFlag("--served-model-name", "set spec.model.checkpoint instead"),
    OwnedFlag("--api-key", API_KEY),
    OwnedFlag("--config", CONFIG_FILE),
    OwnedFlag("--shutdown-timeout", "nothing: m3fleet fits vLLM's drain into the pod's termination grace period"),
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


# vLLM's names for the methods (VLLM-MTP: M3's MTP is its own method, minimax_m3_mtp).
SPECULATIVE_METHODS = {SpeculativeMethod.MTP: "minimax_m3_mtp", SpeculativeMethod.EAGLE3: "eagle3"}


def speculative_config(ctx: Context) -> dict[str, Any] | None:
    """`--speculative-config` as the vLLM recipe writes it (VLLM-RCP-SPEC): the method, the draft (MTP drafts with the
    served checkpoint's own modules), the tokens per step; on NVIDIA the EAGLE3 drafter on FLASH_ATTN, since
    FlashInfer serves M3's mandatory block size 128 only through a GQA-only kernel and the draft is MHA."""
    speculative = ctx.plan.speculative_decoding
    if speculative is None:
        return None
    method = SpeculativeMethod(speculative.method)
    config: dict[str, Any] = {
        "method": SPECULATIVE_METHODS[method],
        "num_speculative_tokens": speculative.num_speculative_tokens,
    }
    if method == SpeculativeMethod.EAGLE3:
        config["model"] = speculative.draft_model
        if ctx.accelerator.vendor == "nvidia":
            config["attention_backend"] = "FLASH_ATTN"
    return config


def serve_args(ctx: Context) -> list[str]:
    plan, spec = ctx.plan, ctx.spec
    amd = ctx.accelerator.vendor == "amd"
    args = [
        literal(ctx.model_path),
        "--served-model-name",
        literal(ctx.served_model_name),
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
    elif plan.variant == Variant.NVFP4:
        # A ModelOpt checkpoint may name a KV algorithm that vLLM's 'auto' then takes (VLLM-NVFP4): keep the KV the
        # plan counted.
        args += ["--kv-cache-dtype", "bfloat16"]
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
    speculative = speculative_config(ctx)
    if speculative is not None:
        args += ["--speculative-config", literal(compact_json(speculative))]
    args += [
        "--tool-call-parser",
        ctx.engine.tool_parser,
        "--reasoning-parser",
        ctx.engine.reasoning_parser,
        "--enable-auto-tool-choice",
        "--trust-remote-code",
        # On SIGTERM (scale-down, rollout) finish the requests in flight instead of aborting them (vLLM's default).
        "--shutdown-timeout",
        str(SHUTDOWN_TIMEOUT_SECONDS),
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
    flags.check_extra_args(ctx.spec.engine.extra_args, flags.parser_table("vllm"), OWNED)
    probes = http_probes(ctx.engine.port, ctx.engine.live_path, ctx.engine.ready_path)
    group = ["--nnodes", LWS_GROUP_SIZE, "--master-addr", LWS_LEADER_ADDRESS]
    # vLLM reads the API key from VLLM_API_KEY (entrypoints/serve/middleware/register.py): never on the command line.
    keys = secret_env(ctx, "VLLM_API_KEY")
    return node_rank_launch(ctx, ["vllm", "serve"], serve_args(ctx), env(ctx), probes, group, ("--headless",), keys)

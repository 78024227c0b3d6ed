"""SGLang (`python3 -m sglang.launch_server`) for MiniMax-M3 (SGL-CFG, SGL-CB, NV-BLOG).

Multi-node: every node runs the same command with `--dist-init-addr <leader>:<port> --nnodes N
--node-rank R`; TP is the total across nodes unless the plan has pipeline stages (`--pp-size`, one per node,
`--tp-size` then per stage); only the leader serves HTTP (LWS-EX).

Kernels: SGLang 0.5.23 picks M3's attention backend, page size and MoE runner itself per platform
(`srt/arg_groups/model_overrides/minimax_m3.py`), but only for flags left unset: fa3 + page 128 on Hopper; fa4 +
page 128 (the MSA fmha_sm100 kernel), or trtllm_mha with fp8_e4m3 KV, plus deep_gemm for MXFP8 on SM100; triton
on ROCm; triton whenever the MoE weights are BF16. Forcing any of them only loses paths (on GB200 the fp8-KV
attention GEMMs), so none is rendered; the NVIDIA blog's Blackwell command (NV-BLOG) is followed
otherwise, and each difference is listed in `catalog.ENGINES[sglang].deviations` and the plan's notes.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from m3fleet.api.models import Strategy, Variant
from m3fleet.engines import flags
from m3fleet.engines.base import (
    LWS_GROUP_SIZE,
    LWS_LEADER_ADDRESS,
    Context,
    EngineLaunch,
    KeyGuard,
    compact_json,
    http_probes,
    literal,
    node_rank_launch,
    secret_env,
    yarn_overrides,
)
from m3fleet.engines.flags import API_KEY, CATALOG, CONFIG_FILE, PLANNER, OwnedFlag

SPECULATIVE = "set spec.speculativeDecoding instead"
# Flags m3fleet renders and the spec field that drives each; every spelling SGLang's own parser accepts is refused
# in spec.engine.extraArgs (engines.flags, from engine-options.json).
OWNED = (
    OwnedFlag("--tp-size", "set spec.parallelism.tensorParallelSize instead"),
    OwnedFlag("--pp-size", PLANNER),
    OwnedFlag("--dp-size", "set spec.parallelism.dataParallelSize (strategy dp-ep) instead"),
    OwnedFlag("--ep-size", "set spec.parallelism.strategy (tp-ep or dp-ep) instead"),
    OwnedFlag("--enable-dp-attention", "set spec.parallelism.strategy dp-ep instead"),
    OwnedFlag("--mem-fraction-static", PLANNER),
    # the KV cache's size (kvCacheTokensPerReplica), the GPUs each rank uses, and parallel sizes the plan counts
    OwnedFlag("--max-total-tokens", PLANNER),
    OwnedFlag("--base-gpu-id", PLANNER),
    OwnedFlag("--gpu-id-step", PLANNER),
    OwnedFlag("--attn-cp-size", PLANNER),
    OwnedFlag("--dcp-size", PLANNER),
    OwnedFlag("--moe-dp-size", PLANNER),
    OwnedFlag("--context-length", "set spec.context.maxModelLen instead"),
    OwnedFlag("--kv-cache-dtype", "set spec.context.kvCacheDtype instead"),
    OwnedFlag("--reasoning-parser", CATALOG),
    OwnedFlag("--tool-call-parser", CATALOG),
    OwnedFlag(
        "--json-model-override-args",
        "set spec.context.maxModelLen instead (m3fleet renders YaRN past the native context)",
    ),
    OwnedFlag("--enable-multimodal", "set spec.model.languageModelOnly instead"),
    OwnedFlag("--language-model-only", "set spec.model.languageModelOnly instead"),
    OwnedFlag("--dist-init-addr", PLANNER),
    OwnedFlag("--nnodes", PLANNER),
    OwnedFlag("--node-rank", PLANNER),
    OwnedFlag("--port", CATALOG),
    OwnedFlag("--host", CATALOG),
    OwnedFlag("--model-path", "set spec.model (variant, checkpoint, source) instead"),
    OwnedFlag("--served-model-name", "set spec.model.checkpoint instead"),
    OwnedFlag("--api-key", API_KEY),
    OwnedFlag(
        "--admin-api-key",
        "set spec.engine.adminApiKeySecretRef instead (without it the admin endpoints answer no one)",
    ),
    OwnedFlag("--config", CONFIG_FILE),
    OwnedFlag("--speculative-algorithm", SPECULATIVE),
    OwnedFlag("--speculative-draft-model-path", SPECULATIVE),
    OwnedFlag("--speculative-num-steps", SPECULATIVE),
    OwnedFlag("--speculative-eagle-topk", SPECULATIVE),
    OwnedFlag("--speculative-num-draft-tokens", SPECULATIVE),
)

# SGLang 0.5.23 serves its whole configuration on /server_info, `admin_api_key` and `launch_command` (with --api-key)
# included, to any holder of the API key (to anyone when there is none), and logs both keys at start
# (srt/entrypoints/http_server.py, srt/utils/common.py build_server_info). Redacting that means patching SGLang at
# every place it prints its arguments, now and in every later version; so SGLang gets no key at all and listens on
# 127.0.0.1 only, and the key guard (m3fleet.keyguard, a container of its own holding the keys from their Secrets)
# is the only listener on the engine port: the API key for the routes SGLang serves at its normal auth level, the
# admin key for everything else (without one the admin routes answer no one), /health*, /ready*, /metrics open.
# What SGLang prints can then hold no key, whatever it prints. `kubectl exec` into the engine container reaches SGLang
# unauthenticated on 127.0.0.1 (an exec'ing user can read the Secrets' mounts anyway).
COMMAND = ["python3", "-m", "sglang.launch_server"]
API_KEY_VAR = "M3FLEET_API_KEY"  # in the key guard's container only
ADMIN_API_KEY_VAR = "M3FLEET_ADMIN_API_KEY"
LOCAL_PORT_OFFSET = 1000  # SGLang on 127.0.0.1:<port + this>: clear of its own port + 233.. (DP attention's ZMQ)
ROUTES_FILE = "sglang-routes.json"  # SGLang's API-key routes, from its own route table (tests/engine_parsers)


@cache
def api_key_routes() -> tuple[tuple[str, str], ...]:
    """(method, path template) of every route SGLang serves at its normal auth level (`NORMAL`, the API key)."""
    raw = json.loads(resources.files("m3fleet.engines").joinpath(ROUTES_FILE).read_text(encoding="utf-8"))
    return tuple((str(method), str(path)) for method, path in raw["normalRoutes"])


def key_guard(ctx: Context) -> KeyGuard:
    config = {
        "listen": ctx.engine.port,
        "upstream": local_port(ctx),
        "apiKeyEnv": API_KEY_VAR,
        "adminKeyEnv": ADMIN_API_KEY_VAR,
        "normalRoutes": api_key_routes(),
    }
    return KeyGuard(compact_json(config), secret_env(ctx, API_KEY_VAR, ADMIN_API_KEY_VAR))


def local_port(ctx: Context) -> int:
    return ctx.engine.port + LOCAL_PORT_OFFSET


DIST_INIT_PORT = 20000  # the LWS SGLang example's rendezvous port
LONG_CONTEXT = 32_768  # above it the cookbook raises the chunked-prefill size (SGL-CB)


# SGLang's validated MI300X command (SGL-CFG-POOLS): on gfx942 the M3 path needs the aiter attention backend and the
# triton MoE runner (it converts MXFP8 to block-fp8 at load), and the cold-start AITER JIT can outlast the default
# watchdog and warmup, so the cell raises one and skips the other (the readiness probe's /health_generate still runs a
# real forward pass before the pod takes traffic).
CDNA3_ARGS = [
    "--attention-backend",
    "aiter",
    "--moe-runner-backend",
    "triton",
    "--watchdog-timeout",
    "3600",
    "--skip-server-warmup",
]


def multimodal_args(ctx: Context) -> list[str]:
    """The vision side: NV-BLOG's encoder attention on Blackwell, or text-only serving."""
    if ctx.spec.model.language_model_only:
        # Refuses image/video requests; SGLang's M3 model still loads the vision tower (the plan counts it).
        return ["--language-model-only"]
    args = ["--enable-multimodal"]
    if ctx.accelerator.blackwell:
        args += ["--mm-attention-backend", "flashinfer_cudnn"]  # NV-BLOG's Blackwell vision-encoder attention
    return args


def speculative_args(ctx: Context) -> list[str]:
    """EAGLE3 in SGLang's spelling (SGL-SPEC): a chain of numSpeculativeTokens draft steps, one candidate each
    (top-k 1), so the target verifies steps + 1 tokens per pass. SGLang 0.5.23 builds no MTP module for M3."""
    speculative = ctx.plan.speculative_decoding
    if speculative is None:
        return []
    steps = speculative.num_speculative_tokens
    return [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        literal(speculative.draft_model),
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(steps + 1),
    ]


def serve_args(ctx: Context) -> list[str]:
    plan = ctx.plan
    # With DP attention SGLang's TP is the whole world (DP splits it); with pipeline stages it is per stage.
    tp = plan.tensor_parallel_size * plan.data_parallel_size
    args = [
        "--model-path",
        literal(ctx.model_path),
        "--served-model-name",
        literal(ctx.served_model_name),
        "--host",
        "127.0.0.1",  # only the key guard, in the same pod, reaches SGLang
        "--port",
        str(local_port(ctx)),
        "--tp-size",
        str(tp),
    ]
    if plan.pipeline_parallel_size > 1:
        args += ["--pp-size", str(plan.pipeline_parallel_size)]
    if plan.strategy == Strategy.DP_EP:
        args += ["--dp-size", str(plan.data_parallel_size), "--enable-dp-attention"]
    if plan.expert_parallel_size > 1:
        args += ["--ep-size", str(plan.expert_parallel_size)]
    args += [
        "--mem-fraction-static",
        str(plan.gpu_memory_utilization),
        "--context-length",
        str(plan.max_model_len),
        "--chunked-prefill-size",
        # NV-BLOG's 8192, raised above 32k context as the cookbook advises (SGL-CB).
        "16384" if plan.max_model_len > LONG_CONTEXT else "8192",
    ]
    if plan.variant == Variant.MXFP8:
        args += ["--quantization", "mxfp8", "--dtype", "bfloat16"]
    if plan.kv_cache_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8_e4m3"]
    if ctx.accelerator.gfx_target == "gfx942":
        args += CDNA3_ARGS
    args += multimodal_args(ctx)
    args += speculative_args(ctx)
    if plan.rope_scaling_factor > 1:
        # The whole RoPE block, rope_theta included (engines.base.yarn_overrides).
        args += ["--json-model-override-args", compact_json(yarn_overrides(plan))]
    args += [
        "--trust-remote-code",
        "--reasoning-parser",
        ctx.engine.reasoning_parser,
        "--tool-call-parser",
        ctx.engine.tool_parser,
        "--enable-metrics",
    ]
    return args


def env(ctx: Context) -> dict[str, str]:
    values: dict[str, str] = {}
    if ctx.accelerator.vendor == "amd":
        values["SGLANG_USE_AITER"] = "1"
    if ctx.plan.rope_scaling_factor > 1:
        values["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    return values


def launch(ctx: Context) -> EngineLaunch:
    flags.check_extra_args(ctx.spec.engine.extra_args, flags.parser_table("sglang"), OWNED)
    port = ctx.engine.port
    # /health_generate runs a real forward pass: probe it less often than a plain liveness check.
    probes = http_probes(port, ctx.engine.live_path, ctx.engine.ready_path, ready_period=30, ready_timeout=60)
    group = ["--dist-init-addr", f"{LWS_LEADER_ADDRESS}:{DIST_INIT_PORT}", "--nnodes", LWS_GROUP_SIZE]
    # A worker node's schedulers (with DP attention, its DP ranks: their queues and KV pools) export on that node
    # only, through the health server SGLang starts on non-zero node ranks once their schedulers have loaded the
    # weights (srt/entrypoints/engine.py, launch_dummy_health_check_server: /health, and /metrics under
    # --enable-metrics). Probing it there keeps a worker, and so its group, unready until its weights are loaded.
    # Its /health_generate answers 200 without a forward pass, so /health serves for readiness too.
    worker_health = http_probes(port, ctx.engine.live_path, ctx.engine.live_path)
    return node_rank_launch(
        ctx, COMMAND, serve_args(ctx), env(ctx), probes, group, worker_health=worker_health, key_guard=key_guard(ctx)
    )

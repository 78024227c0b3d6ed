"""Everything m3fleet knows about MiniMax-M3, the GPU pools and the engines — as data, in one place.

Each number carries the source it came from (the tags are defined in `SOURCES`, copied from
`shared/docs/m3-facts.md` §0). "UNVERIFIED" marks a number nobody has checked on real hardware
or the pinned image; the planner repeats those caveats in the plan's notes where they matter.
Change a number here and the planner, renderers and tests follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from m3fleet.api.models import Accelerator, EngineName, Strategy, Variant
from m3fleet.catalog.versions import SGLANG_VERSION, TRTLLM_VERSION, VLLM_VERSION

SOURCES: Final[dict[str, str]] = {
    "HF-CFG": "huggingface/transformers models/minimax_m3_vl/configuration_minimax_m3_vl.py",
    "VLLM-IDX": "vllm-project/vllm vllm/models/minimax_m3/common/indexer.py",
    "VLLM-SPA": "vllm-project/vllm vllm/models/minimax_m3/common/sparse_attention.py",
    "VLLM-RCP": "vllm-project/recipes models/MiniMaxAI/MiniMax-M3.yaml (recipes.vllm.ai/MiniMaxAI/MiniMax-M3)",
    "VLLM-RCP-AMD": "vllm-project/recipes MiniMax/MiniMax-M3.md",
    "VLLM-PAR": "vllm-project/vllm docs/serving/parallelism_scaling.md",
    "VLLM-MET": "vllm-project/vllm vllm/v1/metrics/loggers.py",
    "TRT-GUIDE": "NVIDIA/TensorRT-LLM docs/source/deployment-guide/deployment-guide-for-minimax-m3-on-trtllm.md",
    "TRT-YAML": "NVIDIA/TensorRT-LLM examples/configs/curated/minimax-m3-throughput.yaml",
    "SGL-CFG": "sgl-project/sglang docs_new/src/snippets/configs/MiniMaxAI/minimax-m3.jsx",
    "SGL-CB": "sgl-project/sglang docs_new/cookbook/autoregressive/MiniMax/MiniMax-M3.mdx",
    "NV-BLOG": "NVIDIA developer blog 'Deploy Long-Context Reasoning ... MiniMax M3' (shared/seeds/000)",
    "LWS-API": "kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go",
    "GFD": "NVIDIA/k8s-device-plugin docs/gpu-feature-discovery/README.md",
    "DRA": "NVIDIA/k8s-dra-driver-gpu api/nvidia.com/resource/v1beta1/computedomain.go",
    "AMD-DP": "ROCm/k8s-device-plugin docs/advanced/node-labelling.md",
    "3P-CALC": "third-party KV-calculator dataset quoting MiniMaxAI/MiniMax-M3 config.json",
    "ENGINE-ARGPARSE": "shared/docs/engine-argparse.md (the pinned wheels, inspected on CPU)",
    "DERIVED": "computed in this file from the sourced numbers above it",
}

GB: Final = 1e9
GIB: Final = float(1 << 30)


# --- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KvLayout:
    """What one token costs in the KV cache (vLLM's layout for M3; m3-facts §1.2)."""

    layers: int = 60  # every layer keeps full paged K/V; MSA selects blocks, it does not shrink the cache
    kv_heads: int = 4  # GQA, head_dim 128
    head_dim: int = 128
    index_layers: int = 57  # MSA sparse layers 3..59 add one index-K vector per token
    index_dim: int = 128  # not sharded by TP; BF16 by default even with fp8 KV
    index_dtype_bytes: int = 2
    block_size: int = 128  # vLLM --block-size 128 is mandatory (page size == sparse block size)
    sources: tuple[str, ...] = ("HF-CFG", "3P-CALC", "VLLM-IDX", "VLLM-SPA", "VLLM-RCP")


@dataclass(frozen=True)
class ModelVariant:
    name: Variant
    checkpoint: str
    weights_gb: float  # whole checkpoint, decimal GB
    replicated_gb: float  # attention, dense layers, shared experts, embeddings, vision encoder
    vision_encoder_gb: float
    native_max_model_len: int
    native_context_verified: bool
    kv_scales_calibrated: bool  # without calibrated scales fp8 KV is never chosen automatically
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def routed_experts_gb(self) -> float:
        return self.weights_gb - self.replicated_gb


TOTAL_PARAMS_B: Final = 427.04  # VLLM-RCP
ACTIVE_PARAMS_B: Final = 26.0  # VLLM-RCP ("about 26B active")
ROUTED_EXPERTS, EXPERTS_PER_TOKEN = 128, 4  # HF-CFG
# Active = replicated + routed * 4/128, total = replicated + routed  =>  routed = 413.98B, replicated = 13.06B.
ROUTED_PARAMS_B: Final = (TOTAL_PARAMS_B - ACTIVE_PARAMS_B) / (1 - EXPERTS_PER_TOKEN / ROUTED_EXPERTS)
REPLICATED_PARAMS_B: Final = TOTAL_PARAMS_B - ROUTED_PARAMS_B
VISION_ENCODER_PARAMS_B: Final = 0.6  # NV-BLOG table: "vision encoder parameters 0.6B"
# Non-expert weights stay BF16 in the MX checkpoints (UNVERIFIED for MXFP4: assumed like MXFP8).
REPLICATED_GB_BF16: Final = REPLICATED_PARAMS_B * 2

VARIANTS: Final[dict[Variant, ModelVariant]] = {
    Variant.BF16: ModelVariant(
        name=Variant.BF16,
        checkpoint="MiniMaxAI/MiniMax-M3",
        weights_gb=TOTAL_PARAMS_B * 2,  # 854.08 GB
        replicated_gb=REPLICATED_GB_BF16,
        vision_encoder_gb=VISION_ENCODER_PARAMS_B * 2,
        native_max_model_len=524_288,
        native_context_verified=True,
        kv_scales_calibrated=True,
        sources={
            "weights_gb": "VLLM-RCP (427.04B params x 2 B)",
            "replicated_gb": "DERIVED from 427.04B total, 26B active, top-4 of 128 experts",
            "native_max_model_len": "VLLM-RCP, TRT-GUIDE, HF-CFG",
        },
    ),
    Variant.MXFP8: ModelVariant(
        name=Variant.MXFP8,
        checkpoint="MiniMaxAI/MiniMax-M3-MXFP8",
        weights_gb=440.0,
        replicated_gb=REPLICATED_GB_BF16,
        vision_encoder_gb=VISION_ENCODER_PARAMS_B * 2,
        native_max_model_len=1_048_576,
        native_context_verified=True,
        kv_scales_calibrated=True,
        sources={
            "weights_gb": "SGL-CB (about 440 GB)",
            "replicated_gb": "DERIVED; non-expert weights assumed BF16 (UNVERIFIED)",
            "native_max_model_len": "TRT-GUIDE ('1M for MXFP8'), 3P-CALC",
        },
    ),
    Variant.MXFP4: ModelVariant(
        name=Variant.MXFP4,
        checkpoint="amd/MiniMax-M3-MXFP4",
        # Routed experts at 4.25 bits (4-bit values + one 8-bit scale per 32), the rest BF16.
        weights_gb=ROUTED_PARAMS_B * 4.25 / 8 + REPLICATED_GB_BF16,
        replicated_gb=REPLICATED_GB_BF16,
        vision_encoder_gb=VISION_ENCODER_PARAMS_B * 2,
        native_max_model_len=524_288,
        native_context_verified=False,
        kv_scales_calibrated=False,
        sources={
            "weights_gb": "DERIVED (OCP MXFP4 experts, BF16 rest); VLLM-RCP says 'roughly half of MXFP8'",
            "native_max_model_len": "UNVERIFIED: assumed equal to the BF16 checkpoint it was quantized from",
            "kv_scales_calibrated": "VLLM-RCP ('ships no calibrated KV scales')",
        },
    ),
}

KV_LAYOUT: Final = KvLayout()


# --- accelerators ---------------------------------------------------------------------------

Vendor = Literal["nvidia", "amd"]


@dataclass(frozen=True)
class AcceleratorFacts:
    name: Accelerator
    vendor: Vendor
    memory_gib: float  # usable, as nvidia-smi / amd-smi report it (less than the marketing figure)
    gpus_per_node: int
    arch: Literal["amd64", "arm64"]
    resource_name: str
    # Node labels the pool's nodes carry, each with every value known to appear for this product (the
    # device plugins' spellings differ by version); one value renders a nodeSelector, several a node
    # affinity `In` term.
    node_labels: dict[str, tuple[str, ...]]
    sources: dict[str, str] = field(default_factory=dict)


ACCELERATORS: Final[dict[Accelerator, AcceleratorFacts]] = {
    Accelerator.H200: AcceleratorFacts(
        name=Accelerator.H200,
        vendor="nvidia",
        memory_gib=140.0,  # 141 GB HBM3e; nvidia-smi reports 143771 MiB
        gpus_per_node=8,
        arch="amd64",
        resource_name="nvidia.com/gpu",
        node_labels={"nvidia.com/gpu.product": ("NVIDIA-H200",)},
        sources={
            "memory_gib": "aiwiki H200 (141 GB); reported MiB UNVERIFIED",
            "node_labels": "NVIDIA GPU feature discovery: gpu.product is the nvidia-smi product name with spaces "
            "as dashes ('NVIDIA H200' -> NVIDIA-H200); override with nodePool.nodeSelector",
        },
    ),
    Accelerator.GB200: AcceleratorFacts(
        name=Accelerator.GB200,
        vendor="nvidia",
        memory_gib=184.0,  # 186 GB per GPU (NVL72: ~13.4 TB / 72)
        gpus_per_node=4,
        arch="arm64",
        resource_name="nvidia.com/gpu",
        node_labels={"nvidia.com/gpu.product": ("NVIDIA-GB200",), "kubernetes.io/arch": ("arm64",)},
        sources={
            "node_labels": "NVIDIA GPU feature discovery ('NVIDIA GB200' -> NVIDIA-GB200); Grace trays are arm64",
            "memory_gib": "aiwiki GB200 NVL72 (186 GB); reported MiB UNVERIFIED",
            "gpus_per_node": "TRT-GUIDE",
        },
    ),
    Accelerator.MI355X: AcceleratorFacts(
        name=Accelerator.MI355X,
        vendor="amd",
        memory_gib=288.0,  # 288 GB HBM3E, gfx950
        gpus_per_node=8,
        arch="amd64",
        resource_name="amd.com/gpu",
        # The AMD node labeller publishes the marketing name with underscores; live MI355X nodes show the
        # OAM form AMD_Instinct_MI355_OAM, and AMD_Instinct_MI355X(_OAM) appear for other firmware/labeller
        # versions (MI300X nodes likewise show AMD_Instinct_MI300X_OAM).
        node_labels={
            "amd.com/gpu.product-name": ("AMD_Instinct_MI355_OAM", "AMD_Instinct_MI355X", "AMD_Instinct_MI355X_OAM")
        },
        sources={
            "memory_gib": "rocm.docs.amd.com gpu-specs (288 GB); reported value UNVERIFIED",
            "node_labels": "AMD-DP (ROCm/k8s-device-plugin docs/advanced/node-labelling.md) and live MI355X nodes; "
            "override with nodePool.nodeSelector",
        },
    ),
}


# --- engines --------------------------------------------------------------------------------

MemoryModel = Literal["total", "static", "free_after_weights"]


@dataclass(frozen=True)
class EngineFacts:
    name: EngineName
    version: str
    support: dict[Accelerator, tuple[Variant, ...]]
    images: dict[Accelerator, str]
    memory_fraction: dict[Accelerator, float]
    # How the fraction is applied: vLLM's --gpu-memory-utilization caps weights + activations + KV
    # ("total"); SGLang's --mem-fraction-static caps weights + KV pool ("static"); TensorRT-LLM's
    # kv_cache_config.free_gpu_memory_fraction is a share of what is free after loading ("free_after_weights").
    memory_model: MemoryModel
    activation_reserve_gib: float  # non-KV working memory the fraction must also hold (UNVERIFIED estimate)
    reasoning_parser: str
    tool_parser: str
    port: int
    metrics_path: str
    ready_path: str
    live_path: str
    sources: dict[str, str] = field(default_factory=dict)


ALL_VARIANTS = (Variant.BF16, Variant.MXFP8, Variant.MXFP4)

ENGINES: Final[dict[EngineName, EngineFacts]] = {
    EngineName.VLLM: EngineFacts(
        name=EngineName.VLLM,
        version=VLLM_VERSION,
        support={
            Accelerator.H200: (Variant.BF16, Variant.MXFP8),
            Accelerator.GB200: (Variant.BF16, Variant.MXFP8),
            Accelerator.MI355X: ALL_VARIANTS,
        },
        images={
            Accelerator.H200: f"vllm/vllm-openai:v{VLLM_VERSION}",
            Accelerator.GB200: f"vllm/vllm-openai:v{VLLM_VERSION}",
            Accelerator.MI355X: f"vllm/vllm-openai-rocm:v{VLLM_VERSION}",
        },
        memory_fraction={a: 0.9 for a in Accelerator},
        memory_model="total",
        activation_reserve_gib=4.0,
        reasoning_parser="minimax_m3",
        tool_parser="minimax_m3",
        port=8000,
        metrics_path="/metrics",
        ready_path="/v1/models",
        live_path="/health",
        sources={
            "support": "VLLM-RCP (NVIDIA Hopper/Blackwell; AMD CDNA4 incl. MXFP4)",
            "images": "ENGINE-ARGPARSE: 0.33.0 has the M3 model classes and minimax_m3 parsers",
            "memory_fraction": "vLLM default gpu_memory_utilization 0.9",
            "activation_reserve_gib": "m3-facts §1.3 ('about 4 GiB of non-KV overhead', UNVERIFIED)",
            "parsers": "VLLM-RCP, ENGINE-ARGPARSE (underscore form registered)",
        },
    ),
    EngineName.SGLANG: EngineFacts(
        name=EngineName.SGLANG,
        version=SGLANG_VERSION,
        support={
            # MXFP8 MoE kernels in SGLang are Blackwell/gfx950-only (SGL-CFG).
            Accelerator.H200: (Variant.BF16,),
            Accelerator.GB200: (Variant.BF16, Variant.MXFP8),
            Accelerator.MI355X: (Variant.BF16, Variant.MXFP8),
        },
        images={
            Accelerator.H200: f"lmsysorg/sglang:v{SGLANG_VERSION}-cu129",
            Accelerator.GB200: f"lmsysorg/sglang:v{SGLANG_VERSION}-cu130",
            Accelerator.MI355X: f"lmsysorg/sglang:v{SGLANG_VERSION}-rocm720-mi35x",
        },
        memory_fraction={Accelerator.H200: 0.75, Accelerator.GB200: 0.75, Accelerator.MI355X: 0.80},
        memory_model="static",
        activation_reserve_gib=0.0,  # outside the static fraction
        reasoning_parser="minimax-m3",
        tool_parser="minimax-m3",
        port=30000,
        metrics_path="/metrics",
        ready_path="/health_generate",
        live_path="/health",
        sources={
            "support": "SGL-CFG (H200 BF16; GB200 MXFP8; MI355X MXFP8)",
            "images": "SGL-CFG tag families (cu12 H200, cu13 multi-arch GB200, rocm720-mi35x); tags UNVERIFIED",
            "memory_fraction": "SGL-CFG (0.75 H200/GB200, 0.80 MI355X)",
            "parsers": "ENGINE-ARGPARSE (dash form registered; underscore rejected)",
        },
    ),
    EngineName.TRTLLM: EngineFacts(
        name=EngineName.TRTLLM,
        version=TRTLLM_VERSION,
        support={Accelerator.H200: (Variant.BF16,), Accelerator.GB200: (Variant.BF16,)},
        images={
            Accelerator.H200: f"nvcr.io/nvidia/tensorrt-llm/release:{TRTLLM_VERSION}",
            Accelerator.GB200: f"nvcr.io/nvidia/tensorrt-llm/release:{TRTLLM_VERSION}",
        },
        memory_fraction={Accelerator.H200: 0.7, Accelerator.GB200: 0.7},
        memory_model="free_after_weights",
        activation_reserve_gib=4.0,
        reasoning_parser="minimax_m3",
        tool_parser="minimax_m3",
        port=8000,
        metrics_path="/prometheus/metrics",
        ready_path="/health",
        live_path="/health",
        sources={
            "support": "TRT-GUIDE ('served in BF16; no FP8/NVFP4 serving path')",
            "images": "TRT-GUIDE (nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc20)",
            "memory_fraction": "TRT-YAML (kv_cache_config.free_gpu_memory_fraction 0.7)",
        },
    ),
}


# --- published recipe shapes and floors -----------------------------------------------------


@dataclass(frozen=True)
class Shape:
    engine: EngineName
    accelerator: Accelerator
    variant: Variant
    strategy: Strategy
    tensor_parallel_size: int
    data_parallel_size: int
    nodes: int
    source: str


def _s(
    engine: EngineName,
    acc: Accelerator,
    variant: Variant,
    strategy: Strategy,
    tp: int,
    dp: int,
    nodes: int,
    src: str,
) -> Shape:
    return Shape(engine, acc, variant, strategy, tp, dp, nodes, src)


V, S, T = EngineName.VLLM, EngineName.SGLANG, EngineName.TRTLLM
H, G, M = Accelerator.H200, Accelerator.GB200, Accelerator.MI355X
TP, TPEP, DPEP = Strategy.TP, Strategy.TP_EP, Strategy.DP_EP

VALIDATED_SHAPES: Final[tuple[Shape, ...]] = (
    _s(V, H, Variant.BF16, TP, 8, 1, 1, "VLLM-RCP NVIDIA TP8"),
    _s(V, H, Variant.BF16, TPEP, 8, 1, 1, "VLLM-RCP NVIDIA TP8 + Expert Parallel"),
    _s(V, H, Variant.BF16, DPEP, 1, 8, 1, "VLLM-RCP NVIDIA DP8 + Expert Parallel"),
    _s(V, H, Variant.MXFP8, TP, 8, 1, 1, "VLLM-RCP MXFP8 TP8"),
    _s(V, M, Variant.BF16, TP, 8, 1, 1, "VLLM-RCP AMD TP8"),
    _s(V, M, Variant.BF16, TPEP, 8, 1, 1, "VLLM-RCP AMD TP8 + Expert Parallel"),
    _s(V, M, Variant.BF16, DPEP, 1, 8, 1, "VLLM-RCP AMD DP8 + Expert Parallel"),
    _s(V, M, Variant.MXFP8, TP, 4, 1, 1, "VLLM-RCP ('the MXFP8 variant runs from TP=4' on gfx950)"),
    _s(V, M, Variant.MXFP8, TP, 8, 1, 1, "VLLM-RCP ('use TP=8 for lower latency or long context')"),
    _s(V, M, Variant.MXFP4, TP, 4, 1, 1, "VLLM-RCP MXFP4 AITER MoE TP4"),
    _s(V, M, Variant.MXFP4, TP, 8, 1, 1, "VLLM-RCP MXFP4 emulation MoE TP8"),
    _s(S, H, Variant.BF16, TP, 8, 1, 1, "SGL-CFG H200 BF16 --tp 8"),
    _s(S, M, Variant.MXFP8, TP, 8, 1, 1, "SGL-CFG MI355X MXFP8 --tp 8"),
    _s(S, M, Variant.MXFP8, TPEP, 8, 1, 1, "NV-BLOG SGLang 8-GPU --tp-size 8 --ep-size 8 (MXFP8)"),
    _s(S, G, Variant.MXFP8, TP, 4, 1, 1, "SGL-CFG GB200 MXFP8 --tp 4 (inferred, not benchmarked)"),
    _s(T, G, Variant.BF16, TPEP, 8, 1, 2, "TRT-GUIDE 2x4 GB200 TEP"),
    _s(T, G, Variant.BF16, DPEP, 1, 8, 2, "TRT-GUIDE 2x4 GB200 DEP (enable_attention_dp)"),
)


@dataclass(frozen=True)
class Floor:
    """The smallest layout a recipe states, which the planner never goes below."""

    accelerator: Accelerator
    variant: Variant
    min_gpus: int
    reason: str
    engine: EngineName | None = None  # None: every engine


FLOORS: Final[tuple[Floor, ...]] = (
    Floor(M, Variant.BF16, 8, "BF16 on MI355X needs TP=8 (VLLM-RCP prerequisites)"),
    Floor(M, Variant.MXFP8, 4, "MXFP8 on MI355X runs from TP=4 (VLLM-RCP)"),
    Floor(M, Variant.MXFP4, 4, "MXFP4 on MI355X runs from TP=4 (VLLM-RCP)"),
    Floor(G, Variant.BF16, 8, "TensorRT-LLM serves M3 on GB200 as 8 ranks over 2 nodes (TRT-GUIDE)", T),
)

PARALLEL_CANDIDATES: Final = (1, 2, 4, 8, 16, 32)

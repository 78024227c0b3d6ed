"""Everything m3fleet knows about MiniMax-M3, the GPU pools and the engines — as data, in one place.

Each number carries the source it came from: a tag defined in `SOURCES`, each a public repository
and path at a version, or a public page. "UNVERIFIED" marks a number nobody has checked on real hardware
or the pinned image; the planner repeats those caveats in the plan's notes where they matter.
Change a number here and the planner, renderers and tests follow.

About 840 lines on purpose: each number sits beside the SOURCES tag it cites, which a split by topic would separate;
the newer topics (gateway, speculative decoding, throughput, engine metrics) already live in their own modules. The
next seam, now that eleven pools are listed, is the pools' table (memory, labels, interconnect, their SOURCES tags)
into catalog/pools.py, left for a change of its own.
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
    "NV-BLOG": "NVIDIA Technical Blog, 'Deploy Long-Context Reasoning and Agentic Workflows with MiniMax M3 on "
    "NVIDIA Accelerated Infrastructure' (developer.nvidia.com/blog)",
    "LWS-API": "kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go",
    "LWS-WEBHOOK": "kubernetes-sigs/lws v0.9.0 pkg/webhooks/pod_webhook.go (group-key label, exclusive affinities)",
    "DYN-TRT": "ai-dynamo/dynamo deploy/operator/internal/dynamo/backend_trtllm.go (multi-node TRT-LLM, mpirun/SSH)",
    "GFD": "NVIDIA/k8s-device-plugin docs/gpu-feature-discovery/README.md",
    "DRA": "NVIDIA/k8s-dra-driver-gpu api/nvidia.com/resource/v1beta1/computedomain.go",
    "AMD-DP": "ROCm/k8s-device-plugin docs/advanced/node-labelling.md",
    "3P-CALC": "third-party KV-calculator dataset quoting MiniMaxAI/MiniMax-M3 config.json",
    "ENGINE-ARGPARSE": "the pinned vllm and sglang wheels' own argument parsers, run on CPU by tests/engine_parsers "
    "(venvs built by .ci/engine-envs.sh)",
    "VLLM-SRC": "vllm 0.33.0 wheel: vllm/models/minimax_m3/{nvidia,amd}/model.py, common/mm_preprocess.py, "
    "config/cache.py",
    "SGL-SRC": "sglang 0.5.23 wheel: srt/models/minimax_m3{,_vl}.py, srt/arg_groups/model_overrides/minimax_m3.py, "
    "srt/utils/hf_transformers/{config,common}.py, srt/arg_groups/fields/{parallel,disagg}.py",
    "VLLM-NVFP4": "vllm 0.33.0 wheel: model_executor/layers/quantization/modelopt.py (ModelOptNvFp4Config: "
    "modelopt_fp4 chosen from the checkpoint's hf_quant_config.json, group_size 16, get_min_capability 75), "
    "fused_moe/oracle/nvfp4.py (select_nvfp4_moe_backend: FlashInfer/CUTLASS FP4 kernels, then MARLIN), "
    "fused_moe/experts/marlin_moe.py (Marlin: CUDA only, compute capability >= 7.5), utils/torch_utils.py "
    "(resolve_kv_cache_dtype_string: kv dtype 'auto' takes the checkpoint's kv_cache_quant_algo)",
    "SGL-NVFP4": "sglang 0.5.23 wheel: srt/arg_groups/model_overrides/minimax_m3.py (_resolve_quant_method: the M3 "
    "NVFP4 path minimax_m3_nvfp4 is chosen only for a checkpoint declaring mxfp8 with moe_quant_algo NVFP4 and "
    "moe_quant_format nvfp4-pack-quantized, the M3.1 mixed checkpoint)",
    "MODELOPT-NVFP4": "vllm 0.33.0 wheel: model_executor/layers/quantization/modelopt.py ModelOptNvFp4FusedMoE "
    "(two FP4 values per uint8, one float8_e4m3fn weight_scale per group_size 16, one per-tensor weight_scale_2); "
    "the same layout in NVIDIA NeMo AutoModel's nvfp4 docs (docs.nvidia.com/nemo/automodel)",
    "3P-NVFP4": "third-party M3 NVFP4 quantization huggingface.co/Mapika/MiniMax-M3-NVFP4 (model card): routed and "
    "shared experts NVFP4 group 16, attention/indexer/router/embeddings/lm_head/vision tower BF16, ~256 GB on disk",
    "INFX": "SemiAnalysisAI/InferenceX PRs #1724, #1733 (B300) and #1741 (B200): the vLLM recipe's MiniMax-M3 MXFP8 "
    "shapes TP8, TP4 and TP8+EP8 on one 8-GPU HGX node",
    "SGL-CFG-POOLS": "sgl-project/sglang docs_new/src/snippets/configs/MiniMaxAI/minimax-m3.jsx (cells for gb300, "
    "mi300x, mi325x, mi350x: GB300 MXFP8 --tp 4 verified; MI300X MXFP8 --tp 8 verified, MXFP8 converted to block-fp8 "
    "[128,128] at load on gfx942 with --attention-backend aiter --moe-runner-backend triton --watchdog-timeout 3600 "
    "--skip-server-warmup; MI325X and MI350X 'inferred-supported' from their same-arch siblings; images rocm700-mi30x "
    "for gfx942, rocm720-mi35x for gfx950)",
    "AMD-SPECS": "ROCm/ROCm docs/reference/gpu-specs.rst (rocm.docs.amd.com; VRAM GiB and LLVM target: MI300X 192 "
    "gfx942, MI325X 256 gfx942, MI350X 288 gfx950, MI355X 288 gfx950)",
    "DEVICE-NAMES": "vllm 0.33.0 wheel: model_executor/layers/fused_moe/configs/ file names (device_name= the GPU's "
    "product name as torch and nvidia-smi/amd-smi report it: NVIDIA_H100_80GB_HBM3, NVIDIA_H20, NVIDIA_H20-3e, "
    "AMD_Instinct_MI300X, AMD_Instinct_MI325X, AMD_Instinct_MI325_OAM, AMD_Instinct_MI350X, AMD_Instinct_MI350_OAM) "
    "and platforms/rocm.py _ROCM_DEVICE_ID_NAME_MAP",
    "NV-GB300-RA": "docs.nvidia.com enterprise-reference-architectures nvl72-ai-factory components (GB300 NVL72: 18 "
    "compute trays of 4 Blackwell Ultra GPUs and 2 Grace CPUs, one NVLink domain of 72 GPUs); verda.com blog "
    "gb300-nvl72-architecture (GB300: 279 GB HBM3E per GPU)",
    "H100-H20": "third-party spec pages: willitrunai.com gpus/h20-96gb (H20: Hopper, 96 GB HBM3, 4.0 TB/s, 148 TFLOPS "
    "FP16), apetops-us.com (H20 in 96 GB and 141 GB versions); H100 SXM 80 GB HBM3 as DEVICE-NAMES' 'NVIDIA H100 80GB "
    "HBM3'. The vLLM recipe's '8x H200 / H20' at 1128 GB is the 141 GB H20",
    "DERIVED": "computed in this file from the sourced numbers above it",
}

GB: Final = 1e9
GIB: Final = float(1 << 30)


# --- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KvLayout:
    """What one token costs in the KV cache (vLLM's layout for M3: VLLM-SPA, VLLM-IDX)."""

    layers: int = 60  # every layer keeps full paged K/V; MSA selects blocks, it does not shrink the cache
    kv_heads: int = 4  # GQA, head_dim 128
    head_dim: int = 128
    dense_layers: int = 3  # layers 0..2: dense attention and a dense MLP (no index cache, no experts)
    index_layers: int = 57  # MSA sparse layers 3..59 add one index-K vector per token; each is also a MoE layer
    index_dim: int = 128  # not sharded by TP; BF16 by default even with fp8 KV
    index_dtype_bytes: int = 2
    block_size: int = 128  # MSA's sparse block size; vLLM's --block-size must equal it (VLLM-RCP troubleshooting)
    sources: tuple[str, ...] = ("HF-CFG", "3P-CALC", "VLLM-IDX", "VLLM-SPA", "VLLM-RCP")


TOTAL_PARAMS_B: Final = 427.04  # VLLM-RCP
ACTIVE_PARAMS_B: Final = 26.0  # VLLM-RCP ("about 26B active")
ROUTED_EXPERTS, EXPERTS_PER_TOKEN = 128, 4  # HF-CFG
# Active = replicated + routed * 4/128, total = replicated + routed  =>  routed = 413.98B, replicated = 13.06B.
ROUTED_PARAMS_B: Final = (TOTAL_PARAMS_B - ACTIVE_PARAMS_B) / (1 - EXPERTS_PER_TOKEN / ROUTED_EXPERTS)
REPLICATED_PARAMS_B: Final = TOTAL_PARAMS_B - ROUTED_PARAMS_B
VISION_ENCODER_PARAMS_B: Final = 0.6  # NV-BLOG table: "vision encoder parameters 0.6B"
# Non-expert weights stay BF16 in the MX checkpoints (UNVERIFIED for MXFP4: assumed like MXFP8).
REPLICATED_GB_BF16: Final = REPLICATED_PARAMS_B * 2


@dataclass(frozen=True, kw_only=True)
class ModelVariant:
    name: Variant
    checkpoint: str
    weights_gb: float  # whole checkpoint, decimal GB
    native_max_model_len: int
    native_context_verified: bool
    kv_scales_calibrated: bool  # without calibrated scales fp8 KV is never chosen automatically
    # Attention, dense layers, shared experts, embeddings, vision encoder: BF16 in every variant (UNVERIFIED for
    # the quantized ones; each says so in its sources).
    replicated_gb: float = REPLICATED_GB_BF16
    vision_encoder_gb: float = VISION_ENCODER_PARAMS_B * 2
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def routed_experts_gb(self) -> float:
        return self.weights_gb - self.replicated_gb


# NVFP4 (MODELOPT-NVFP4): 4-bit values plus one 8-bit FP8 scale per 16 => 4.5 bits per weight (the per-tensor
# fp32 scale is negligible).
NVFP4_BITS_PER_WEIGHT: Final = 4 + 8 / 16

VARIANTS: Final[dict[Variant, ModelVariant]] = {
    Variant.BF16: ModelVariant(
        name=Variant.BF16,
        checkpoint="MiniMaxAI/MiniMax-M3",
        weights_gb=TOTAL_PARAMS_B * 2,  # 854.08 GB
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
        native_max_model_len=524_288,
        native_context_verified=False,
        kv_scales_calibrated=False,
        sources={
            "weights_gb": "DERIVED (OCP MXFP4 experts, BF16 rest); VLLM-RCP says 'roughly half of MXFP8'",
            "native_max_model_len": "UNVERIFIED: assumed equal to the BF16 checkpoint it was quantized from",
            "kv_scales_calibrated": "VLLM-RCP ('ships no calibrated KV scales')",
        },
    ),
    Variant.NVFP4: ModelVariant(
        name=Variant.NVFP4,
        checkpoint="nvidia/MiniMax-M3-NVFP4",
        # Routed experts in NVFP4, everything else BF16 (as 3P-NVFP4's experts-only recipe; the nvidia checkpoint's
        # hf_quant_config.json is not in our sources, so which modules it excludes is UNVERIFIED). Shared experts are
        # counted at BF16 with the replicated weights: an upper bound if the checkpoint quantizes them too.
        weights_gb=ROUTED_PARAMS_B * NVFP4_BITS_PER_WEIGHT / 8 + REPLICATED_GB_BF16,  # about 259 GB
        native_max_model_len=524_288,
        native_context_verified=False,
        kv_scales_calibrated=False,
        sources={
            "weights_gb": "DERIVED: 413.98B routed params x 4.5 bits (MODELOPT-NVFP4) + 13.06B BF16; UNVERIFIED for "
            "nvidia/MiniMax-M3-NVFP4 (no published size); 3P-NVFP4's experts-only NVFP4 of the same model is ~256 GB",
            "replicated_gb": "DERIVED; attention, indexer, router, embeddings and vision tower BF16 as in 3P-NVFP4",
            "native_max_model_len": "UNVERIFIED: assumed equal to the BF16 checkpoint it was quantized from",
            "kv_scales_calibrated": "UNVERIFIED: no published kv_cache_quant_algo for the checkpoint; m3fleet "
            "renders the KV dtype explicitly so vLLM's 'auto' cannot pick one the plan did not count (VLLM-NVFP4)",
        },
    ),
}

KV_LAYOUT: Final = KvLayout()


@dataclass(frozen=True)
class Rope:
    """The text decoder's RoPE block (HF-CFG `text_config`). A YaRN override must carry all of it: SGLang
    0.5.23 merges `--json-model-override-args` into `text_config` attribute by attribute, and transformers 5's
    `rope_scaling` setter then replaces `rope_parameters` whole, so a YaRN dict without `rope_theta` makes
    SGLang fall back to theta 10,000 (`get_rope_config`, SGL-SRC)."""

    theta: float = 5_000_000  # HF-CFG default_theta; vLLM's MiniMaxM3TextConfig default (VLLM-SRC)
    partial_rotary_factor: float = 0.5  # rotary_dim 64 of head_dim 128
    sources: tuple[str, ...] = ("HF-CFG", "VLLM-SRC", "SGL-SRC")


ROPE: Final = Rope()

# vLLM profiles the vision encoder with the largest video M3's processor accepts: 500 frames at the per-frame
# pixel cap, "the true worst-case ~192,000 vision tokens" (VLLM-SRC common/mm_preprocess.py
# _MAX_FRAMES_PER_VIDEO), and sizes its encoder cache to it. The cache holds those embeddings at the text
# hidden size (6144, BF16) on every rank: reserved from the KV budget, so --skip-mm-profiling is never needed.
MAX_VISION_TOKENS_PER_ITEM: Final = 192_000
TEXT_HIDDEN_SIZE: Final = 6144  # HF-CFG


# --- accelerators ---------------------------------------------------------------------------

Vendor = Literal["nvidia", "amd"]


@dataclass(frozen=True)
class AcceleratorFacts:
    name: Accelerator
    vendor: Vendor
    memory_gib: float  # usable, as nvidia-smi / amd-smi report it (less than the marketing figure)
    gpus_per_node: int
    resource_name: str
    # Node labels the pool's nodes carry, each with every value known to appear for this product (the
    # device plugins' spellings differ by version); one value renders a nodeSelector, several a node
    # affinity `In` term.
    node_labels: dict[str, tuple[str, ...]]
    # Host CPU and memory an engine pod requests per GPU it holds (so a 4-GPU pod asks for half a node's
    # share). Sized to fit the smallest common node of the pool with room for daemonsets, and large enough
    # for the engine's host side: tokenizer/detokenizer/scheduler processes, pinned staging buffers, the
    # multimodal processor cache and the memory-backed /dev/shm. Override with spec.nodePool.resources.
    cpu_per_gpu: int
    memory_gib_per_gpu: int
    # One NVLink domain spans several nodes (GB200 NVL72 through IMEX): tensor parallelism may cross
    # nodes at NVLink speed. Elsewhere nodes talk over the network, so multi-node replicas prefer
    # pipeline parallelism across nodes (VLLM-PAR).
    nvlink_spans_nodes: bool = False
    # Node label whose value names one NVLink domain; every pod of a multi-node group must share it.
    nvlink_domain_label: str | None = None
    blackwell: bool = False  # SM100-class NVIDIA GPU: the engines' Blackwell kernels and flags apply
    # AMD's LLVM target (AMD-SPECS): gfx950 (CDNA4) has MX matrix cores, gfx942 (CDNA3) does not, and SGLang's M3
    # path needs other attention and MoE backends there (SGL-CFG-POOLS).
    gfx_target: Literal["gfx942", "gfx950"] | None = None
    sources: dict[str, str] = field(default_factory=dict)


# The memory-backed /dev/shm every engine pod mounts (vLLM/SGLang pass tensors between local ranks through it):
# 32Gi as in the AMD verified run (VLLM-RCP-AMD; the LWS vLLM example uses 15Gi, the recipe's docker run 16g).
# A memory-backed emptyDir counts against the pod's memory limit.
POD_SHM_GIB: Final = 32


# Resource names that bring an RDMA NIC into the pod (device plugins for InfiniBand/RoCE, AWS EFA); a
# multi-node replica without one sends its inter-node traffic over TCP through the pod network.
RDMA_RESOURCE_MARKERS: Final = ("rdma", "infiniband", "/ib", "hca", "roce", "efa")


def _hgx(
    name: Accelerator, memory_gib: float, sources: dict[str, str], *, product: str = "", blackwell: bool = False
) -> AcceleratorFacts:
    """An HGX pool: 8 GPUs on NVSwitch in one x86_64 node; nodes talk over the network (no NVLink between them). Host
    CPU and memory per GPU as H200's (HGX hosts have 2 x 56+ cores and 2 TB or more). GFD's product label is the
    product name with dashes: NVIDIA-<NAME> unless `product` says otherwise."""
    return AcceleratorFacts(
        name=name,
        vendor="nvidia",
        memory_gib=memory_gib,
        gpus_per_node=8,
        resource_name="nvidia.com/gpu",
        node_labels={
            "nvidia.com/gpu.product": (product or f"NVIDIA-{name.value.upper()}",),
            "kubernetes.io/arch": ("amd64",),
        },
        cpu_per_gpu=8,
        memory_gib_per_gpu=64,
        blackwell=blackwell,
        sources={**sources, "cpu_per_gpu": "as H200: 64 CPU / 512 GiB per 8-GPU pod; a sizing choice, UNVERIFIED"},
    )


def _grace_tray(name: Accelerator, memory_gib: float, sources: dict[str, str]) -> AcceleratorFacts:
    """A Grace Blackwell NVL72 compute tray: 4 GPUs and 2 Grace CPUs (arm64); NVLink spans the rack's trays, and GFD's
    clique label names each NVLink domain."""
    return AcceleratorFacts(
        name=name,
        vendor="nvidia",
        memory_gib=memory_gib,
        gpus_per_node=4,
        resource_name="nvidia.com/gpu",
        node_labels={"nvidia.com/gpu.product": (f"NVIDIA-{name.value.upper()}",), "kubernetes.io/arch": ("arm64",)},
        cpu_per_gpu=16,
        memory_gib_per_gpu=128,
        nvlink_spans_nodes=True,
        nvlink_domain_label="nvidia.com/gpu.clique",
        blackwell=True,
        sources=sources,
    )


HOPPER_LABEL_SOURCE: Final = (
    "nvidia.com/gpu.product: GFD's product name with dashes from the name DEVICE-NAMES records (UNVERIFIED on live "
    "nodes: set nodePool.nodeSelector to what your nodes show); HGX hosts are x86_64"
)


def _instinct(
    name: Accelerator, memory_gib: float, gfx: Literal["gfx942", "gfx950"], products: tuple[str, ...]
) -> AcceleratorFacts:
    """An 8-GPU AMD Instinct OAM node (x86_64 EPYC host, Infinity Fabric between the GPUs of a node, the network
    between nodes); host CPU and memory per GPU as MI355X's."""
    return AcceleratorFacts(
        name=name,
        vendor="amd",
        memory_gib=memory_gib,
        gpus_per_node=8,
        resource_name="amd.com/gpu",
        node_labels={"amd.com/gpu.product-name": products, "kubernetes.io/arch": ("amd64",)},
        cpu_per_gpu=8,
        memory_gib_per_gpu=64,
        gfx_target=gfx,
        sources={
            "memory_gib": "AMD-SPECS (VRAM GiB); what amd-smi reports is UNVERIFIED",
            "node_labels": "amd.com/gpu.product-name: AMD-DP publishes the product name with underscores; the "
            "spellings are the names DEVICE-NAMES records for this GPU (marketing and OAM forms), UNVERIFIED on live "
            "nodes: set nodePool.nodeSelector to what your nodes show",
            "gfx_target": "AMD-SPECS",
            "cpu_per_gpu": "as MI355X: 64 CPU / 512 GiB per 8-GPU pod; a sizing choice, UNVERIFIED",
        },
    )


ACCELERATORS: Final[dict[Accelerator, AcceleratorFacts]] = {
    Accelerator.H200: AcceleratorFacts(
        name=Accelerator.H200,
        vendor="nvidia",
        memory_gib=140.0,  # 141 GB HBM3e; nvidia-smi reports 143771 MiB
        gpus_per_node=8,
        resource_name="nvidia.com/gpu",
        node_labels={"nvidia.com/gpu.product": ("NVIDIA-H200",), "kubernetes.io/arch": ("amd64",)},
        cpu_per_gpu=8,
        memory_gib_per_gpu=64,
        sources={
            "memory_gib": "aiwiki H200 (141 GB); reported MiB UNVERIFIED",
            "node_labels": "nvidia.com/gpu.product: GFD (NVIDIA/k8s-device-plugin "
            "docs/gpu-feature-discovery/README.md) publishes the nvidia-smi product name with spaces as dashes "
            "('NVIDIA H200' -> NVIDIA-H200; the H200 string is UNVERIFIED); kubernetes.io/arch: "
            "the kubelet's well-known label (HGX H200 hosts are x86_64). Override with nodePool.nodeSelector",
            "cpu_per_gpu": "64 CPU / 512 GiB per 8-GPU pod fits the smallest common HGX H200 host (Azure ND H200 "
            "v5: 96 vCPU, 1850 GiB; AWS p5en and DGX H200 are larger); a sizing choice, UNVERIFIED per provider",
        },
    ),
    Accelerator.GB200: _grace_tray(
        Accelerator.GB200,
        184.0,  # 186 GB per GPU (NVL72: ~13.4 TB / 72)
        {
            "node_labels": "nvidia.com/gpu.product: GFD ('NVIDIA GB200' -> NVIDIA-GB200, seen in several "
            "manifests); kubernetes.io/arch: the kubelet's well-known label (Grace compute trays are arm64)",
            "nvlink_domain_label": "GFD nvidia.com/gpu.clique = <GPU fabric ClusterUUID>.<CliqueID>: nodes with "
            "equal values share one NVLink domain (GFD; pinning pods to one clique: CoreWeave IMEX docs)",
            "cpu_per_gpu": "64 CPU / 512 GiB per 4-GPU pod out of a compute tray's 2 x 72 Grace cores and "
            "2 x 480 GB LPDDR5X; a sizing choice, UNVERIFIED per provider",
            "memory_gib": "aiwiki GB200 NVL72 (186 GB); reported MiB UNVERIFIED",
            "gpus_per_node": "TRT-GUIDE",
        },
    ),
    Accelerator.B200: _hgx(
        Accelerator.B200,
        178.0,  # 179 GB as nvidia-smi reports it on an HGX B200
        {
            "memory_gib": "docs.vultr.com inference-cookbook hardware-overview (HGX B200: 179 GB HBM3e, sm_100, 8 GPUs "
            "on NVSwitch 5.0, verified with nvidia-smi); one GiB kept as margin",
            "node_labels": "nvidia.com/gpu.product: GFD's product name with dashes ('NVIDIA B200' -> NVIDIA-B200; the "
            "string is UNVERIFIED on live nodes); HGX hosts are x86_64. Override with nodePool.nodeSelector",
        },
        blackwell=True,
    ),
    Accelerator.B300: _hgx(
        Accelerator.B300,
        268.0,  # 288 GB HBM3e = 268 GiB; what nvidia-smi reports is UNVERIFIED
        {
            "memory_gib": "glennklockwood.com garden/processors/B300 (288 GB HBM3e, 8 stacks 12-high); acecloud.ai "
            "HGX B300 (8 GPUs, 288 GB each, 2.3 TB a node)",
            "node_labels": "nvidia.com/gpu.product: GFD's product name with dashes (the B300 string, which may carry "
            "a form-factor suffix, is UNVERIFIED: set nodePool.nodeSelector to what your nodes show); x86_64 hosts",
        },
        blackwell=True,
    ),
    # 288 GB HBM3e marketed; one provider lists 279 GB per GPU. The lower figure, read as decimal GB (259.8 GiB), is
    # planned: what nvidia-smi reports on a GB300 is UNVERIFIED.
    Accelerator.GB300: _grace_tray(
        Accelerator.GB300,
        259.0,
        {
            "memory_gib": "NV-GB300-RA (279 GB a GPU; 288 GB HBM3e marketed); reported MiB UNVERIFIED",
            "gpus_per_node": "NV-GB300-RA (a compute tray: 4 GPUs, 2 Grace CPUs)",
            "node_labels": "nvidia.com/gpu.product: GFD's product name with dashes ('NVIDIA GB300' -> NVIDIA-GB300, "
            "UNVERIFIED on live nodes: set nodePool.nodeSelector to what your nodes show); kubernetes.io/arch: Grace "
            "compute trays are arm64",
            "nvlink_domain_label": "GFD nvidia.com/gpu.clique, as GB200 (NV-GB300-RA: one NVLink domain of 72 GPUs)",
            "cpu_per_gpu": "as GB200: 64 CPU / 512 GiB per 4-GPU pod out of a tray's 2 Grace CPUs; UNVERIFIED",
        },
    ),
    Accelerator.H100: _hgx(
        Accelerator.H100,
        79.0,  # 80 GB HBM3; nvidia-smi's 81559 MiB (79.6 GiB) is UNVERIFIED here
        {
            "memory_gib": "H100-H20 (H100 SXM 80 GB HBM3); DEVICE-NAMES 'NVIDIA H100 80GB HBM3'",
            "node_labels": HOPPER_LABEL_SOURCE,
        },
        product="NVIDIA-H100-80GB-HBM3",
    ),
    Accelerator.H20: _hgx(
        Accelerator.H20,
        95.0,  # 96 GB HBM3; nvidia-smi's report UNVERIFIED. The 141 GB H20-3e plans as h200 (docs/pools.md)
        {
            "memory_gib": "H100-H20 (H20 96 GB HBM3); DEVICE-NAMES 'NVIDIA H20' (the 141 GB part is 'NVIDIA H20-3e')",
            "node_labels": HOPPER_LABEL_SOURCE,
        },
    ),
    Accelerator.MI300X: _instinct(
        Accelerator.MI300X, 192.0, "gfx942", ("AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI300X")
    ),
    Accelerator.MI325X: _instinct(
        Accelerator.MI325X,
        256.0,
        "gfx942",
        ("AMD_Instinct_MI325_OAM", "AMD_Instinct_MI325X", "AMD_Instinct_MI325X_OAM"),
    ),
    Accelerator.MI350X: _instinct(
        Accelerator.MI350X,
        288.0,
        "gfx950",
        ("AMD_Instinct_MI350_OAM", "AMD_Instinct_MI350X", "AMD_Instinct_MI350X_OAM"),
    ),
    Accelerator.MI355X: AcceleratorFacts(
        name=Accelerator.MI355X,
        vendor="amd",
        memory_gib=288.0,  # 288 GB HBM3E, gfx950
        gpus_per_node=8,
        resource_name="amd.com/gpu",
        # The AMD node labeller publishes the marketing name with underscores; live MI355X nodes show the
        # OAM form AMD_Instinct_MI355_OAM, and AMD_Instinct_MI355X(_OAM) appear for other firmware/labeller
        # versions (MI300X nodes likewise show AMD_Instinct_MI300X_OAM).
        node_labels={
            "amd.com/gpu.product-name": ("AMD_Instinct_MI355_OAM", "AMD_Instinct_MI355X", "AMD_Instinct_MI355X_OAM"),
            "kubernetes.io/arch": ("amd64",),
        },
        cpu_per_gpu=8,
        memory_gib_per_gpu=64,
        gfx_target="gfx950",
        sources={
            "memory_gib": "rocm.docs.amd.com gpu-specs (288 GB); reported value UNVERIFIED",
            "node_labels": "amd.com/gpu.product-name: AMD-DP (ROCm/k8s-device-plugin "
            "docs/advanced/node-labelling.md) and live MI355X nodes; kubernetes.io/arch: the kubelet's well-known "
            "label (EPYC hosts). Override with nodePool.nodeSelector",
            "cpu_per_gpu": "64 CPU / 512 GiB per 8-GPU pod out of 2 x EPYC 9005 hosts with 1.5 TB or more; a sizing "
            "choice, UNVERIFIED per provider",
        },
    ),
}


# --- engines --------------------------------------------------------------------------------

MemoryModel = Literal["total", "static", "free_after_weights"]
# What spec.model.languageModelOnly does on an engine: the vision tower is never built (its memory goes to the
# KV cache), multimodal requests are refused but the tower is still built and loaded, or nothing honest.
LanguageModelOnly = Literal["skips_encoder", "refuses_media", "unsupported"]


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
    # The engine's M3 model splits its layers into pipeline stages (one stage per node on pools whose nodes
    # talk over the network).
    pipeline_parallel: bool
    # Vendors on which the engine's M3 model applies a YaRN rope_scaling override (serves past the native context).
    yarn_vendors: tuple[Vendor, ...]
    language_model_only: LanguageModelOnly
    # vLLM reserves its multimodal encoder cache (sized by profiling the largest accepted video) out of the
    # memory fraction, next to the activations.
    reserves_encoder_cache: bool = False
    # The engine's name for M3's sparse attention where it must be configured explicitly (no dense fallback).
    sparse_attention_algorithm: str | None = None
    # Where m3fleet departs from the engine's published command on an accelerator, and why: repeated in the plan.
    deviations: dict[Accelerator, tuple[str, ...]] = field(default_factory=dict)
    # Why the engine does not serve a variant, where the reason is known: the planner's refusal says it.
    unserved_variants: dict[Variant, str] = field(default_factory=dict)
    # Why a pool serves fewer variants than the engine does elsewhere: the planner's refusal says it.
    pool_limits: dict[Accelerator, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


ALL_VARIANTS = (Variant.BF16, Variant.MXFP8, Variant.MXFP4)

ENGINES: Final[dict[EngineName, EngineFacts]] = {
    EngineName.VLLM: EngineFacts(
        name=EngineName.VLLM,
        version=VLLM_VERSION,
        support={
            # NVFP4 on Hopper runs through vLLM's Marlin kernels (FP4 weights, BF16 activations: no FP4 tensor
            # cores); on Blackwell through the FlashInfer/CUTLASS FP4 kernels (VLLM-NVFP4).
            Accelerator.H200: (Variant.BF16, Variant.MXFP8, Variant.NVFP4),
            Accelerator.GB200: (Variant.BF16, Variant.MXFP8, Variant.NVFP4),
            Accelerator.B200: (Variant.BF16, Variant.MXFP8, Variant.NVFP4),
            Accelerator.B300: (Variant.BF16, Variant.MXFP8, Variant.NVFP4),
            Accelerator.GB300: (Variant.BF16, Variant.MXFP8, Variant.NVFP4),
            Accelerator.H100: (Variant.BF16, Variant.MXFP8, Variant.NVFP4),
            Accelerator.H20: (Variant.BF16, Variant.MXFP8, Variant.NVFP4),
            # gfx942: the recipe's MI300X/MI325X commands serve the BF16 checkpoint; its MX variants are for gfx950.
            Accelerator.MI300X: (Variant.BF16,),
            Accelerator.MI325X: (Variant.BF16,),
            Accelerator.MI350X: ALL_VARIANTS,
            Accelerator.MI355X: ALL_VARIANTS,
        },
        images={
            **{a: f"vllm/vllm-openai:v{VLLM_VERSION}" for a, f in ACCELERATORS.items() if f.vendor == "nvidia"},
            **{a: f"vllm/vllm-openai-rocm:v{VLLM_VERSION}" for a, f in ACCELERATORS.items() if f.vendor == "amd"},
        },
        # vLLM 0.33.0's own default (CacheConfig.gpu_memory_utilization = 0.92, VLLM-SRC config/cache.py); the
        # recipes do not set it, so m3fleet does not differ from it.
        memory_fraction={a: 0.92 for a in Accelerator},
        memory_model="total",
        activation_reserve_gib=4.0,
        reasoning_parser="minimax_m3",
        tool_parser="minimax_m3",
        port=8000,
        metrics_path="/metrics",
        ready_path="/v1/models",
        live_path="/health",
        pipeline_parallel=True,
        # Only the ROCm model threads rope_scaling into its RoPE (amd/model.py _build_rotary_emb). The NVIDIA
        # model builds it from rope_theta and partial_rotary_factor alone, sized to max_position_embeddings
        # (nvidia/model.py get_rope calls): past the native context it reads the cos/sin cache out of bounds.
        yarn_vendors=("amd",),
        language_model_only="skips_encoder",
        reserves_encoder_cache=True,
        unserved_variants={
            Variant.NVFP4: "vLLM 0.33.0 has no NVFP4 kernel for AMD GPUs (its Marlin path is CUDA-only; only a "
            "correctness emulation remains) and MI355X's FP4 tensor cores take MXFP4",
        },
        pool_limits={
            a: "the vLLM recipe serves the MX checkpoints on gfx950 (MI350X/MI355X: 'native MXFP8 Matrix Cores') and "
            "the BF16 checkpoint on gfx942 (MI300X/MI325X), which has no MX matrix cores"
            for a in (Accelerator.MI300X, Accelerator.MI325X)
        },
        sources={
            "support": "VLLM-RCP (NVIDIA Hopper/Blackwell; AMD CDNA4 incl. MXFP4); VLLM-NVFP4 (modelopt_fp4 from "
            "compute capability 7.5: Marlin W4A16 on H200, FP4 kernels on Blackwell); INFX (the recipe's MXFP8 "
            "TP8/TP4/TP8+EP8 on B200 and B300); Hopper H100/H20 as H200 (VLLM-RCP: 'compute capability >= 9.0', "
            "'8x H200 / H20'); GB300 as GB200 (Blackwell); MI300X/MI325X BF16 and MI350X as MI355X (VLLM-RCP AMD: "
            "'MI350X/MI355X (gfx950), MI300X/MI325X (gfx942)', hardware mi300x verified)",
            "images": "ENGINE-ARGPARSE: 0.33.0 has the M3 model classes and minimax_m3 parsers",
            "memory_fraction": "VLLM-SRC config/cache.py: gpu_memory_utilization default 0.92",
            "activation_reserve_gib": "DERIVED: about 4 GiB of non-KV overhead per GPU (UNVERIFIED)",
            "parsers": "VLLM-RCP, ENGINE-ARGPARSE (underscore form registered)",
            "pipeline_parallel": "VLLM-SRC: MiniMaxM3SparseForCausalLM/ForConditionalGeneration implement SupportsPP "
            "(make_layers, PPMissingLayer) on both platforms; TP within a node, PP across nodes: VLLM-PAR",
            "yarn_vendors": "VLLM-SRC nvidia/model.py (rope_parameters = rope_theta + partial_rotary_factor only) "
            "vs amd/model.py _build_rotary_emb (applies rope_scaling); VLLM-RCP-AMD's 1M recipe is ROCm",
            "language_model_only": "VLLM-SRC: --language-model-only skips building the vision tower "
            "(_mark_tower_model); VLLM-RCP ('skip loading the encoder and free VRAM')",
            "reserves_encoder_cache": "VLLM-SRC common/mm_preprocess.py (_MAX_FRAMES_PER_VIDEO, ~192,000 tokens)",
        },
    ),
    EngineName.SGLANG: EngineFacts(
        name=EngineName.SGLANG,
        version=SGLANG_VERSION,
        support={
            # MXFP8 MoE kernels in SGLang are Blackwell/gfx950-only (SGL-CFG).
            Accelerator.H200: (Variant.BF16,),
            Accelerator.GB200: (Variant.BF16, Variant.MXFP8),
            Accelerator.B200: (Variant.BF16, Variant.MXFP8),
            Accelerator.B300: (Variant.BF16, Variant.MXFP8),
            Accelerator.GB300: (Variant.BF16, Variant.MXFP8),
            Accelerator.H100: (Variant.BF16,),
            Accelerator.H20: (Variant.BF16,),
            # gfx942 has no MX matrix cores: SGLang converts the MXFP8 checkpoint to block-fp8 at load (SGL-CFG-POOLS).
            Accelerator.MI300X: (Variant.BF16, Variant.MXFP8),
            Accelerator.MI325X: (Variant.BF16, Variant.MXFP8),
            Accelerator.MI350X: (Variant.BF16, Variant.MXFP8),
            Accelerator.MI355X: (Variant.BF16, Variant.MXFP8),
        },
        images={
            Accelerator.H200: f"lmsysorg/sglang:v{SGLANG_VERSION}-cu129",
            Accelerator.H100: f"lmsysorg/sglang:v{SGLANG_VERSION}-cu129",
            Accelerator.H20: f"lmsysorg/sglang:v{SGLANG_VERSION}-cu129",
            Accelerator.GB200: f"lmsysorg/sglang:v{SGLANG_VERSION}-cu130",
            Accelerator.GB300: f"lmsysorg/sglang:v{SGLANG_VERSION}-cu130",
            Accelerator.B200: f"lmsysorg/sglang:v{SGLANG_VERSION}-cu130",
            Accelerator.B300: f"lmsysorg/sglang:v{SGLANG_VERSION}-cu130",
            Accelerator.MI300X: f"lmsysorg/sglang:v{SGLANG_VERSION}-rocm700-mi30x",
            Accelerator.MI325X: f"lmsysorg/sglang:v{SGLANG_VERSION}-rocm700-mi30x",
            Accelerator.MI350X: f"lmsysorg/sglang:v{SGLANG_VERSION}-rocm720-mi35x",
            Accelerator.MI355X: f"lmsysorg/sglang:v{SGLANG_VERSION}-rocm720-mi35x",
        },
        # GB200 takes the NVIDIA blog's Blackwell 0.8 (NV-BLOG); SGL-CFG's GB200 cell (0.75) is "inferred, not
        # benchmarked". H200 and MI355X keep their SGL-CFG cells.
        # Hopper H100/H20 take H200's cell, GB300 the Blackwell 0.8 (SGL-CFG-POOLS' GB300 cell runs 0.75 at TP4; the
        # plan sizes the KV pool from the fraction it renders either way), the Instinct pools their cells' 0.80.
        memory_fraction={
            Accelerator.H200: 0.75,
            Accelerator.H100: 0.75,
            Accelerator.H20: 0.75,
            Accelerator.GB200: 0.80,
            Accelerator.GB300: 0.80,
            Accelerator.B200: 0.80,
            Accelerator.B300: 0.80,
            Accelerator.MI300X: 0.80,
            Accelerator.MI325X: 0.80,
            Accelerator.MI350X: 0.80,
            Accelerator.MI355X: 0.80,
        },
        memory_model="static",
        activation_reserve_gib=0.0,  # outside the static fraction
        reasoning_parser="minimax-m3",
        tool_parser="minimax-m3",
        port=30000,
        metrics_path="/metrics",
        ready_path="/health_generate",
        live_path="/health",
        pipeline_parallel=True,
        yarn_vendors=("nvidia", "amd"),
        # SGLang's --language-model-only refuses image/video requests, but MiniMaxM3SparseForConditionalGeneration
        # builds and loads its vision tower regardless, and the text-only class cannot load the VL checkpoint.
        language_model_only="refuses_media",
        unserved_variants={
            Variant.NVFP4: "SGLang 0.5.23's MiniMax-M3 NVFP4 path (minimax_m3_nvfp4) is built for the M3.1 "
            "checkpoint that packs NVFP4 experts under MXFP8; the ModelOpt nvidia/MiniMax-M3-NVFP4 checkpoint is not "
            "a layout its M3 code documents",
        },
        pool_limits={
            a: "SGLang's MXFP8 MoE kernels are Blackwell and AMD Instinct only; on Hopper its cookbook serves the BF16 "
            "checkpoint (SGL-CFG)"
            for a in (Accelerator.H100, Accelerator.H20)
        },
        deviations={
            Accelerator.GB200: (
                "sglang on gb200 follows the NVIDIA blog's Blackwell command (--tp-size 8 --ep-size 8 --quantization "
                "mxfp8 --mm-attention-backend flashinfer_cudnn --chunked-prefill-size 8192 --mem-fraction-static "
                "0.8) with these differences:",
                "no --attention-backend flashinfer: SGLang 0.5.23's M3 selection picks fa4 with page size 128 on "
                "SM100 (the MSA fmha_sm100 kernel), or trtllm_mha for fp8_e4m3 KV; forcing a backend turns off the "
                "fp8-KV attention path",
                "no --moe-runner-backend deep_gemm: SGLang's M3 selection already picks deep_gemm for MXFP8 on SM100, "
                "and replaces it with triton on BF16 weights (deep_gemm corrupts them)",
                "the mxfp8 variant loads the pre-quantized MiniMaxAI/MiniMax-M3-MXFP8 checkpoint where the blog "
                "quantizes the BF16 checkpoint online (--model-path MiniMaxAI/MiniMax-M3 --quantization mxfp8)",
                "--chunked-prefill-size 16384 above 32k context, as the SGLang cookbook advises",
                "a replica of more than 4 GPUs spans GB200 nodes (4 GPUs each) as one LeaderWorkerSet group "
                "(--nnodes, --node-rank, --dist-init-addr) where the blog runs one 8-GPU node",
            )
        },
        sources={
            "support": "SGL-CFG (H200 BF16; GB200 MXFP8; MI355X MXFP8); SGL-CFG-POOLS (GB300 MXFP8; MI300X MXFP8 as "
            "block-fp8; MI325X, MI350X inferred from their same-arch siblings); H100/H20 as H200 (Hopper BF16)",
            "images": "SGL-CFG tag families (cu12 Hopper, cu13 multi-arch Blackwell, rocm700-mi30x gfx942, "
            "rocm720-mi35x gfx950); tags UNVERIFIED",
            "memory_fraction": "SGL-CFG (0.75 H200, 0.80 MI355X); NV-BLOG (0.8 on Blackwell: GB200, B200, B300)",
            "parsers": "ENGINE-ARGPARSE (dash form registered; underscore rejected)",
            "pipeline_parallel": "SGL-SRC: --pp-size (fields/parallel.py); MiniMaxM3Model splits layers with "
            "make_pp_layers and PPMissingLayer, the VL wrapper forwards pp_proxy_tensors",
            "yarn_vendors": "SGL-SRC minimax_m3.py: get_rope(..., rope_scaling=get_rope_config(config)) on every "
            "platform",
            "language_model_only": "SGL-SRC fields/disagg.py --language-model-only (tokenizer refuses media) vs "
            "models/minimax_m3_vl.py (vision tower built unconditionally)",
            "deviations": "NV-BLOG; SGL-SRC arg_groups/model_overrides/minimax_m3.py; SGL-CB",
            "unserved_variants": "SGL-NVFP4",
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
        pipeline_parallel=False,  # the M3 guide documents TEP and DEP only
        yarn_vendors=(),
        # The text-only MiniMaxM3SparseForCausalLM is chosen by a checkpoint whose config.json names it; the
        # published checkpoints name MiniMaxM3SparseForConditionalGeneration and trtllm-serve has no override.
        language_model_only="unsupported",
        sparse_attention_algorithm="minimax_m3",
        unserved_variants={
            Variant.NVFP4: f"TensorRT-LLM {TRTLLM_VERSION}'s MiniMax-M3 guide serves BF16 only (NVFP4 arrives in "
            "later releases' guides)",
        },
        sources={
            "sparse_attention_algorithm": "TRT-GUIDE, TRT-YAML (sparse_attention_config.algorithm)",
            "pipeline_parallel": "TRT-GUIDE ('TEP or DEP'); the curated YAML sets no pipeline_parallel_size",
            "yarn_vendors": "TRT-GUIDE documents no rope scaling for M3",
            "language_model_only": "TRT-GUIDE (architectures)",
            "support": "TRT-GUIDE ('served in BF16; no FP8/NVFP4 serving path')",
            "images": "TRT-GUIDE (nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc20)",
            "memory_fraction": "TRT-YAML (kv_cache_config.free_gpu_memory_fraction 0.7)",
            "version": "stays 1.3.0rc20, the release of TRT-GUIDE: Dynamo documents no M3 path on TensorRT-LLM "
            "(its M3 recipe is vLLM-only, its M3.1 recipe serves another checkpoint, MiniMax-M3.1-Flash), so its "
            "1.3.0rc29 pin brings no M3 option m3fleet can check; the 1.4.0rc1 guide (MXFP8, mixed MXFP8/NVFP4, "
            "FP8/NVFP4 KV, linear Eagle3) is not in our sources beyond its introduction, and its Eagle3 path needs a "
            "separate draft KV manager (NVIDIA/TensorRT-LLM PR #16021) whose options cannot be transcribed into "
            "tests/support/trtllm_schema.py without that text",
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
B2, B3 = Accelerator.B200, Accelerator.B300
G3, M300 = Accelerator.GB300, Accelerator.MI300X
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
    # The recipe's AMD BF16 commands cover gfx942 and list mi300x as verified hardware (MI325X: same commands, not
    # listed as verified).
    _s(V, M300, Variant.BF16, TP, 8, 1, 1, "VLLM-RCP AMD TP8 (mi300x verified)"),
    _s(V, M300, Variant.BF16, TPEP, 8, 1, 1, "VLLM-RCP AMD TP8 + Expert Parallel (mi300x verified)"),
    _s(V, M300, Variant.BF16, DPEP, 1, 8, 1, "VLLM-RCP AMD DP8 + Expert Parallel (mi300x verified)"),
    _s(S, M300, Variant.MXFP8, TP, 8, 1, 1, "SGL-CFG-POOLS MI300X MXFP8 --tp 8 (verified; block-fp8 at load)"),
    _s(S, G3, Variant.MXFP8, TP, 4, 1, 1, "SGL-CFG-POOLS GB300 MXFP8 --tp 4 (verified)"),
    *(
        _s(V, b, Variant.MXFP8, strategy, tp, 1, 1, f"INFX {b.value} MXFP8 {label}")
        for b in (B2, B3)
        for strategy, tp, label in ((TP, 8, "TP8"), (TP, 4, "TP4"), (TPEP, 8, "TP8+EP8"))
    ),
    # NV-BLOG's SGLang command as written: one 8-GPU Blackwell node, TP8 + EP8, MXFP8.
    *(_s(S, b, Variant.MXFP8, TPEP, 8, 1, 1, "NV-BLOG SGLang 8-GPU Blackwell node") for b in (B2, B3)),
    _s(S, H, Variant.BF16, TP, 8, 1, 1, "SGL-CFG H200 BF16 --tp 8"),
    _s(S, M, Variant.MXFP8, TP, 8, 1, 1, "SGL-CFG MI355X MXFP8 --tp 8"),
    # NV-BLOG's SGLang TP8+EP8 command is CUDA-only (flashinfer, flashinfer_cudnn, deep_gemm) on one 8-GPU
    # Blackwell node: no published recipe runs it on MI355X, nor as 2 x 4 GB200.
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
    *(
        Floor(a, Variant.BF16, 8, f"BF16 on {a.value.upper()} needs TP=8 (VLLM-RCP AMD prerequisites)")
        for a in (Accelerator.MI300X, Accelerator.MI325X, Accelerator.MI350X)
    ),
    Floor(Accelerator.MI350X, Variant.MXFP8, 4, "MXFP8 on gfx950 runs from TP=4 (VLLM-RCP)"),
    Floor(Accelerator.MI350X, Variant.MXFP4, 4, "MXFP4 on gfx950 runs from TP=4 (VLLM-RCP)"),
    *(
        Floor(a, Variant.MXFP8, 8, f"MXFP8 on {a.value.upper()} (gfx942) is published at --tp 8 only (SGL-CFG-POOLS)")
        for a in (Accelerator.MI300X, Accelerator.MI325X)
    ),
    Floor(G, Variant.BF16, 8, "TensorRT-LLM serves M3 on GB200 as 8 ranks over 2 nodes (TRT-GUIDE)", T),
)

PARALLEL_CANDIDATES: Final = (1, 2, 4, 8, 16, 32)

"""NVIDIA Dynamo, the serving layer disaggregated fleets run on: the release, its images, the engine versions its
backends pin, and which MiniMax-M3 paths those versions have (docs/disaggregation.md explains each).

Sources: the `ai-dynamo` 1.6.1 wheel (its requirements pin vllm==0.31.0, sglang==0.5.21, tensorrt-llm==1.3.0rc29;
its argument parsers under dynamo/frontend, dynamo/vllm, dynamo/sglang, dynamo/trtllm, dynamo/mocker), the vLLM
0.31.0 and SGLang 0.5.21 wheels (vllm/models/minimax_m3/, sglang/srt/models/minimax_m3.py and
sglang/srt/disaggregation/), and Dynamo's MiniMax-M3 recipes (ai-dynamo/dynamo recipes/minimax-m3: vLLM and SGLang
disaggregated deployments; its README lists "Disaggregation does not work for TRTLLM" as a known issue).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from m3fleet.api.base import Accelerator, EngineName, Strategy

DYNAMO_VERSION: Final = "1.6.1"
FRONTEND_PORT: Final = 8000  # the frontend's OpenAI HTTP port (--http-port)
SYSTEM_PORT: Final = 9090  # a worker's system server: /health, /live, /metrics (DYN_SYSTEM_PORT)
DISCOVERY_BACKEND: Final = "kubernetes"
REQUEST_PLANE: Final = "tcp"  # no NATS
EVENT_PLANE: Final = "zmq"  # KV events from the workers to the router, no NATS
ROUTER_MODE: Final = "kv"
M3_PARSER: Final = "minimax_m3"  # Dynamo's own tool-call and reasoning parsers for M3 (dynamo._core registers both)
# Kubernetes discovery: each worker records itself in a DynamoWorkerMetadata (nvidia.com/v1alpha1, the CRD ships
# with Dynamo's platform chart) and readiness is read from the EndpointSlices of the Services in front of the pods
# (strings of the 1.6.1 runtime, dynamo_runtime::discovery::kube).
WORKER_METADATA_API: Final = ("nvidia.com", "dynamoworkermetadatas")
DISCOVERY_LABELS: Final[Mapping[str, str]] = {
    "nvidia.com/dynamo-discovery-backend": DISCOVERY_BACKEND,
    "nvidia.com/dynamo-discovery-enabled": "true",
}


@dataclass(frozen=True)
class DynamoBackend:
    """One Dynamo backend (`python3 -m dynamo.<module>`) as it serves MiniMax-M3 disaggregated."""

    engine: EngineName
    module: str
    engine_version: str  # the engine version the Dynamo release pins for this backend
    image: str  # Dynamo's runtime image for the backend (frontend and workers)
    kv_block_size: int  # tokens per KV block: the router hashes prefixes in blocks of the workers' size
    default_strategy: Mapping[str, Strategy]  # role -> strategy when the role's parallelism says auto
    equal_tp: bool  # prefill and decode must use the same TP size (the KV layouts must match block for block)
    m3_path: str  # why this engine version serves M3 disaggregated (or with what caveat)
    caveat: str = ""  # said in the plan's notes


BACKENDS: Final[Mapping[EngineName, DynamoBackend]] = {
    EngineName.TRTLLM: DynamoBackend(
        engine=EngineName.TRTLLM,
        module="dynamo.trtllm",
        engine_version="1.3.0rc29",
        image=f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DYNAMO_VERSION}",
        kv_block_size=32,  # tokens_per_block of Dynamo's M3 TensorRT-LLM recipe
        # The TensorRT-LLM guide's two layouts: TEP keeps one long prompt's prefill on all ranks; DEP spreads
        # many decoding sequences over the ranks (each rank holds its own).
        default_strategy={"prefill": Strategy.TP_EP, "decode": Strategy.DP_EP},
        equal_tp=False,
        m3_path="TensorRT-LLM serves M3 in BF16 with TEP or DEP (its deployment guide); Dynamo's backend passes the "
        "engine YAML through (--extra-engine-args) and the KV goes over NIXL (cache_transceiver_config)",
        caveat="Dynamo's own MiniMax-M3 recipe lists 'Disaggregation does not work for TRTLLM' as a known issue "
        "(recipes/minimax-m3/README.md, validated 2026-06-12) while NVIDIA's M3 blog reports a 4x interactivity gain "
        "from Dynamo + TensorRT-LLM disaggregated at 32k input: no TensorRT-LLM 1.3.0rc29 wheel is installable to "
        "check which holds for this release; validate on one node pair before relying on it",
    ),
    EngineName.VLLM: DynamoBackend(
        engine=EngineName.VLLM,
        module="dynamo.vllm",
        engine_version="0.31.0",
        image=f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{DYNAMO_VERSION}",
        kv_block_size=128,  # --block-size 128, as every M3 recipe runs vLLM
        default_strategy={"prefill": Strategy.TP_EP, "decode": Strategy.TP_EP},
        equal_tp=False,
        m3_path="vLLM 0.31.0 has the MiniMax-M3 model (vllm/models/minimax_m3) and the NIXL KV connector; Dynamo's "
        "M3 recipes run it disaggregated (TP4 prefill and decode workers on GB200, NixlConnector)",
    ),
    EngineName.SGLANG: DynamoBackend(
        engine=EngineName.SGLANG,
        module="dynamo.sglang",
        engine_version="0.5.21",
        image=f"nvcr.io/nvidia/ai-dynamo/sglang-runtime:{DYNAMO_VERSION}",
        kv_block_size=128,  # --page-size 128 (the MSA kernels' page)
        default_strategy={"prefill": Strategy.TP_EP, "decode": Strategy.TP_EP},
        equal_tp=True,  # SGLang's M3 PD disaggregation needs equal TP on both sides (SGL-CB)
        m3_path="SGLang 0.5.21 has the MiniMax-M3 model (srt/models/minimax_m3.py) and PD disaggregation "
        "(srt/disaggregation, NIXL transfer backend; the index-K buffer travels with the KV); Dynamo's M3 recipes "
        "run it disaggregated",
    ),
}

# Dynamo's release images are CUDA builds: a disaggregated fleet runs on these accelerators only.
ACCELERATORS: Final = (Accelerator.H200, Accelerator.GB200)

"""What every object of the API shares: its group, version and kind, its limits, the camelCase base model, the
enums, and the rejection a model's own rule raises."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

GROUP = "m3fleet.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MiniMaxM3Deployment"
PLURAL = "minimaxm3deployments"
SINGULAR = "minimaxm3deployment"
SHORT_NAMES = ("m3d",)
CATEGORIES = ("m3fleet",)

MAX_CONTEXT = 1_048_576
PARALLEL_SIZES = (0, 1, 2, 4, 8, 16, 32)
MAX_REPLICAS = 1024  # spec.replicas and autoscaling.maxReplicas
MAX_SURGE = 64


def invalid(problem: str, fix: str, field: str | None = None) -> PydanticCustomError:
    """A rejection by one of the model's own rules (the CRD's CEL rules, checked again for the CLI and the
    operator), carrying its fix; `field` names the camelCase field a model-level rule is about.
    m3fleet.api.parse turns it into `<field>: <problem>; fix: <fix>`."""
    ctx = {"problem": problem, "fix": fix, **({"field": field} if field else {})}
    return PydanticCustomError("m3fleet", "{problem}", ctx)


class CamelModel(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )


class Variant(StrEnum):
    BF16 = "bf16"
    MXFP8 = "mxfp8"
    MXFP4 = "mxfp4"
    NVFP4 = "nvfp4"


class EngineName(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


class Accelerator(StrEnum):
    H200 = "h200"
    GB200 = "gb200"
    B200 = "b200"  # HGX B200: 8 GPUs a node
    B300 = "b300"  # HGX B300 (Blackwell Ultra): 8 GPUs a node
    GB300 = "gb300"  # GB300 NVL72 compute tray (Blackwell Ultra): 4 GPUs a node, NVLink across the rack
    H100 = "h100"  # HGX H100 80GB: 8 GPUs a node
    H20 = "h20"  # HGX H20 96GB: 8 GPUs a node
    MI300X = "mi300x"  # gfx942 (CDNA3), 192 GB
    MI325X = "mi325x"  # gfx942 (CDNA3), 256 GB
    MI350X = "mi350x"  # gfx950 (CDNA4), 288 GB
    MI355X = "mi355x"


class MoeBackend(StrEnum):
    AUTO = "auto"
    AITER = "aiter"
    EMULATION = "emulation"


class Strategy(StrEnum):
    AUTO = "auto"
    TP = "tp"
    TP_EP = "tp-ep"
    DP_EP = "dp-ep"


class KvCacheDtype(StrEnum):
    AUTO = "auto"
    BF16 = "bf16"
    FP8 = "fp8"


class SpeculativeMethod(StrEnum):
    MTP = "mtp"  # the checkpoint's own multi-token-prediction modules
    EAGLE3 = "eagle3"  # an EAGLE3 draft model


class AutoscalingMode(StrEnum):
    ACT = "act"
    ADVISORY = "advisory"

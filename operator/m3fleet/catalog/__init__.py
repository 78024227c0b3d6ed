"""Facts as data: model variants, accelerators, engines, validated shapes (see `facts`)."""

from m3fleet.catalog.facts import (
    ACCELERATORS,
    ENGINES,
    FLOORS,
    KV_LAYOUT,
    PARALLEL_CANDIDATES,
    SOURCES,
    VALIDATED_SHAPES,
    VARIANTS,
    AcceleratorFacts,
    EngineFacts,
    Floor,
    KvLayout,
    ModelVariant,
    Shape,
)
from m3fleet.catalog.versions import SGLANG_VERSION, TRTLLM_VERSION, VLLM_VERSION

__all__ = [
    "ACCELERATORS",
    "ENGINES",
    "FLOORS",
    "KV_LAYOUT",
    "PARALLEL_CANDIDATES",
    "SGLANG_VERSION",
    "SOURCES",
    "TRTLLM_VERSION",
    "VALIDATED_SHAPES",
    "VARIANTS",
    "VLLM_VERSION",
    "AcceleratorFacts",
    "EngineFacts",
    "Floor",
    "KvLayout",
    "ModelVariant",
    "Shape",
]

"""`spec.model`: which MiniMax-M3 checkpoint to serve and where its weights are (a claim, Hugging Face, or a
MiniMaxM3ModelCache)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field

from m3fleet.api import children
from m3fleet.api.base import CamelModel, Variant
from m3fleet.api.rules import cel


def sub_path_field(description: str) -> Any:
    """A volume sub-path (a pvc's, a volume mount's): relative, inside the volume."""
    return Field(default="", max_length=1024, description=description, json_schema_extra=children.sub_path_rules())


class PvcSource(CamelModel):
    claim_name: str = Field(
        min_length=1,
        max_length=253,
        description="PersistentVolumeClaim holding the checkpoint.",
        json_schema_extra=children.name_rules("claimName"),
    )
    sub_path: str = sub_path_field("Directory inside the claim that holds the checkpoint (relative, no '..').")


class SecretKeyRef(CamelModel):
    name: str = Field(
        min_length=1,
        max_length=253,
        description="Secret in the resource's namespace.",
        json_schema_extra=children.name_rules("name"),
    )
    key: str = Field(
        default="token",
        min_length=1,
        max_length=253,
        description="Key inside the Secret.",
        json_schema_extra=children.key_rules("key"),
    )


class HuggingFaceSource(CamelModel):
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret with a Hugging Face token, passed to the engine as HF_TOKEN via secretKeyRef "
        "(the operator never reads it).",
    )
    cache_claim_name: str = Field(
        min_length=1,
        max_length=253,
        description="PersistentVolumeClaim mounted as the Hugging Face cache (HF_HOME), so the weights are "
        "downloaded once and shared; ReadWriteMany when more than one pod mounts it. Never deleted by "
        "the operator.",
        json_schema_extra=children.name_rules("cacheClaimName"),
    )


class ModelSource(CamelModel):
    """Where the weights are: exactly one of `pvc` or `huggingFace`."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.pvc) != has(self.huggingFace)",
                    "model.source needs exactly one of pvc and huggingFace; fix: set one of them: pvc (weights on a "
                    "volume) or huggingFace (downloaded at start)",
                )
            ]
        }
    )
    pvc: PvcSource | None = Field(default=None, description="Serve the checkpoint from a volume claim.")
    hugging_face: HuggingFaceSource | None = Field(
        default=None, description="Download the checkpoint from Hugging Face into a cache claim."
    )


class NodeAffinityMode(StrEnum):
    REQUIRED = "Required"
    PREFERRED = "Preferred"


class ModelCacheRef(CamelModel):
    """A MiniMaxM3ModelCache in the resource's namespace whose node-local copy the engine pods mount."""

    name: str = Field(
        min_length=1,
        max_length=63,
        description="The MiniMaxM3ModelCache (same namespace).",
        json_schema_extra=children.name_rules("name"),
    )
    node_affinity: NodeAffinityMode = Field(
        default=NodeAffinityMode.REQUIRED,
        description="Required: pods run only on nodes holding a verified copy and mount it. Preferred: pods "
        "prefer those nodes and mount the copy there, else load from spec.model.source (a pvc).",
    )


CACHE_PREFERRED_PROBLEM = (
    "is Preferred, but a pod on a node without the copy falls back to spec.model.source, which must then be a pvc "
    "(a Hugging Face source has no directory to fall back to)"
)
CACHE_PREFERRED_FIX = "use nodeAffinity Required, or a pvc source"


class ModelSpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.cacheRef) || self.cacheRef.nodeAffinity != 'Preferred' || has(self.source.pvc)",
                    f"cacheRef.nodeAffinity {CACHE_PREFERRED_PROBLEM}; fix: {CACHE_PREFERRED_FIX}",
                    ".cacheRef.nodeAffinity",
                )
            ]
        }
    )
    variant: Variant = Field(default=Variant.BF16, description="Checkpoint precision: bf16, mxfp8, mxfp4 or nvfp4.")
    checkpoint: str = Field(
        default="",
        max_length=512,
        description="Checkpoint id or path; empty means the variant's default (MiniMaxAI/MiniMax-M3, "
        "MiniMaxAI/MiniMax-M3-MXFP8, amd/MiniMax-M3-MXFP4, nvidia/MiniMax-M3-NVFP4).",
        json_schema_extra=children.no_dot_dot_rules("checkpoint"),
    )
    source: ModelSource = Field(description="Where the weights are.")
    language_model_only: bool = Field(
        default=False, description="Skip the vision encoder (text-only serving; frees GPU memory)."
    )
    cache_ref: ModelCacheRef | None = Field(
        default=None,
        description="Serve from the node-local copy a MiniMaxM3ModelCache staged (mounted read-only) instead of "
        "reading spec.model.source at start.",
    )

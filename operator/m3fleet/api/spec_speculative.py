"""`spec.speculativeDecoding`: a draft proposes tokens the target model verifies in one forward pass (M3's own MTP
modules, or an EAGLE3 draft model). The planner counts the draft's weights and KV cache (m3fleet.sizing), each engine
renders it in its own spelling (m3fleet.engines), and the autoscaler's decode model takes the acceptance length
(m3fleet.autoscaling.policy.capacity)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from m3fleet.api.base import CamelModel, SpeculativeMethod
from m3fleet.api.rules import cel

MAX_SPECULATIVE_TOKENS = 8
# A Hugging Face id (owner/name) or an absolute path; empty takes the default draft.
DRAFT_MODEL_PATTERN = r"^(/[^\s]*|[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*|)$"
MTP_DRAFT_PROBLEM = "is for eagle3: method mtp drafts with the modules inside the served checkpoint"
MTP_DRAFT_FIX = "remove draftModel, or use method eagle3"
TRTLLM_SPECULATIVE_PROBLEM = (
    "is not served by the pinned TensorRT-LLM (1.3.0rc20): its MiniMax-M3 guide has no MTP on the sparse-attention "
    "path, and Eagle3 for M3 arrives in later releases (the 1.4.0rc1 guide)"
)
TRTLLM_SPECULATIVE_FIX = "remove speculativeDecoding, or use engine vllm (mtp, eagle3) or sglang (eagle3)"
SGLANG_MTP_PROBLEM = (
    "is not served by SGLang 0.5.23: its MiniMax-M3 model skips the checkpoint's MTP weights and builds no MTP "
    "(NextN) module (srt/models/minimax_m3.py)"
)
SGLANG_MTP_FIX = "use method eagle3 on sglang, or engine vllm for mtp"


TOKENS_DESCRIPTION = "Tokens drafted per step; 0 = the recipes' 3."


class SpeculativeDecodingSpec(CamelModel):
    """Speculative decoding: `mtp` (the checkpoint's own multi-token-prediction modules; vLLM) or `eagle3` (a draft
    model; vLLM, SGLang). TensorRT-LLM's pinned release serves neither on M3's sparse attention."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.method != 'mtp' || !has(self.draftModel) || self.draftModel == ''",
                    f"speculativeDecoding.draftModel {MTP_DRAFT_PROBLEM}; fix: {MTP_DRAFT_FIX}",
                    ".draftModel",
                    "FieldValueForbidden",
                )
            ]
        }
    )
    method: SpeculativeMethod = Field(
        description="mtp (MiniMax-M3's own MTP modules) or eagle3 (a draft model, draftModel)."
    )
    draft_model: str = Field(
        default="",
        max_length=253,
        pattern=DRAFT_MODEL_PATTERN,
        description="eagle3 only: the draft's Hugging Face id or an absolute path in the engine container (e.g. a "
        "podTemplate volume). Empty: Inferact/MiniMax-M3-EAGLE3, the draft the vLLM recipe runs.",
    )
    num_speculative_tokens: int = Field(0, ge=0, le=MAX_SPECULATIVE_TOKENS, description=TOKENS_DESCRIPTION)

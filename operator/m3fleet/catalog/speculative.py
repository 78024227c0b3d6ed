"""Speculative decoding for MiniMax-M3 as data: each draft's default, its size and KV cache, the acceptance length
the autoscaler assumes before the engine measures one, and which engines serve it.

Sources (tags beyond `facts.SOURCES`):
  EAGLE3-CARD  huggingface.co/Inferact/MiniMax-M3-EAGLE3 model card: a 1-layer dense Llama (LlamaForCausalLMEagle3,
               ~3.3B parameters) on hidden_size 6144 / vocab 200064, sharing the target's embedding and LM head;
               measured with vLLM at TP4, num_speculative_tokens 3: mean acceptance length 2.698 (MT-Bench), 2.776
               (speed-bench 16k), 3.3-3.5 (GSM8K, HumanEval, MATH500, AIME).
  VLLM-RCP-SPEC the vLLM recipe's spec_decoding feature (recipes.vllm.ai/MiniMaxAI/MiniMax-M3), quoted verbatim by
               SemiAnalysisAI/InferenceX PRs #1733 (B300) and #1741 (B200): {"method": "eagle3", "model":
               "Inferact/MiniMax-M3-EAGLE3", "num_speculative_tokens": 3}; on Blackwell with "attention_backend":
               "FLASH_ATTN" for the drafter (the EAGLE3 head is MHA, FlashInfer takes page size 128 only through its
               GQA-only kernel: engine init fails otherwise, #1741).
  VLLM-MTP     vllm 0.33.0 wheel: config/speculative.py (method minimax_m3_mtp; the VL checkpoint's text_config
               promoted into an MTP config, n_predict = num_mtp_modules), models/minimax_m3/nvidia/mtp.py (each MTP
               module a full M3 decoder layer with forced sparse attention and MoE, plus its own embed_tokens and
               lm_head).
  SGL-SPEC     sglang 0.5.23 wheel: srt/models/minimax_m3.py (set_eagle3_layers_to_capture: EAGLE3 served; the
               checkpoint's model.mtp.layers.* skipped, no NextN module built).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from m3fleet.api.models import EngineName, SpeculativeMethod
from m3fleet.api.spec_speculative import SGLANG_MTP_PROBLEM, TRTLLM_SPECULATIVE_PROBLEM

VOCAB_SIZE: Final = 200_064  # HF-CFG; EAGLE3-CARD
# The target's input embedding and LM head, each vocab x hidden in BF16: part of the replicated weights.
EMBEDDING_PARAMS_B: Final = 2 * VOCAB_SIZE * 6144 / 1e9


@dataclass(frozen=True, kw_only=True)
class DraftFacts:
    """One drafting method: what it loads and keeps per token, on top of the target."""

    method: SpeculativeMethod
    default_model: str | None  # None: the served checkpoint carries the draft (MTP)
    default_tokens: int
    # Tokens a target forward pass emits (accepted drafts + the bonus token), assumed until measured. 1 = no gain.
    acceptance_length_prior: float
    dense_params_b: float = 0.0  # a separate draft model's parameters, BF16, sharded over attention TP
    moe_layers: int = 0  # draft modules that are whole M3 decoder layers (sparse attention + MoE)
    own_embeddings: bool = False  # an embedding and an LM head of the draft's own (vocab x hidden each)
    kv_layers: int = 0  # attention layers of the draft, each keeping K and V per token
    kv_heads: int = 0
    head_dim: int = 128
    index_layers: int = 0  # of them, MSA sparse layers that also keep an index-K vector per token
    sources: dict[str, str] = field(default_factory=dict)


DRAFTS: Final[dict[SpeculativeMethod, DraftFacts]] = {
    SpeculativeMethod.EAGLE3: DraftFacts(
        method=SpeculativeMethod.EAGLE3,
        default_model="Inferact/MiniMax-M3-EAGLE3",
        default_tokens=3,
        acceptance_length_prior=2.7,
        dense_params_b=3.3,
        kv_layers=1,
        kv_heads=48,
        sources={
            "default_model": "VLLM-RCP-SPEC",
            "default_tokens": "VLLM-RCP-SPEC (num_speculative_tokens 3)",
            "acceptance_length_prior": "EAGLE3-CARD: 2.698 on MT-Bench (chat), the lowest category; 2.776 on "
            "speed-bench; reasoning and code reach 3.3-3.5",
            "dense_params_b": "EAGLE3-CARD (~3.3B, counted whole: an upper bound if it includes shared tensors)",
            "kv_heads": "EAGLE3-CARD hidden 6144 / head_dim 128 = 48 heads, MHA (VLLM-RCP-SPEC #1741: 'the EAGLE3 "
            "head is MHA'); the draft config's num_key_value_heads itself is UNVERIFIED",
        },
    ),
    SpeculativeMethod.MTP: DraftFacts(
        method=SpeculativeMethod.MTP,
        default_model=None,
        default_tokens=3,
        acceptance_length_prior=1.0,
        moe_layers=7,
        own_embeddings=True,
        kv_layers=7,
        kv_heads=4,
        index_layers=7,
        sources={
            "moe_layers": "3P-CALC (num_mtp_modules 7 in the checkpoint); VLLM-MTP builds every one as a whole M3 "
            "decoder layer (sparse attention + 128 routed experts) whatever num_speculative_tokens is",
            "own_embeddings": "VLLM-MTP (MiniMaxM3MultiTokenPredictor.embed_tokens, MiniMaxM3MTP.lm_head)",
            "kv_layers": "VLLM-MTP: each module's attention layer keeps its KV (and index-K) in the shared pool",
            "acceptance_length_prior": "no published acceptance length for M3's MTP modules: no gain assumed until "
            "the engine's counters measure it",
            "default_tokens": "the recipes' 3 (VLLM-RCP-SPEC uses EAGLE3; no recipe runs M3's MTP)",
        },
    ),
}

# (engine, method) pairs a published recipe runs: only these keep a plan `validated`.
RECIPES: Final[frozenset[tuple[EngineName, SpeculativeMethod]]] = frozenset(
    {(EngineName.VLLM, SpeculativeMethod.EAGLE3)}  # VLLM-RCP-SPEC
)

# Which engines serve each method on M3, and why not where they do not (the CRD's CEL says the same).
SERVED: Final[dict[EngineName, tuple[SpeculativeMethod, ...]]] = {
    EngineName.VLLM: (SpeculativeMethod.MTP, SpeculativeMethod.EAGLE3),
    EngineName.SGLANG: (SpeculativeMethod.EAGLE3,),
    EngineName.TRTLLM: (),
}
UNSERVED_REASONS: Final[dict[EngineName, str]] = {
    EngineName.SGLANG: SGLANG_MTP_PROBLEM,
    EngineName.TRTLLM: TRTLLM_SPECULATIVE_PROBLEM,
}

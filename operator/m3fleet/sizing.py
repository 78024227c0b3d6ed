"""What one GPU layout holds, as numbers: the weights and the KV bytes per token on each GPU (per pipeline stage),
the KV-cache budget left, and whether the context fits (`evaluate`). Pure; the planner (`m3fleet.planner`) picks
the layout with it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from m3fleet.api.models import KvCacheDtype, Strategy
from m3fleet.catalog import (
    KV_LAYOUT,
    MAX_VISION_TOKENS_PER_ITEM,
    TEXT_HIDDEN_SIZE,
    AcceleratorFacts,
    EngineFacts,
    ModelVariant,
)
from m3fleet.catalog.facts import GB, GIB
from m3fleet.catalog.speculative import EMBEDDING_PARAMS_B, VOCAB_SIZE, DraftFacts


@dataclass(frozen=True)
class Layout:
    """One candidate: TP x DP ranks in each of PP pipeline stages, with or without expert parallelism, and a KV
    dtype."""

    strategy: Strategy
    tp: int
    dp: int
    kv_dtype: KvCacheDtype
    pp: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def expert_parallel(self) -> bool:
        return self.strategy in (Strategy.TP_EP, Strategy.DP_EP)


@dataclass(frozen=True)
class Fit:
    """What a layout holds. Pure arithmetic over the catalog; `fits` decides."""

    layout: Layout
    weights_gib_per_gpu: float
    kv_gib_per_gpu: float
    kv_bytes_per_token_per_gpu: int
    tokens_per_rank: int
    dp_ranks: int
    draft_weights_gib_per_gpu: float = 0.0  # included in weights_gib_per_gpu
    draft_kv_bytes_per_token_per_gpu: int = 0  # included in kv_bytes_per_token_per_gpu

    @property
    def tokens_per_replica(self) -> int:
        return self.tokens_per_rank * self.dp_ranks

    def sequences_at(self, max_model_len: int) -> int:
        return self.dp_ranks * (self.tokens_per_rank // max_model_len)


def stage_layers(pp: int) -> list[range]:
    """The decoder layers of each pipeline stage, split as vLLM's get_pp_indices does: evenly, with any
    remainder on the stages before the last (60 layers split evenly for PP 2 and 4)."""
    per, rest = divmod(KV_LAYOUT.layers, pp)
    sizes = [per] * pp
    for i in range(2, rest + 2):
        sizes[-i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(range(start, start + size))
        start += size
    return stages


def _sparse_layers(stage: range) -> int:
    """MSA sparse layers in a stage; each also holds routed experts (layers 0..2 are dense)."""
    return sum(1 for layer in stage if layer >= KV_LAYOUT.dense_layers)


def kv_bytes_per_token_per_gpu(attention_tp: int, kv_dtype: KvCacheDtype, pp: int = 1) -> int:
    """K/V of the stage's layers for this rank's heads plus the stage's unsharded index-K cache (VLLM-IDX),
    in the stage that needs the most: every stage holds every token, so the heaviest one sets the capacity."""
    layout = KV_LAYOUT
    heads_per_rank = max(1, layout.kv_heads // attention_tp)
    kv_elem_bytes = 1 if kv_dtype == KvCacheDtype.FP8 else 2
    return max(
        len(stage) * 2 * heads_per_rank * layout.head_dim * kv_elem_bytes
        + _sparse_layers(stage) * layout.index_dim * layout.index_dtype_bytes
        for stage in stage_layers(pp)
    )


def weights_gib_per_gpu(variant: ModelVariant, layout: Layout, encoder_loaded: bool) -> float:
    """Weights resident on one GPU. The vision encoder is replicated (encoder data-parallel mode; with pipeline
    parallelism every stage builds it). A pipeline stage holds about 1/PP of the non-expert weights and the
    experts of its own MoE layers; the heaviest stage is counted."""
    encoder = variant.vision_encoder_gb
    non_expert = variant.replicated_gb - encoder
    if layout.strategy == Strategy.DP_EP:
        per_gpu = non_expert / layout.tp + variant.routed_experts_gb / layout.world
    else:
        moe_share = max(_sparse_layers(stage) for stage in stage_layers(layout.pp)) / KV_LAYOUT.index_layers
        per_gpu = non_expert / (layout.tp * layout.pp) + variant.routed_experts_gb * moe_share / layout.tp
    if encoder_loaded:
        per_gpu += encoder
    return per_gpu * GB / GIB


def draft_weights_gib_per_gpu(draft: DraftFacts, variant: ModelVariant, layout: Layout) -> float:
    """A draft's weights on one GPU. A separate draft model's dense layers and an MTP module's attention are sharded
    over attention TP (replicated across DP ranks); an MTP module's routed experts are sharded like the target's
    (over TP x DP with expert parallelism, over TP without). With pipeline stages the draft runs on the last stage;
    it is added to the heaviest one (an upper bound)."""
    tp = layout.tp
    expert_shards = layout.tp * layout.dp if layout.expert_parallel else layout.tp
    per_layer_dense_gb = (variant.replicated_gb - variant.vision_encoder_gb - EMBEDDING_PARAMS_B * 2) / KV_LAYOUT.layers
    per_layer_experts_gb = variant.routed_experts_gb / KV_LAYOUT.index_layers
    gb = draft.dense_params_b * 2 / tp
    gb += draft.moe_layers * (per_layer_dense_gb / tp + per_layer_experts_gb / expert_shards)
    if draft.own_embeddings:
        gb += 2 * VOCAB_SIZE * TEXT_HIDDEN_SIZE * 2 / GB / tp
    return gb * GB / GIB


def draft_kv_bytes_per_token_per_gpu(draft: DraftFacts, attention_tp: int, kv_dtype: KvCacheDtype) -> int:
    """What a draft's attention layers add to one token's KV on each GPU (the engines keep it in the same pool)."""
    heads_per_rank = max(1, draft.kv_heads // attention_tp) if draft.kv_heads else 0
    kv_elem_bytes = 1 if kv_dtype == KvCacheDtype.FP8 else 2
    return (
        draft.kv_layers * 2 * heads_per_rank * draft.head_dim * kv_elem_bytes
        + draft.index_layers * KV_LAYOUT.index_dim * KV_LAYOUT.index_dtype_bytes
    )


def encoder_cache_gib(engine: EngineFacts, encoder_loaded: bool, max_model_len: int) -> float:
    """vLLM's multimodal encoder cache, which its startup profiling reserves on every rank: the largest item's
    embeddings (a video of up to ~192k tokens, fewer when the context is shorter) at the text hidden size."""
    if not (engine.reserves_encoder_cache and encoder_loaded):
        return 0.0
    return min(MAX_VISION_TOKENS_PER_ITEM, max_model_len) * TEXT_HIDDEN_SIZE * 2 / GIB


def kv_budget_gib(engine: EngineFacts, accel: AcceleratorFacts, weights_gib: float) -> float:
    fraction = engine.memory_fraction[accel.name]
    memory = accel.memory_gib
    if engine.memory_model == "total":
        return memory * fraction - weights_gib - engine.activation_reserve_gib
    if engine.memory_model == "static":
        return memory * fraction - weights_gib
    return (memory - weights_gib - engine.activation_reserve_gib) * fraction


def evaluate(
    layout: Layout,
    variant: ModelVariant,
    engine: EngineFacts,
    accel: AcceleratorFacts,
    encoder_loaded: bool,
    max_model_len: int = 0,
    draft: DraftFacts | None = None,
) -> Fit:
    draft_weights = draft_weights_gib_per_gpu(draft, variant, layout) if draft else 0.0
    draft_kv = draft_kv_bytes_per_token_per_gpu(draft, layout.tp, layout.kv_dtype) if draft else 0
    weights = weights_gib_per_gpu(variant, layout, encoder_loaded) + draft_weights
    budget = kv_budget_gib(engine, accel, weights) - encoder_cache_gib(engine, encoder_loaded, max_model_len)
    # In dp-ep each DP rank is its own KV pool over its TP group; in tp the whole TP group is one pool (with
    # pipeline parallelism: every stage holds its layers' share of every token).
    per_token = kv_bytes_per_token_per_gpu(layout.tp, layout.kv_dtype, layout.pp) + draft_kv
    block_bytes = per_token * KV_LAYOUT.block_size
    blocks = math.floor(budget * GIB / block_bytes) if budget > 0 else 0
    return Fit(
        layout=layout,
        weights_gib_per_gpu=weights,
        kv_gib_per_gpu=budget,
        kv_bytes_per_token_per_gpu=per_token,
        tokens_per_rank=blocks * KV_LAYOUT.block_size,
        dp_ranks=layout.dp,
        draft_weights_gib_per_gpu=draft_weights,
        draft_kv_bytes_per_token_per_gpu=draft_kv,
    )

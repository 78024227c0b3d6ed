"""spec + catalog -> Plan. Pure: same spec, same plan; no I/O, no clock.

The planner picks the smallest GPU layout in which the weights plus the KV cache of
`minSequencesAtMaxLen` full-length sequences fit in GPU memory x the engine's memory fraction:

* tp / tp-ep: each GPU holds 1/TP of the weights, `max(1, 4/TP)` KV heads of every token plus
  the index cache (which TP does not shard); the TP group is one KV pool.
* tp / tp-ep over several nodes of a pool without NVLink between nodes (H200, MI355X), on an engine whose
  M3 model implements pipeline parallelism (vLLM, SGLang): TP = the node's GPUs within each node and one
  pipeline stage per node (vLLM's guidance: TP within a node, PP across nodes). Each stage holds its layers'
  weights and its layers' KV; the heaviest stage (the one with the most MoE/sparse layers) decides.
* dp-ep (attention data parallel + expert parallel MoE): each GPU holds the replicated weights
  (attention, dense layers, shared experts, embeddings) plus 1/EP of the routed experts, all KV
  heads, and only its own sequences: a sequence must fit in one DP rank.

The vision encoder counts only where the engine actually loads it (`EngineFacts.language_model_only`).
It never goes below a layout a recipe states as the minimum (`catalog.FLOORS`), and with
`kvCacheDtype: auto` it takes fp8 only when that fits the context on fewer GPUs than bf16.
An impossible spec raises `SpecError` naming the field, the numbers and a fix.

About 740 lines: one replica's plan, and the gateway's tiers and the speculative draft that reuse it (disaggregated
roles live in m3fleet/disaggregation.py). The next seams, the tiers and the draft, are left for a change of their own.
"""

from __future__ import annotations

import math

from m3fleet.api.models import (
    Accelerator,
    ContextTier,
    EngineName,
    GatewayPlan,
    InferenceGatewaySpec,
    KvCacheDtype,
    MiniMaxM3DeploymentSpec,
    Plan,
    SpeculativeMethod,
    Strategy,
    TierPlan,
    Variant,
)
from m3fleet.api.spec_gateway import MAIN_TIER
from m3fleet.catalog import (
    ACCELERATORS,
    ENGINES,
    FLOORS,
    PARALLEL_CANDIDATES,
    RDMA_RESOURCE_MARKERS,
    VALIDATED_SHAPES,
    VARIANTS,
    AcceleratorFacts,
    EngineFacts,
    ModelVariant,
)
from m3fleet.catalog.facts import POD_SHM_GIB
from m3fleet.catalog.gateway import CONTEXT_TIER_FILTER, EPP_IMAGE, KV_SCORER, PICKER_FITS, PREFIX_SCORER, QUEUE_SCORER
from m3fleet.catalog.speculative import DRAFTS, RECIPES, SERVED, UNSERVED_REASONS, DraftFacts
from m3fleet.disaggregation import plan_disaggregated, plan_roles
from m3fleet.errors import SpecError
from m3fleet.sizing import Fit, Layout, evaluate
from m3fleet.text import tokens as format_tokens

MIN_POD_MEMORY_GIB = 2 * POD_SHM_GIB  # the memory-backed /dev/shm plus at least as much for the processes


# --- the planner -----------------------------------------------------------------------------


def plan(spec: MiniMaxM3DeploymentSpec) -> Plan:
    """The smallest layout that serves `spec`, or `SpecError`. With spec.disaggregation: each role planned as a
    replica of its own and the prefill:decode ratio (`m3fleet.disaggregation`)."""
    if spec.disaggregation is not None:
        return plan_disaggregated(spec, _plan_replica)
    planned = _plan_replica(spec)
    if spec.gateway is None:
        return planned
    gateway, gateway_notes = _gateway_plan(spec, spec.gateway, planned)
    return planned.model_copy(update={"gateway": gateway, "notes": [*planned.notes, *gateway_notes]})


def role_plans(spec: MiniMaxM3DeploymentSpec) -> dict[str, Plan]:
    """A disaggregated resource's prefill and decode workers, each planned as a replica of its own."""
    return {str(role): p for role, p in plan_roles(spec, _plan_replica).items()}


def _plan_replica(spec: MiniMaxM3DeploymentSpec) -> Plan:
    """The smallest layout of one aggregated replica that serves `spec`, or `SpecError`."""
    engine_name = EngineName(spec.engine.name)
    accel_name = Accelerator(spec.accelerator)
    variant_name = Variant(spec.model.variant)
    engine = ENGINES[engine_name]
    accel = ACCELERATORS[accel_name]
    variant = VARIANTS[variant_name]
    _check_support(engine, accel_name, variant_name)
    _check_extra_resources(spec, accel)

    strategy = _resolve_strategy(spec)
    notes: list[str] = []
    if Strategy(spec.parallelism.strategy) == Strategy.AUTO:
        notes.append("parallelism.strategy auto resolved to tp (plain tensor parallelism)")

    max_len = spec.context.max_model_len
    rope_factor = _rope_scaling(engine, accel, variant, max_len, notes)
    kv_dtypes = _kv_dtype_candidates(spec, engine_name, variant, notes)
    floor_gpus, floor_reason = _floor(engine_name, accel_name, variant_name)
    encoder_loaded = _encoder_loaded(spec, engine, variant, notes)
    draft = _draft(spec, engine_name)

    layouts = _candidate_layouts(spec, strategy, floor_gpus, engine, accel)
    fits = [
        evaluate(Layout(strategy, tp, dp, dtype, pp), variant, engine, accel, encoder_loaded, max_len, draft)
        for tp, dp, pp in layouts
        for dtype in kv_dtypes
    ]
    need = spec.context.min_sequences_at_max_len
    chosen = next((f for f in fits if f.sequences_at(max_len) >= need), None)
    if chosen is None:
        lighter = _one_node_variants(spec, strategy, engine, accel, variant, encoder_loaded, draft)
        raise _infeasible(spec, strategy, fits, engine, accel, lighter)

    layout = chosen.layout
    if (
        floor_gpus > 1
        and layout.world == floor_gpus
        and _smaller_would_fit(spec, strategy, floor_gpus, kv_dtypes, variant, engine, accel, encoder_loaded, draft)
    ):
        notes.append(f"kept {floor_gpus} GPUs although memory alone allows fewer: {floor_reason}")
    if KvCacheDtype(spec.context.kv_cache_dtype) == KvCacheDtype.AUTO and layout.kv_dtype == KvCacheDtype.FP8:
        notes.append("kvCacheDtype auto chose fp8: bf16 KV would need more GPUs for this context")

    gpus_per_node = min(layout.world, accel.gpus_per_node)
    nodes = math.ceil(layout.world / accel.gpus_per_node)
    cpu, memory_gib = _pod_resources(spec, accel, gpus_per_node)
    validated = _is_validated(engine_name, accel_name, variant_name, layout, nodes)
    if draft is not None:
        notes.extend(_speculative_notes(spec, draft, chosen))
        validated = validated and (engine_name, draft.method) in RECIPES
    if not validated:
        notes.append("this shape is not one a published recipe runs; it is planned from memory arithmetic")
    if strategy == Strategy.DP_EP:
        notes.append(
            f"dp-ep: each of the {layout.dp} DP ranks holds only its own sequences "
            f"({chosen.tokens_per_rank} KV tokens per rank)"
        )
    if nodes > 1:
        notes.append(f"one replica spans {nodes} nodes ({gpus_per_node} GPUs each) as a LeaderWorkerSet group")
        if _weights_fill_a_node(fits, accel):
            lighter = _one_node_variants(spec, strategy, engine, accel, variant, encoder_loaded, draft)
            notes.append(
                f"the {variant_name.value} weights ({variant.weights_gb:.0f} GB) leave no KV cache room on one "
                f"{accel_name.value} node ({accel.gpus_per_node} x {accel.memory_gib:.0f} GiB)"
                + (f": variant {' or '.join(lighter)} serves this context on one node" if lighter else "")
            )
        notes.extend(_multi_node_notes(spec, engine, accel, layout, nodes))
    notes.extend(engine.deviations.get(accel_name, ()))
    notes.extend(_caveats(engine_name, accel, variant, layout))
    cache = spec.model.cache_ref
    if cache is not None:
        notes.append(
            f"weights from the node-local copy of MiniMaxM3ModelCache {cache.name} (nodeAffinity "
            f"{cache.node_affinity}: "
            + (
                "pods run only on nodes holding a verified copy)"
                if cache.node_affinity == "Required"
                else "pods prefer nodes holding a verified copy, else load from spec.model.source)"
            )
        )

    return Plan.model_validate(
        {
            "engine": engine_name,
            "accelerator": accel_name,
            "variant": variant_name,
            "checkpoint": spec.model.checkpoint or variant.checkpoint,
            "image": spec.engine.image or engine.images[accel_name],
            "strategy": strategy,
            "tensorParallelSize": layout.tp,
            "dataParallelSize": layout.dp,
            "pipelineParallelSize": layout.pp,
            # The experts of a stage are sharded over that stage's ranks (vLLM/SGLang: EP group = TP x DP).
            "expertParallelSize": layout.tp * layout.dp if layout.expert_parallel else 1,
            "gpusPerNode": gpus_per_node,
            "gpusPerReplica": layout.world,
            "nodesPerReplica": nodes,
            "cpuPerPod": cpu,
            "memoryGiBPerPod": memory_gib,
            "gpuMemoryUtilization": engine.memory_fraction[accel_name],
            "maxModelLen": max_len,
            "nativeMaxModelLen": variant.native_max_model_len,
            "kvCacheDtype": layout.kv_dtype,
            "ropeScalingFactor": rope_factor,
            "weightsGiBPerGPU": round(chosen.weights_gib_per_gpu, 1),
            "kvCacheGiBPerGPU": round(chosen.kv_gib_per_gpu, 1),
            "kvBytesPerTokenPerGPU": chosen.kv_bytes_per_token_per_gpu,
            "kvCacheTokensPerRank": chosen.tokens_per_rank,
            "kvCacheTokensPerReplica": chosen.tokens_per_replica,
            "maxSequencesAtMaxLen": chosen.sequences_at(max_len),
            "validated": validated,
            "speculativeDecoding": _speculative_plan(spec, draft, chosen, spec.model.checkpoint or variant.checkpoint),
            "notes": notes,
            "modelCache": cache.name if cache is not None else None,
            "modelCacheNodeAffinity": cache.node_affinity if cache is not None else None,
        }
    )


# --- the serving path (spec.gateway) -----------------------------------------------------------


def tier_spec(spec: MiniMaxM3DeploymentSpec, tier: ContextTier) -> MiniMaxM3DeploymentSpec:
    """The spec a context tier is planned, rendered and autoscaled from: the fleet's, at the tier's context,
    parallelism, replicas and replica bounds (absent bounds are spec.autoscaling's), without tiers of its own and
    without spec.autoscaling.schedule (its windows count the spec's own tier's replicas)."""
    gateway = spec.gateway.model_copy(update={"tiers": []}) if spec.gateway is not None else None
    scaling = spec.autoscaling
    bounds = {
        "min_replicas": scaling.min_replicas if tier.min_replicas is None else tier.min_replicas,
        "max_replicas": scaling.max_replicas if tier.max_replicas is None else tier.max_replicas,
        "schedule": [],
    }
    return spec.model_copy(
        update={
            "context": spec.context.model_copy(update={"max_model_len": tier.max_model_len}),
            "parallelism": tier.parallelism or spec.parallelism,
            "replicas": tier.replicas,
            "autoscaling": scaling.model_copy(update=bounds),
            "gateway": gateway,
        }
    )


def plan_tier(spec: MiniMaxM3DeploymentSpec, index: int) -> Plan:
    """The plan of spec.gateway.tiers[index], or a SpecError naming that tier."""
    if spec.gateway is None:
        raise ValueError("plan_tier needs spec.gateway")
    tier = spec.gateway.tiers[index]
    try:
        return _plan_replica(tier_spec(spec, tier))
    except SpecError as exc:
        field = f"spec.gateway.tiers[{index}]"
        raise SpecError(
            field,
            f"(tier {tier.name}, maxModelLen {tier.max_model_len}) cannot be planned: {exc.problem}",
            f"{exc.fix}; for this tier, set {field}.parallelism or change its maxModelLen",
        ) from None


def picker_scorers(engine: EngineName) -> list[str]:
    """The endpoint picker's scorers for this engine: prefix-cache only where the engine reuses prefixes."""
    fit = PICKER_FITS[engine]
    return [*([PREFIX_SCORER] if fit.prefix_reuse else []), KV_SCORER, QUEUE_SCORER]


def _tier_plan(name: str, planned: Plan) -> TierPlan:
    return TierPlan.model_validate(
        {"name": name, **planned.model_dump(by_alias=True, include=set(TierPlan.model_fields) - {"name"})}
    )


def _gateway_plan(
    spec: MiniMaxM3DeploymentSpec, gateway: InferenceGatewaySpec, main: Plan
) -> tuple[GatewayPlan, list[str]]:
    """The pool, its picker and the tiers (each planned as the spec at the tier's context), and the plan's notes."""
    tiers = [_tier_plan(t.name, plan_tier(spec, i)) for i, t in enumerate(gateway.tiers)]
    tiers = [*sorted(tiers, key=lambda t: t.max_model_len), _tier_plan(MAIN_TIER, main)]
    ref = gateway.gateway_ref
    engine = EngineName(main.engine)
    notes = [f"gateway: {PICKER_FITS[engine].reason}"]
    if len(tiers) > 1:
        contexts = ", ".join(f"{t.name} {format_tokens(t.max_model_len)}" for t in tiers)
        notes.append(f"gateway: each request goes to the smallest context tier that fits it ({contexts})")
    return GatewayPlan(
        gateway=f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name,
        endpoint_picker_image=gateway.endpoint_picker.image or EPP_IMAGE,
        scorers=picker_scorers(engine),
        filters=[CONTEXT_TIER_FILTER] if len(tiers) > 1 else [],
        tiers=tiers,
    ), notes


def _draft(spec: MiniMaxM3DeploymentSpec, engine: EngineName) -> DraftFacts | None:
    """The draft spec.speculativeDecoding asks for, or SpecError where the engine does not serve it (the CRD's CEL
    refuses the same at admission)."""
    wanted = spec.speculative_decoding
    if wanted is None:
        return None
    method = SpeculativeMethod(wanted.method)
    if method not in SERVED[engine]:
        others = [e.value for e, methods in SERVED.items() if method in methods]
        raise SpecError(
            "spec.speculativeDecoding.method",
            f"{method.value} {UNSERVED_REASONS[engine]}",
            f"remove speculativeDecoding, or use engine {' or '.join(others)}",
        )
    return DRAFTS[method]


def _speculative_notes(spec: MiniMaxM3DeploymentSpec, draft: DraftFacts, fit: Fit) -> list[str]:
    notes = [
        f"speculative decoding {draft.method.value}: the draft takes {fit.draft_weights_gib_per_gpu:.1f} GiB and "
        f"{fit.draft_kv_bytes_per_token_per_gpu} KV bytes per token on each GPU (counted above); the autoscaler "
        f"assumes {draft.acceptance_length_prior} tokens per forward pass until the engine's counters measure it"
    ]
    wanted = spec.speculative_decoding
    hub_draft = draft.default_model is not None and not (wanted and wanted.draft_model.startswith("/"))
    if hub_draft:
        notes.append(
            "the draft model is fetched from Hugging Face when the engine starts: the pods need the Hub (and HF_TOKEN "
            "for a gated draft), or set speculativeDecoding.draftModel to a path on a podTemplate volume"
        )
    return notes


def _speculative_plan(
    spec: MiniMaxM3DeploymentSpec, draft: DraftFacts | None, fit: Fit, checkpoint: str
) -> dict[str, object] | None:
    wanted = spec.speculative_decoding
    if wanted is None or draft is None:
        return None
    return {
        "method": draft.method,
        "draftModel": wanted.draft_model or draft.default_model or checkpoint,
        "numSpeculativeTokens": wanted.num_speculative_tokens or draft.default_tokens,
        "draftWeightsGiBPerGPU": round(fit.draft_weights_gib_per_gpu, 1),
        "draftKvBytesPerTokenPerGPU": fit.draft_kv_bytes_per_token_per_gpu,
        "acceptanceLengthPrior": draft.acceptance_length_prior,
    }


def _encoder_loaded(
    spec: MiniMaxM3DeploymentSpec, engine: EngineFacts, variant: ModelVariant, notes: list[str]
) -> bool:
    """Whether the vision encoder sits in GPU memory: what `languageModelOnly` really does on this engine."""
    if not spec.model.language_model_only:
        return True
    if engine.language_model_only == "unsupported":
        checkpoint = spec.model.checkpoint or variant.checkpoint
        raise SpecError(
            "spec.model.languageModelOnly",
            f"{engine.name.value} {engine.version} cannot leave out MiniMax-M3's vision encoder: it serves the "
            "text-only MiniMaxM3SparseForCausalLM only for a checkpoint whose config.json names that architecture, "
            f"{checkpoint} names MiniMaxM3SparseForConditionalGeneration, and trtllm-serve has no option to "
            "override it",
            "set languageModelOnly false (text requests are served either way; the encoder's ~1.2 GB per GPU stays "
            "loaded), or use engine vllm, which skips the encoder",
        )
    if engine.language_model_only == "refuses_media":
        notes.append(
            f"languageModelOnly on {engine.name.value} {engine.version}: image and video requests are refused "
            "(--language-model-only), but its MiniMax-M3 model still builds and loads the vision tower, so the "
            "plan counts its memory"
        )
        return True
    return False


def _pod_resources(spec: MiniMaxM3DeploymentSpec, accel: AcceleratorFacts, gpus_per_node: int) -> tuple[int, int]:
    """(CPU cores, memory GiB) of one engine pod: the spec's, or the catalog's per-GPU size times its GPUs."""
    asked = spec.node_pool.resources
    default_memory = accel.memory_gib_per_gpu * gpus_per_node
    if 0 < asked.memory_gib < MIN_POD_MEMORY_GIB:
        raise SpecError(
            "spec.nodePool.resources.memoryGiB",
            f"{asked.memory_gib} GiB cannot hold the engine pod's memory-backed /dev/shm ({POD_SHM_GIB} GiB, "
            "counted against the pod's memory limit) plus the engine's own processes",
            f"use at least {MIN_POD_MEMORY_GIB}, or 0 for the catalog's {default_memory} GiB on {accel.name.value}",
        )
    cpu = asked.cpu or accel.cpu_per_gpu * gpus_per_node
    return cpu, asked.memory_gib or max(default_memory, MIN_POD_MEMORY_GIB)


def _has_rdma(spec: MiniMaxM3DeploymentSpec) -> bool:
    return any(marker in name.lower() for name in spec.node_pool.extra_resources for marker in RDMA_RESOURCE_MARKERS)


def _multi_node_notes(
    spec: MiniMaxM3DeploymentSpec, engine: EngineFacts, accel: AcceleratorFacts, layout: Layout, nodes: int
) -> list[str]:
    notes: list[str] = []
    name = engine.name.value
    if layout.pp > 1:
        notes.append(
            f"tensor parallel {layout.tp} within each node, pipeline parallel {layout.pp} across the {nodes} nodes "
            f"({name}'s MiniMax-M3 model implements pipeline parallelism): only activations cross the network "
            f"between stages, where TP{layout.world} would all-reduce across it in every layer"
        )
    elif layout.strategy != Strategy.DP_EP and not accel.nvlink_spans_nodes:
        why = (
            "tensorParallelSize is set; leave it 0 to get TP within a node and PP across nodes"
            if engine.pipeline_parallel
            else f"{name}'s MiniMax-M3 deployment guide documents no pipeline parallelism (TEP or DEP only)"
        )
        notes.append(
            f"tensor parallel {layout.tp} spans {nodes} nodes without NVLink between them, so every layer's "
            f"all-reduce crosses the network: {why}"
        )
    if not _has_rdma(spec):
        if accel.nvlink_spans_nodes:
            notes.append(
                "no RDMA resource in nodePool.extraResources: NCCL runs over multi-node NVLink (the IMEX "
                "ComputeDomain); any other traffic between the nodes goes over TCP through the pod network"
            )
        else:
            notes.append(
                "no RDMA resource in nodePool.extraResources: inter-node traffic (NCCL and the engine's own) goes "
                'over TCP through the pod network, which is slow for a model this size: add e.g. {"rdma/ib": 1}'
            )
    return notes


def _check_extra_resources(spec: MiniMaxM3DeploymentSpec, accel: AcceleratorFacts) -> None:
    """GPUs per pod are the plan's (from the parallelism): extraResources naming a GPU resource would ask for a
    count no node of the pool may have (more GPUs than the pool's nodes hold, or a second kind of GPU)."""
    gpu_resources = {a.resource_name for a in ACCELERATORS.values()}
    for name in sorted(set(spec.node_pool.extra_resources) & gpu_resources):
        raise SpecError(
            f"spec.nodePool.extraResources[{name}]",
            f"GPUs are the plan's: each {accel.name.value} pod holds up to {accel.gpus_per_node} {accel.resource_name} "
            "(what spec.parallelism needs per node)",
            "remove it; choose GPUs per replica with spec.parallelism (tensorParallelSize, dataParallelSize)",
        )


def _check_support(engine: EngineFacts, accel: Accelerator, variant: Variant) -> None:
    if accel not in engine.support:
        runs_on = ", ".join(a.value for a in engine.support)
        raise SpecError(
            "spec.accelerator",
            f"engine {engine.name.value} does not run on {accel.value}",
            f"use accelerator {runs_on}, or another engine",
        )
    if variant not in engine.support[accel]:
        others = [e.name.value for e in ENGINES.values() if variant in e.support.get(accel, ())]
        hint = f", or engine {' or '.join(others)}" if others else ""
        known_reason = engine.unserved_variants.get(variant) or engine.pool_limits.get(accel)
        raise SpecError(
            "spec.model.variant",
            f"{variant.value} is not served by {engine.name.value} on {accel.value}"
            + (f": {known_reason}" if known_reason else ""),
            f"use variant {' or '.join(v.value for v in engine.support[accel])}{hint}",
        )


def _resolve_strategy(spec: MiniMaxM3DeploymentSpec) -> Strategy:
    requested = Strategy(spec.parallelism.strategy)
    strategy = Strategy.TP if requested == Strategy.AUTO else requested
    if strategy != Strategy.DP_EP and spec.parallelism.data_parallel_size > 1:
        raise SpecError(
            "spec.parallelism.dataParallelSize",
            f"{spec.parallelism.data_parallel_size} needs attention data parallelism, but strategy is "
            f"{requested.value}",
            "set parallelism.strategy dp-ep, or dataParallelSize 0",
        )
    return strategy


def _long_context_engines(accel: AcceleratorFacts, max_len: int) -> str:
    """Where a context past the bf16 checkpoint's native window can be served on this accelerator: engines
    that apply YaRN there, or a natively longer variant an engine serves there."""
    options = [f"engine {e.name.value}" for e in ENGINES.values() if accel.vendor in e.yarn_vendors]
    for engine in ENGINES.values():
        if accel.vendor in engine.yarn_vendors:
            continue  # any variant already works there
        for variant in VARIANTS.values():
            if variant.native_max_model_len >= max_len and variant.name in engine.support.get(accel.name, ()):
                options.append(f"engine {engine.name.value} with model.variant {variant.name.value}")
    return ", ".join(options[:-1]) + (" or " if len(options) > 1 else "") + options[-1] if options else "none does"


def _rope_scaling(
    engine: EngineFacts, accel: AcceleratorFacts, variant: ModelVariant, max_len: int, notes: list[str]
) -> float:
    native = variant.native_max_model_len
    if max_len <= native:
        return 1.0
    if engine.name == EngineName.TRTLLM:
        raise SpecError(
            "spec.context.maxModelLen",
            f"{max_len} is past the {variant.name.value} checkpoint's native {native} tokens, and the pinned "
            "TensorRT-LLM release documents no YaRN path for MiniMax-M3",
            f"lower maxModelLen to {native} or less, or use an engine that serves it on {accel.name.value}: "
            + _long_context_engines(accel, max_len),
        )
    if accel.vendor not in engine.yarn_vendors:
        longer = [
            v.name.value
            for v in VARIANTS.values()
            if v.native_max_model_len >= max_len and v.name in engine.support.get(accel.name, ())
        ]
        others = [e.name.value for e in ENGINES.values() if accel.vendor in e.yarn_vendors]
        fixes = [f"lower maxModelLen to {native} or less"]
        fixes += [f"use variant {v} (native {VARIANTS[Variant(v)].native_max_model_len})" for v in longer]
        fixes += [f"use engine {e}" for e in others]
        raise SpecError(
            "spec.context.maxModelLen",
            f"{max_len} is past the {variant.name.value} checkpoint's native {native} tokens, and "
            f"{engine.name.value} {engine.version}'s MiniMax-M3 model on {accel.vendor.upper()} GPUs ignores "
            "rope_scaling (it builds RoPE from rope_theta alone, sized to the native context), so YaRN cannot "
            "extend it",
            ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + fixes[-1],
        )
    # Round the factor up to 1/100 so factor x native always covers the asked context.
    factor = math.ceil(max_len / native * 100) / 100
    notes.append(f"maxModelLen {max_len} is past the checkpoint's native {native}: YaRN rope scaling factor {factor}")
    return factor


def _kv_dtype_candidates(
    spec: MiniMaxM3DeploymentSpec, engine: EngineName, variant: ModelVariant, notes: list[str]
) -> list[KvCacheDtype]:
    asked = KvCacheDtype(spec.context.kv_cache_dtype)
    if engine == EngineName.TRTLLM:
        if asked == KvCacheDtype.FP8:
            raise SpecError(
                "spec.context.kvCacheDtype",
                "fp8 KV is not supported for MiniMax-M3 by the pinned TensorRT-LLM release (KV stays BF16)",
                "set kvCacheDtype auto or bf16, or use engine vllm",
            )
        return [KvCacheDtype.BF16]
    if asked == KvCacheDtype.FP8 and not variant.kv_scales_calibrated:
        notes.append(
            f"{variant.checkpoint} ships no calibrated KV scales: fp8 KV runs with scale 1.0; validate accuracy"
        )
    if asked != KvCacheDtype.AUTO:
        return [asked]
    if not variant.kv_scales_calibrated:
        return [KvCacheDtype.BF16]
    return [KvCacheDtype.BF16, KvCacheDtype.FP8]


def _floor(engine: EngineName, accel: Accelerator, variant: Variant) -> tuple[int, str]:
    for floor in FLOORS:
        if floor.accelerator == accel and floor.variant == variant and floor.engine in (None, engine):
            return floor.min_gpus, floor.reason
    return 1, ""


def _explicit(spec: MiniMaxM3DeploymentSpec, strategy: Strategy) -> bool:
    """The user fixed the world size: DP for dp-ep (TP defaults to 1), TP otherwise."""
    if strategy == Strategy.DP_EP:
        return spec.parallelism.data_parallel_size > 0
    return spec.parallelism.tensor_parallel_size > 0


def pipeline_across_nodes(engine: EngineFacts, accel: AcceleratorFacts, strategy: Strategy) -> bool:
    """A replica larger than a node runs one pipeline stage per node: the engine's M3 model supports it, the
    nodes are not one NVLink domain, and attention is tensor parallel (dp-ep shards experts across all ranks)."""
    return engine.pipeline_parallel and not accel.nvlink_spans_nodes and strategy != Strategy.DP_EP


def _candidate_layouts(
    spec: MiniMaxM3DeploymentSpec, strategy: Strategy, floor_gpus: int, engine: EngineFacts, accel: AcceleratorFacts
) -> list[tuple[int, int, int]]:
    """(TP, DP, PP), smallest world first, honouring explicit sizes and the recipe floor. Without an explicit
    size, a world larger than a node is TP = the node's GPUs x PP = nodes where `pipeline_across_nodes`."""
    tp_asked = spec.parallelism.tensor_parallel_size
    dp_asked = spec.parallelism.data_parallel_size
    per_node = accel.gpus_per_node
    if strategy == Strategy.DP_EP:
        tp = tp_asked or 1
        dps = [dp_asked] if dp_asked else [d for d in PARALLEL_CANDIDATES if tp * d in PARALLEL_CANDIDATES]
        pairs = [(tp, dp, 1) for dp in dps]
    elif tp_asked:
        pairs = [(tp_asked, 1, 1)]
    elif pipeline_across_nodes(engine, accel, strategy):
        pairs = [(per_node, 1, t // per_node) if t > per_node else (t, 1, 1) for t in PARALLEL_CANDIDATES]
    else:
        pairs = [(t, 1, 1) for t in PARALLEL_CANDIDATES]
    if _explicit(spec, strategy):
        world = pairs[0][0] * pairs[0][1]
        if world < floor_gpus:
            field = (
                "spec.parallelism.dataParallelSize"
                if strategy == Strategy.DP_EP
                else ("spec.parallelism.tensorParallelSize")
            )
            _, reason = _floor(EngineName(spec.engine.name), Accelerator(spec.accelerator), Variant(spec.model.variant))
            raise SpecError(
                field,
                f"{world} GPUs per replica is below the published minimum of {floor_gpus}: {reason}",
                f"use {floor_gpus} or more GPUs per replica, or leave the sizes 0",
            )
        return pairs
    return [p for p in pairs if p[0] * p[1] * p[2] >= floor_gpus]


def _smaller_would_fit(
    spec: MiniMaxM3DeploymentSpec,
    strategy: Strategy,
    floor_gpus: int,
    kv_dtypes: list[KvCacheDtype],
    variant: ModelVariant,
    engine: EngineFacts,
    accel: AcceleratorFacts,
    encoder_loaded: bool,
    draft: DraftFacts | None,
) -> bool:
    half = floor_gpus // 2
    tp, dp = (spec.parallelism.tensor_parallel_size or 1, half) if strategy == Strategy.DP_EP else (half, 1)
    if tp * dp != half:
        return False
    need = spec.context.min_sequences_at_max_len
    max_len = spec.context.max_model_len
    return any(
        evaluate(Layout(strategy, tp, dp, d), variant, engine, accel, encoder_loaded, max_len, draft).sequences_at(
            max_len
        )
        >= need
        for d in kv_dtypes
    )


def _is_validated(engine: EngineName, accel: Accelerator, variant: Variant, layout: Layout, nodes: int) -> bool:
    return any(
        s.engine == engine
        and s.accelerator == accel
        and s.variant == variant
        and s.strategy == layout.strategy
        and s.tensor_parallel_size == layout.tp
        and s.data_parallel_size == layout.dp
        and layout.pp == 1  # no published M3 recipe uses pipeline parallelism
        and s.nodes == nodes
        for s in VALIDATED_SHAPES
    )


def _caveats(engine: EngineName, accel: AcceleratorFacts, variant: ModelVariant, layout: Layout) -> list[str]:
    notes = [f"GPU memory {accel.memory_gib} GiB per {accel.name.value} is the catalog's estimate (UNVERIFIED)"]
    if not variant.native_context_verified:
        notes.append(f"native context {variant.native_max_model_len} of {variant.checkpoint} is UNVERIFIED")
    if engine != EngineName.VLLM:
        notes.append(f"KV bytes per token follow vLLM's M3 layout; {engine.value}'s own layout is UNVERIFIED")
    return notes


def _weights_fill_a_node(fits: list[Fit], accel: AcceleratorFacts) -> bool:
    """The layouts tried on exactly one node left no KV cache room (the weights alone fill it)."""
    one_node = [f for f in fits if f.layout.world == accel.gpus_per_node and f.layout.pp == 1]
    return bool(one_node) and all(f.kv_gib_per_gpu <= 0 for f in one_node)


def _one_node_variants(
    spec: MiniMaxM3DeploymentSpec,
    strategy: Strategy,
    engine: EngineFacts,
    accel: AcceleratorFacts,
    variant: ModelVariant,
    encoder_loaded: bool,
    draft: DraftFacts | None,
) -> list[str]:
    """Lighter variants the engine serves on this pool that hold the asked context on one node (TP over its GPUs)."""
    max_len, need = spec.context.max_model_len, spec.context.min_sequences_at_max_len
    lighter = [
        VARIANTS[v]
        for v in engine.support[accel.name]
        if VARIANTS[v].weights_gb < variant.weights_gb and max_len <= VARIANTS[v].native_max_model_len
    ]
    tp, dp = (1, accel.gpus_per_node) if strategy == Strategy.DP_EP else (accel.gpus_per_node, 1)
    return [
        v.name.value
        for v in sorted(lighter, key=lambda v: -v.weights_gb)
        if any(
            evaluate(Layout(strategy, tp, dp, kv), v, engine, accel, encoder_loaded, max_len, draft).sequences_at(
                max_len
            )
            >= need
            for kv in ((KvCacheDtype.BF16, KvCacheDtype.FP8) if v.kv_scales_calibrated else (KvCacheDtype.BF16,))
        )
    ]


def _infeasible(
    spec: MiniMaxM3DeploymentSpec,
    strategy: Strategy,
    fits: list[Fit],
    engine: EngineFacts,
    accel: AcceleratorFacts,
    lighter: list[str],
) -> SpecError:
    """Explain the closest miss (the largest layout tried, its best dtype) with numbers and a fix."""
    max_len = spec.context.max_model_len
    need_seqs = spec.context.min_sequences_at_max_len
    explicit = _explicit(spec, strategy)
    if not fits:  # explicit sizes filtered out everything (cannot happen without a floor error) or no candidate
        return SpecError(
            "spec.parallelism",
            "no layout satisfies the parallelism settings",
            "leave tensorParallelSize and dataParallelSize 0",
        )
    largest_world = max(f.layout.world for f in fits)
    best = max((f for f in fits if f.layout.world == largest_world), key=lambda f: f.tokens_per_rank)
    layout = best.layout
    where = (
        f"dataParallelSize {layout.dp} x tensorParallelSize {layout.tp}"
        if strategy == Strategy.DP_EP
        else f"tensorParallelSize {layout.tp} x pipelineParallelSize {layout.pp}"
        if layout.pp > 1
        else f"tensorParallelSize {layout.tp}"
    )
    on = f"on {accel.name.value} ({engine.name.value}, {layout.kv_dtype.value} KV)"
    if best.kv_gib_per_gpu <= 0:
        field = "spec.parallelism.tensorParallelSize" if explicit else "spec.model.variant"
        fix = (
            "leave the parallel sizes 0 so the planner picks enough GPUs"
            if explicit
            else "use a smaller variant (mxfp8) or strategy tp"
        )
        if explicit and lighter:
            fix += f", or use variant {' or '.join(lighter)}, which serves this context on one node"
        return SpecError(
            field,
            f"{where} {on} puts {best.weights_gib_per_gpu:.0f} GiB of weights on each GPU, leaving no room for "
            f"KV cache in {accel.memory_gib:.0f} GiB x {engine.memory_fraction[accel.name]}",
            fix,
        )
    fits_len = (best.tokens_per_rank // need_seqs) // 1024 * 1024
    if strategy == Strategy.DP_EP:
        problem = (
            f"{max_len} needs {format_tokens(max_len)} KV tokens in one DP rank, but with {where} {on} each rank "
            f"holds {format_tokens(best.tokens_per_rank)} (weights are replicated on every rank)"
        )
        fix = f"use strategy tp or tp-ep, or lower maxModelLen to {fits_len} or less"
    else:
        need_tokens = max_len * need_seqs
        problem = (
            f"{max_len} needs {format_tokens(need_tokens)} KV tokens per replica"
            + (f" ({need_seqs} sequences)" if need_seqs > 1 else "")
            + f" but {where} {on} holds {format_tokens(best.tokens_per_replica)}"
        )
        options = []
        if explicit:
            options.append("leave tensorParallelSize 0 so the replica spans more GPUs/nodes")
        if layout.kv_dtype == KvCacheDtype.BF16 and KvCacheDtype(spec.context.kv_cache_dtype) != KvCacheDtype.AUTO:
            options.append("set kvCacheDtype fp8")
        if need_seqs > 1:
            options.append("lower minSequencesAtMaxLen")
        options.append(f"lower maxModelLen to {fits_len} or less" if fits_len > 0 else "lower maxModelLen")
        fix = ", ".join(options[:-1]) + (", or " if len(options) > 1 else "") + options[-1]
    return SpecError("spec.context.maxModelLen", problem, fix)

"""spec.disaggregation -> each role's layout and count, and the prefill:decode ratio. Pure.

Each role is planned as an aggregated replica of its own (the planner's memory arithmetic, `plan_role`), for its
own job:

* a prefill worker holds the prompts it is prefilling or handing over: one prompt of up to maxModelLen per rank
  (minSequencesAtMaxLen 1), and its layout is for compute (TEP by default on TensorRT-LLM);
* a decode worker holds whole sequences: spec.context.minSequencesAtMaxLen of them at maxModelLen, and as many of
  the expected shape as its KV pool takes for its batch (DEP by default on TensorRT-LLM, when a sequence fits one
  rank).

The ratio comes from the engine's time model (`m3fleet.catalog.throughput`) at the expected input and output
lengths: the requests one decode worker completes per second over those one prefill worker prefills at
PREFILL_TARGET_UTILIZATION (headroom so prompts do not queue for their first token). A ratio or role counts the
user pins are kept, unless the prefill workers could not keep up with the decode workers at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from m3fleet.api.models import (
    DecodeRoleSpec,
    DisaggregationPlan,
    DisaggregationSpec,
    MiniMaxM3DeploymentSpec,
    ParallelismSpec,
    Plan,
    RolePlan,
    Strategy,
)
from m3fleet.catalog.dynamo import ACCELERATORS, BACKENDS, DYNAMO_VERSION, DynamoBackend
from m3fleet.catalog.throughput import (
    DECODE_SECONDS_PER_CONTEXT_TOKEN,
    DECODE_SECONDS_PER_SEQUENCE,
    DECODE_STEP_SECONDS,
    MAX_DECODE_BATCH_PER_RANK,
    MULTI_NODE_DECODE_PENALTY,
    MULTI_NODE_EFFICIENCY,
    PREFILL_TOKENS_PER_GPU_SECOND,
)
from m3fleet.errors import SpecError
from m3fleet.text import tokens as format_tokens

Role = Literal["prefill", "decode"]
ROLES: Final[tuple[Role, ...]] = ("prefill", "decode")
# The share of the prefill workers' throughput the derived ratio plans to use: prompts arriving at random queue for
# a prefill worker (on average t/(1-u) in all, M/M/1), so at 0.7 a prompt waits about twice its own prefill time.
PREFILL_TARGET_UTILIZATION: Final = 0.7
FIELD = "spec.disaggregation"


@dataclass(frozen=True)
class Throughput:
    """One worker under the time model, at the expected request shape."""

    tokens_per_second: float  # prompt tokens (prefill) or output tokens (decode)
    requests_per_second: float
    reasoning: str


def plan_disaggregated(spec: MiniMaxM3DeploymentSpec, plan_role: Callable[[MiniMaxM3DeploymentSpec], Plan]) -> Plan:
    """The plan of a resource with spec.disaggregation: one decode worker's layout at the top (what spec.replicas
    counts), both roles and the ratio under `disaggregation`. `plan_role` plans one aggregated replica. With
    spec.autoscaling the counts are where the autoscaler starts: it scales each role on its own signal."""
    wanted = spec.disaggregation
    if wanted is None:
        raise ValueError("plan_disaggregated needs spec.disaggregation")
    backend = _backend(spec)
    role_plans = plan_roles(spec, plan_role)
    prefill, decode = role_plans["prefill"], role_plans["decode"]
    rates = {
        "prefill": _prefill_rate(prefill, wanted.input_tokens),
        "decode": _decode_rate(decode, wanted.input_tokens, wanted.output_tokens),
    }
    derived = rates["decode"].requests_per_second / (rates["prefill"].requests_per_second * PREFILL_TARGET_UTILIZATION)
    decode_count = spec.replicas  # the scale subresource's field: kubectl scale and status.replicas agree
    prefill_count = _prefill_count(wanted, decode_count, derived)
    utilization = _utilization(decode_count, prefill_count, rates)
    _check_pinned(wanted, decode_count, prefill_count, utilization, rates)
    ratio = wanted.ratio or _ratio_text(prefill_count, decode_count)
    reasoning = [
        rates["prefill"].reasoning,
        rates["decode"].reasoning,
        f"derived ratio: {_num(rates['decode'].requests_per_second)} req/s per decode worker / "
        f"({_num(rates['prefill'].requests_per_second)} req/s per prefill worker x {PREFILL_TARGET_UTILIZATION} "
        f"target utilisation) = {derived:.2f} prefill workers per decode worker",
        _in_force(wanted, decode_count, prefill_count, ratio, derived, utilization),
    ]
    record = {
        "renderAs": str(wanted.render_as),
        "transfer": str(wanted.transfer),
        "dynamoVersion": DYNAMO_VERSION,
        "image": spec.engine.image or backend.image,
        "inputTokens": wanted.input_tokens,
        "outputTokens": wanted.output_tokens,
        "ratio": ratio,
        "derivedRatio": round(derived, 3),
        "prefillUtilization": round(utilization, 3) if math.isfinite(utilization) else 0.0,
        "frontendReplicas": wanted.frontend.replicas,
        "prefill": _role_record(prefill, prefill_count, rates["prefill"], "prefill"),
        "decode": _role_record(decode, decode_count, rates["decode"], "decode"),
        "reasoning": reasoning,
    }
    notes = [
        f"disaggregated on NVIDIA Dynamo {DYNAMO_VERSION} ({backend.module}, {backend.engine} "
        f"{backend.engine_version}): {prefill_count} prefill and {decode_count} decode workers ({ratio}) behind "
        f"{wanted.frontend.replicas} frontend(s) with the KV router; KV over {wanted.transfer}",
        "the fields above describe one decode worker; disaggregation.prefill the prefill workers",
        *([backend.caveat] if backend.caveat else []),
        *decode.notes,
    ]
    return decode.model_copy(
        update={
            "image": spec.engine.image or backend.image,
            "validated": False,  # no published disaggregated M3 shape is checked against; the roles say theirs
            "notes": notes[:32],
            "disaggregation": DisaggregationPlan.model_validate(record),
        }
    )


def plan_roles(spec: MiniMaxM3DeploymentSpec, plan_role: Callable[[MiniMaxM3DeploymentSpec], Plan]) -> dict[Role, Plan]:
    """Each role's worker as a replica of its own (what its pods are rendered from), with Dynamo's image."""
    wanted = spec.disaggregation
    if wanted is None:
        raise ValueError("plan_roles needs spec.disaggregation")
    backend = _backend(spec)
    image = spec.engine.image or backend.image
    plans = {
        role: _plan_role(spec, wanted, role, backend, plan_role).model_copy(update={"image": image}) for role in ROLES
    }
    prefill, decode = plans["prefill"], plans["decode"]
    if backend.equal_tp and prefill.tensor_parallel_size != decode.tensor_parallel_size:
        raise SpecError(
            f"{FIELD}.prefill.parallelism.tensorParallelSize",
            f"{prefill.tensor_parallel_size} differs from the decode workers' {decode.tensor_parallel_size}: "
            f"{spec.engine.name} hands the KV over block for block, so both roles need the same TP size",
            "give both roles the same tensorParallelSize, or leave both 0",
        )
    return plans


def prefill_count(d: DisaggregationPlan, decode_replicas: int) -> int:
    """Prefill workers for `decode_replicas` decode workers: the plan's count at the plan's decode count, else the
    ratio in force applied to the new count (the autoscaler's)."""
    if decode_replicas == d.decode.replicas:
        return d.prefill.replicas
    if decode_replicas == 0:
        return 0
    p, q = (int(x) for x in d.ratio.split(":"))
    return max(1, -(-decode_replicas * p // q)) if q else d.prefill.replicas


def _backend(spec: MiniMaxM3DeploymentSpec) -> DynamoBackend:
    if spec.accelerator not in ACCELERATORS:
        raise SpecError(
            "spec.accelerator",
            f"{spec.accelerator}: disaggregation runs on NVIDIA Dynamo {DYNAMO_VERSION}, whose images are built for "
            "NVIDIA GPUs only",
            "use accelerator h200 or gb200, or remove spec.disaggregation to serve aggregated",
        )
    return BACKENDS[spec.engine.name]


def _role_spec(wanted: DisaggregationSpec, role: Role) -> DecodeRoleSpec:
    return wanted.prefill if role == "prefill" else wanted.decode


def _plan_role(
    spec: MiniMaxM3DeploymentSpec,
    wanted: DisaggregationSpec,
    role: Role,
    backend: DynamoBackend,
    plan_role: Callable[[MiniMaxM3DeploymentSpec], Plan],
) -> Plan:
    """One worker of `role` as an aggregated replica of its own; errors name the role's fields."""
    # A role without a layout of its own takes spec.parallelism's.
    own = _role_spec(wanted, role).parallelism
    inherited = own == ParallelismSpec()
    asked = spec.parallelism if inherited else own
    auto = Strategy(asked.strategy) == Strategy.AUTO
    strategy = backend.default_strategy[role] if auto else Strategy(asked.strategy)
    # A prefill worker holds the prompt it prefills (one of up to maxModelLen per rank); a decode worker the
    # sequences the spec asks for.
    sequences = 1 if role == "prefill" else spec.context.min_sequences_at_max_len
    try:
        return plan_role(_role_view(spec, asked, strategy, sequences))
    except SpecError as exc:
        if not (auto and strategy == Strategy.DP_EP):
            raise _for_role(exc, role, inherited) from None
    # DEP needs a whole sequence in one rank: at this context it does not fit, so the role falls back to TEP.
    fallback = plan_role(_role_view(spec, asked, Strategy.TP_EP, sequences))
    note = f"{role}: a {spec.context.max_model_len}-token sequence does not fit one DEP rank, so tp-ep (TEP)"
    return fallback.model_copy(update={"notes": [note, *fallback.notes][:32]})


def _role_view(
    spec: MiniMaxM3DeploymentSpec, asked: ParallelismSpec, strategy: Strategy, sequences: int
) -> MiniMaxM3DeploymentSpec:
    parallelism = asked.model_copy(update={"strategy": strategy})
    context = spec.context.model_copy(update={"min_sequences_at_max_len": sequences})
    return spec.model_copy(update={"parallelism": parallelism, "context": context, "disaggregation": None})


def _for_role(exc: SpecError, role: Role, inherited: bool) -> SpecError:
    """The planner's error about one role's layout, naming the role's own fields (unless it took spec.parallelism)."""
    field = exc.field
    if inherited:
        return SpecError(field, f"{role} workers: {exc.problem}", exc.fix)
    if field.startswith("spec.parallelism"):
        field = f"{FIELD}.{role}.parallelism" + field.removeprefix("spec.parallelism")
    fix = exc.fix.replace("tensorParallelSize", f"disaggregation.{role}.parallelism.tensorParallelSize")
    return SpecError(field, f"{role} workers: {exc.problem}", fix)


def _prefill_rate(plan: Plan, input_tokens: int) -> Throughput:
    per_gpu = PREFILL_TOKENS_PER_GPU_SECOND[str(plan.accelerator)]
    efficiency = MULTI_NODE_EFFICIENCY if plan.nodes_per_replica > 1 else 1.0
    rate = per_gpu * plan.gpus_per_replica * efficiency
    requests = rate / input_tokens
    over = f" x {efficiency} (spans {plan.nodes_per_replica} nodes)" if efficiency < 1 else ""
    return Throughput(
        rate,
        requests,
        f"prefill worker ({_shape(plan)}): {per_gpu:g} prompt tokens/s per GPU x {plan.gpus_per_replica} GPUs{over} "
        f"= {format_tokens(rate)} tokens/s; at {input_tokens}-token prompts {_num(requests)} prompts/s",
    )


def _decode_rate(plan: Plan, input_tokens: int, output_tokens: int) -> Throughput:
    ranks = max(1, plan.data_parallel_size)
    footprint = input_tokens + output_tokens
    batch = max(1, min(MAX_DECODE_BATCH_PER_RANK, plan.kv_cache_tokens_per_rank // footprint))
    context = input_tokens + output_tokens / 2  # a sequence's mean context while it decodes
    penalty = MULTI_NODE_DECODE_PENALTY if plan.nodes_per_replica > 1 else 1.0
    base = DECODE_STEP_SECONDS[str(plan.accelerator)] * penalty
    step = base + batch * (DECODE_SECONDS_PER_SEQUENCE + DECODE_SECONDS_PER_CONTEXT_TOKEN * context)
    rate = ranks * batch / step
    requests = rate / output_tokens
    return Throughput(
        rate,
        requests,
        f"decode worker ({_shape(plan)}): min({MAX_DECODE_BATCH_PER_RANK}, "
        f"{format_tokens(plan.kv_cache_tokens_per_rank)} KV tokens per rank / {footprint}) = {batch} sequences per "
        f"rank; step {base * 1000:.2f} ms + {batch} x ({DECODE_SECONDS_PER_SEQUENCE * 1000:g} ms + {context:g} x "
        f"{DECODE_SECONDS_PER_CONTEXT_TOKEN:g} s) = {step * 1000:.1f} ms (the inter-token latency); {ranks} rank(s) x "
        f"{batch} / step = {format_tokens(rate)} tokens/s; at {output_tokens}-token outputs {_num(requests)} req/s",
    )


def _prefill_count(wanted: DisaggregationSpec, decode_count: int, derived: float) -> int:
    if wanted.prefill.replicas:
        return wanted.prefill.replicas
    if decode_count == 0:
        return 0
    if wanted.ratio:
        p, d = (int(x) for x in wanted.ratio.split(":"))
        return math.ceil(decode_count * p / d)
    return max(1, math.ceil(decode_count * derived - 1e-9))


def _utilization(decode_count: int, prefill_count: int, rates: dict[str, Throughput]) -> float:
    """The share of the prefill workers' throughput the decode workers' completions ask for."""
    if decode_count == 0:
        return 0.0
    if prefill_count == 0:
        return math.inf
    demand = decode_count * rates["decode"].requests_per_second
    return demand / (prefill_count * rates["prefill"].requests_per_second)


def _check_pinned(
    wanted: DisaggregationSpec,
    decode_count: int,
    prefill_count: int,
    utilization: float,
    rates: dict[str, Throughput],
) -> None:
    """A ratio (or prefill count) the user pins stands unless the prefill workers cannot keep up at all: prompts
    would then queue without bound and the decode workers idle."""
    pinned = bool(wanted.ratio or wanted.prefill.replicas)
    if not pinned or utilization <= 1.0:
        return
    need = rates["decode"].requests_per_second / rates["prefill"].requests_per_second
    field = f"{FIELD}.ratio" if wanted.ratio else f"{FIELD}.prefill.replicas"
    if wanted.ratio:
        d = int(wanted.ratio.split(":")[1])
        fix = f"use at least {math.ceil(d * need)}:{d}, or leave ratio empty for the derived one"
    else:
        fix = f"use at least {math.ceil(decode_count * need)} prefill workers, or 0 for the derived count"
    raise SpecError(
        field,
        f"{prefill_count} prefill worker(s) for {decode_count} decode worker(s) prefill "
        f"{_num(prefill_count * rates['prefill'].requests_per_second)} prompts/s of {wanted.input_tokens} tokens, but "
        f"the decode workers complete {_num(decode_count * rates['decode'].requests_per_second)} requests/s "
        f"(prefill utilisation {utilization:.2f} > 1): prompts would queue without bound",
        fix,
    )


def _ratio_text(prefill_count: int, decode_count: int) -> str:
    if decode_count == 0 or prefill_count == 0:
        return f"{prefill_count}:{decode_count}"
    divisor = math.gcd(prefill_count, decode_count)
    return f"{prefill_count // divisor}:{decode_count // divisor}"


def _in_force(
    wanted: DisaggregationSpec, decode_count: int, prefill_count: int, ratio: str, derived: float, utilization: float
) -> str:
    source = f"spec.replicas (decode workers) = {decode_count}"
    if wanted.prefill.replicas:
        how = f"disaggregation.prefill.replicas pins {prefill_count}"
    elif wanted.ratio:
        how = f"the pinned ratio {wanted.ratio} gives {prefill_count}"
    else:
        how = f"x {derived:.2f} rounded up = {prefill_count}"
    load = f"prefill utilisation {utilization:.2f}" if math.isfinite(utilization) else "no prefill worker"
    return f"in force: {source}; prefill workers: {how} ({ratio}, {load})"


def _role_record(plan: Plan, count: int, rate: Throughput, role: Role) -> RolePlan:
    return RolePlan.model_validate(
        {
            "replicas": count,
            "strategy": plan.strategy,
            "tensorParallelSize": plan.tensor_parallel_size,
            "dataParallelSize": plan.data_parallel_size,
            "expertParallelSize": plan.expert_parallel_size,
            "gpusPerNode": plan.gpus_per_node,
            "gpusPerWorker": plan.gpus_per_replica,
            "nodesPerWorker": plan.nodes_per_replica,
            "kvCacheTokensPerRank": plan.kv_cache_tokens_per_rank,
            "kvCacheTokensPerWorker": plan.kv_cache_tokens_per_replica,
            "holds": (
                f"prompts in flight: one of up to {plan.max_model_len} tokens per rank"
                if role == "prefill"
                else f"whole sequences: {plan.max_sequences_at_max_len} at {plan.max_model_len} tokens"
            ),
            "tokensPerSecond": round(rate.tokens_per_second, 1),
            "requestsPerSecond": round(rate.requests_per_second, 4),
            "validated": plan.validated,
        }
    )


def _shape(plan: Plan) -> str:
    names = {Strategy.TP_EP: "TEP", Strategy.DP_EP: "DEP", Strategy.TP: "TP"}
    strategy = Strategy(plan.strategy)
    size = (
        plan.data_parallel_size * plan.tensor_parallel_size if strategy == Strategy.DP_EP else plan.tensor_parallel_size
    )
    where = f"{plan.gpus_per_replica} GPUs on {plan.nodes_per_replica} node(s)"
    return f"{names.get(strategy, str(strategy))}{size}, {where}"


def _num(value: float) -> str:
    return f"{value:.3g}"

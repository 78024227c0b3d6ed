"""Measured throughput replaces the simulator's assumed one: `m3fleet simulate --throughput-from RESULT`. Pure.

`PerfModel.from_plan` assumes per-accelerator speeds (UNVERIFIED, not calibrated on hardware). An
`m3fleet bench` result measured the same deployment: per concurrency, the median time per output token
(TPOT) at a known batch and context, and the median time to first token (TTFT) for a known prompt length.

A first-order fit that keeps the model's shape and replaces its level:

* decode: each run's TPOT over the model's inter-token time for that run (batch = concurrency per engine,
  i.e. over ready replicas x DP ranks; context = mean prompt + half the mean output). The median ratio
  scales every decode term (step, per sequence, per context token);
* prefill: the lowest-concurrency run's median TTFT (least queueing) per prompt token over the model's
  compute per token of its mean prompt scales both prefill terms (linear and the MSA indexer's quadratic).

TTFT also holds queueing and TPOT prefill interruptions, so the fit errs slow: a conservative prior. The
fit refuses a result measured on another shape (engine, accelerator, variant, TP, DP, nodes per replica).
"""

from __future__ import annotations

import statistics
from typing import Any, Final

from m3fleet.api.models import Plan
from m3fleet.bench.results import BenchResult, RunSummary
from m3fleet.errors import SpecError
from m3fleet_simulator.fleet import PerfModel

SHAPE: Final = ("engine", "accelerator", "variant", "tensorParallelSize", "dataParallelSize", "nodesPerReplica")
SCALE_LIMITS: Final = (0.01, 100.0)  # beyond these the result measured something else (an error page, a proxy)


def _shape(plan: dict[str, Any]) -> str:
    return (
        f"{plan.get('engine')} on {plan.get('accelerator')} {plan.get('variant')}, TP{plan.get('tensorParallelSize')} "
        f"x DP{plan.get('dataParallelSize')}, {plan.get('nodesPerReplica')} node(s)"
    )


def _decode_ratio(model: PerfModel, run: RunSummary, engines: int) -> float:
    batch = max(1.0, run.concurrency / engines)
    context = run.mean_input_len + run.mean_output_len / 2
    per_sequence = model.verified_per_step * model.decode_per_sequence + model.decode_per_context_token * context
    step = model.decode_step + batch * per_sequence
    predicted = step / model.tokens_per_step  # TPOT is per output token; a step emits tokens_per_step of them
    return (run.tpot.median / 1000) / predicted


def _prefill_ratio(model: PerfModel, run: RunSummary) -> float:
    prompt = max(1.0, run.mean_input_len)
    return (run.ttft.median / 1000 / prompt) / model.token_cost(prompt)


def calibrate(model: PerfModel, plan: Plan, result: BenchResult, source: str) -> tuple[PerfModel, dict[str, Any]]:
    """The model with measured decode and prefill speed, and what was done (for the report)."""
    planned = plan.model_dump(by_alias=True, mode="json")
    if any(str(planned[k]) != str(result.plan.get(k)) for k in SHAPE):
        raise SpecError(
            "--throughput-from",
            f"{source} was measured on {_shape(result.plan)}, but the simulated resource plans {_shape(planned)}",
            "benchmark this deployment with m3fleet bench, or drop -f to simulate the benchmarked one",
        )
    runs = [r for r in result.runs if r.completed > 0 and r.tpot.median > 0 and r.ttft.median > 0]
    if not runs:
        raise SpecError("--throughput-from", f"{source} has no run with completed requests", "benchmark again")
    engines = max(1, result.ready_replicas) * max(1, plan.data_parallel_size)
    decode = statistics.median(_decode_ratio(model, r, engines) for r in runs)
    lowest = min(runs, key=lambda r: r.concurrency)
    prefill = _prefill_ratio(model, lowest)
    low, high = SCALE_LIMITS
    for name, value in (("decode", decode), ("prefill", prefill)):
        if not low <= value <= high:
            raise SpecError(
                "--throughput-from",
                f"{source} puts {name} at {value:.3g}x the model's speed, outside {low:g}..{high:g}x",
                "check the benchmark's table (failed requests, a wrong endpoint) and benchmark again",
            )
    calibrated = model.scaled(prefill=prefill, decode=decode)
    described = {
        "source": source,
        "measured": {
            "resource": f"{result.resource.get('namespace')}/{result.resource.get('name')}",
            "job": result.job,
            "completionTime": result.finished,
            "client": result.target.get("client"),
            "readyReplicas": result.ready_replicas,
            "concurrency": [r.concurrency for r in runs],
        },
        "method": "decode terms x median(measured TPOT / modelled inter-token time) over runs; prefill terms x "
        "(measured median TTFT per prompt token / modelled compute per prompt token) at the lowest concurrency",
        "decodeScale": round(decode, 4),
        "prefillScale": round(prefill, 4),
        "prefillFromConcurrency": lowest.concurrency,
    }
    return calibrated, described

"""`python -m tests.bench.disaggregation [--seeds LIST] [--isl 8k,32k,128k] [--loads 0.4,0.7,0.9] [--units N]
[--link ib|nvlink] [--no-sweep] [-o json|table]`.

Aggregated vs disaggregated prefill/decode serving of TensorRT-LLM on GB200 (the combination for which NVIDIA's M3
blog reports 4x interactivity at 32k), on the same GPU count, side by side per seed, through the simulator's engine
model (simulator/m3fleet_simulator/disagg.py).

* Layouts from the planner: the TensorRT-LLM GB200 sample (2 nodes x 4 GB200, TEP8) planned at the workload's
  context (maxModelLen = input + output rounded up to a power of two, as a fleet for that workload would be set);
  the engine's batch and token budget are the ones m3fleet renders for that plan (engines/trtllm.llm_api_options:
  max_batch_size, max_num_tokens with chunked prefill), and the same 8 GPUs planned with attention data
  parallelism (DEP8, the guide's reference layout). Aggregated: `--units` replicas of TEP8, or of DEP8.
  Disaggregated: P prefill workers of TEP8 (the guide's context layout) and D decode workers of TEP8 or of DEP8
  (the guide's generation layout), P + D = units.
* The default P:D split comes from the planner (spec.disaggregation at the workload's input and output lengths,
  each pairing's decode layout): its derived ratio r of prefill workers per decode worker gives D = floor(units /
  (1 + r)) decode workers and the rest prefill; `--no-sweep` skips the sweep of every P:D with P + D = units at the
  middle load.
* Workload: Poisson arrivals for `--minutes` at a share (`--loads`) of the aggregated fleet's fluid capacity, every
  request `--isl` input and 1024 output tokens. The SLO is the resource's default, judged against the aggregated
  replica's unloaded times for both fleets.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass, replace
from typing import Any, Final

from m3fleet.api.models import MiniMaxM3DeploymentSpec, Plan, SloSpec
from m3fleet.engines import trtllm
from m3fleet.engines.base import Context
from m3fleet.planner import plan as make_plan
from m3fleet_simulator.disagg import LINKS, DisaggregatedSimulation, KvTransfer, aggregated, kv_bytes_per_token
from m3fleet_simulator.fleet import PerfModel
from m3fleet_simulator.scenarios import MINUTE, Request

from ..tables import load_spec, parse_seeds, table

SAMPLE: Final = "trtllm-gb200-2x4-tep.yaml"
ISL: Final = {"8k": 8192, "32k": 32768, "128k": 128_000}
OSL: Final = 1024
TAIL_SECONDS: Final = 900.0


@dataclass(frozen=True)
class Role:
    spec: MiniMaxM3DeploymentSpec
    plan: Plan
    model: PerfModel

    @classmethod
    def planned(cls, context: int, strategy: str) -> Role:
        spec = load_spec(SAMPLE, {"context.maxModelLen": context, "parallelism.strategy": strategy})
        plan = make_plan(spec)
        options = trtllm.llm_api_options(Context("bench", "bench", spec, plan))
        model = replace(
            PerfModel.from_plan(plan), token_budget=options["max_num_tokens"], max_num_seqs=options["max_batch_size"]
        )
        return cls(spec, plan, model)

    def batch(self, isl: int) -> int:
        return max(1, min(self.model.max_num_seqs, self.model.capacity_tokens // (isl + OSL)))

    def decode_seconds_per_request(self, isl: int) -> float:
        """A request's share of one replica's decode time at a full batch (all its DP ranks together)."""
        m, batch = self.model, self.batch(isl)
        step = m.decode_step + batch * (m.decode_per_sequence + m.decode_per_context_token * (isl + OSL / 2))
        return OSL * step / batch / max(1, self.plan.data_parallel_size)

    def prefill_seconds(self, isl: int) -> float:
        return self.model.unloaded_prefill_seconds(isl) / max(1, self.plan.data_parallel_size)


def context_for(isl: int) -> int:
    return 1 << (isl + OSL - 1).bit_length()


def planner_split(isl: int, decode: Role, units: int) -> tuple[int, dict[str, Any]]:
    """Prefill workers out of `units`, from the planner's spec.disaggregation at this workload: its derived ratio r
    (prefill workers per decode worker, at its target prefill utilisation) gives D = floor(units / (1 + r)) decode
    workers and the rest prefill, at least the planner's own count for D. The roles' layouts must be the ones
    planned here (TEP8 prefill; the decode layout asked for)."""
    strategy = str(decode.plan.strategy)
    changes: dict[str, Any] = {
        "context.maxModelLen": context_for(isl),
        "parallelism.strategy": "tp-ep",
        "replicas": 1,
        "disaggregation": {
            "inputTokens": isl,
            "outputTokens": OSL,
            "prefill": {"parallelism": {"strategy": "tp-ep"}},
            "decode": {"parallelism": {"strategy": strategy}},
        },
    }
    planned = make_plan(load_spec(SAMPLE, changes)).disaggregation
    assert planned is not None
    role = planned.decode
    if (str(role.strategy), role.kv_cache_tokens_per_rank) != (strategy, decode.plan.kv_cache_tokens_per_rank):
        raise SystemExit(f"the planner's decode role ({role.strategy}) is not the layout benchmarked ({strategy})")
    ratio = planned.derived_ratio
    decode_workers = max(1, min(units - 1, math.floor(units / (1 + ratio))))
    return units - decode_workers, {"derivedRatio": ratio, "plannerReasoning": planned.reasoning}


def arrivals(seed: int, label: str, rate: float, minutes: float, isl: int) -> list[Request]:
    rng = random.Random(f"{seed}:disaggregation:{label}:{rate:.6f}")
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= minutes * MINUTE:
            return out
        out.append(Request(len(out), t, isl, OSL))


def disaggregated(
    prefill: Role, decode: Role, p: int, d: int, requests: list[Request], link: str, minutes: float, name: str
) -> dict[str, Any]:
    transfer = KvTransfer(kv_bytes_per_token(), link, prefill.plan.gpus_per_replica)
    sim = DisaggregatedSimulation(
        (prefill.plan, prefill.model),  # the SLO's reference: the aggregated TEP replica (the sample's layout)
        (prefill.plan, prefill.model, p),
        (decode.plan, decode.model, d),
        requests,
        transfer,
        minutes * MINUTE,
        SloSpec(),
    )
    sim.begin()
    sim.advance(minutes * MINUTE + TAIL_SECONDS)
    return sim.serving(f"disaggregated {name} P{p}:D{d}").to_dict()


def seed_report(seed: int, label: str, args: argparse.Namespace) -> dict[str, Any]:
    isl = ISL[label]
    tep, dep = Role.planned(context_for(isl), "tp-ep"), Role.planned(context_for(isl), "dp-ep")
    capacity = args.units / (tep.prefill_seconds(isl) + tep.decode_seconds_per_request(isl))
    pairings = {"TEP/TEP": tep, "TEP/DEP": dep}  # prefill is TEP (the guide's context layout); decode either
    splits = {name: planner_split(isl, decode, args.units) for name, decode in pairings.items()}
    ratios = {name: p for name, (p, _) in splits.items()}
    minutes, units = args.minutes, args.units

    def split(name: str, p: int, requests: list[Request]) -> dict[str, Any]:
        return disaggregated(tep, pairings[name], p, units - p, requests, args.link, minutes, name)

    loads = []
    for load in args.loads:
        requests = arrivals(seed, label, load * capacity, minutes, isl)
        fleets = [
            aggregated(
                role.plan, role.model, requests, units, minutes * MINUTE, SloSpec(), tep.model, f"aggregated {name}"
            ).to_dict()
            for name, role in (("TEP", tep), ("DEP", dep))
        ]
        fleets += [split(name, p, requests) for name, p in ratios.items()]
        loads.append({"load": load, "requestsPerSecond": round(load * capacity, 3), "fleets": fleets})
    sweep = []
    if not args.no_sweep:
        middle = sorted(args.loads)[len(args.loads) // 2]
        requests = arrivals(seed, label, middle * capacity, minutes, isl)
        sweep = [{"load": middle} | split(name, p, requests) for name in pairings for p in range(1, units)]
    return {
        "seed": seed,
        "isl": label,
        "inputTokens": isl,
        "outputTokens": OSL,
        "maxModelLen": tep.plan.max_model_len,
        "layouts": {"TEP": describe_role(tep), "DEP": describe_role(dep)},
        "fleetCapacityRequestsPerSecond": round(capacity, 3),
        "defaultRatios": {name: f"P{p}:D{units - p}" for name, p in ratios.items()},
        "planner": {name: why for name, (_, why) in splits.items()},
        "loads": loads,
        "ratioSweep": sweep,
    }


def describe_role(role: Role) -> dict[str, Any]:
    plan, m = role.plan, role.model
    return {
        "strategy": str(plan.strategy),
        "tp": plan.tensor_parallel_size,
        "dp": plan.data_parallel_size,
        "gpus": plan.gpus_per_replica,
        "nodes": plan.nodes_per_replica,
        "kvTokensPerRank": plan.kv_cache_tokens_per_rank,
        "maxBatchSize": m.max_num_seqs,
        "maxNumTokens": m.token_budget,
    }


COLUMNS: Final = ("ttftP50", "ttftP90", "itlP50", "itlP90", "tokensPerSecondPerUser", "tokensPerSecondPerGpu")


def row(report: dict[str, Any], load: float, result: dict[str, Any], suffix: str = "") -> list[Any]:
    slo = result["sloAttainment"]
    return [
        report["isl"],
        report["seed"],
        load,
        result["name"] + suffix,
        *(result[k] for k in COLUMNS),
        "-" if slo is None else f"{slo:.1%}",
        f"{result['finished']}/{result['requests']}",
    ]


def rows(reports: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for report in reports:
        for entry in report["loads"]:
            out += [row(report, entry["load"], fleet) for fleet in entry["fleets"]]
        out += [row(report, r["load"], r, " (sweep)") for r in report["ratioSweep"]]
    return out


HEADER: Final = (
    "ISL", "seed", "load", "fleet", "TTFT p50", "TTFT p90", "ITL p50", "ITL p90", "tok/s/user", "tok/s/GPU", "SLO",
    "done",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.disaggregation", description=__doc__)
    parser.add_argument("--seeds", default="1-3", help="A-B or A,B,C")
    parser.add_argument("--isl", default=",".join(ISL), help="input lengths among " + ", ".join(ISL))
    parser.add_argument("--loads", default="0.4,0.7,0.9", help="shares of the aggregated fleet's capacity")
    parser.add_argument("--units", type=int, default=4, help="replicas of the 8-GPU layout: the same GPUs for both")
    parser.add_argument("--link", choices=sorted(LINKS), default="ib")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    labels = args.isl.split(",")
    if unknown := [x for x in labels if x not in ISL]:
        parser.error(f"--isl: unknown {unknown}; choose from {', '.join(ISL)}")
    args.loads = [float(x) for x in args.loads.split(",")]
    if args.units < 2:
        parser.error("--units: at least 2 (one prefill and one decode worker)")
    reports = []
    for label in labels:
        for seed in parse_seeds(args.seeds):
            reports.append(seed_report(seed, label, args))
            print(f"{label} seed {seed} done", file=sys.stderr, flush=True)
    transfer = KvTransfer(kv_bytes_per_token(), args.link, reports[0]["layouts"]["TEP"]["gpus"])
    header = {"engine": "trtllm", "accelerator": "gb200", "sample": f"manifests/samples/{SAMPLE}"}
    header |= {"units": args.units, "kvTransfer": transfer.describe()}
    if args.output == "json":
        print(json.dumps({**header, "seeds": reports}, indent=2))
    else:
        print(json.dumps(header["kvTransfer"]))
        print(table(HEADER, rows(reports)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m tests.bench.routing [--seeds LIST] [--workloads agentic,mixed] [--replicas N] [-o json|table]`.

Round-robin (the ClusterIP Service) against the Gateway API Inference Extension's endpoint picker (GIE v1.3.0's
chart defaults: queue 2, KV utilisation 2, prefix cache 3), side by side on the same sessions per seed, through the
simulator's engine model with vLLM's prefix caching (simulator/m3fleet_simulator/routing.py, prefix.py, sessions.py).
The fleet is fixed: `--replicas` replicas of the plan of `--sample` (default the vLLM MI355X 1M-context sample,
whose KV pool the planner sizes; the engine caches prefixes in it). Per seed and workload: prefill tokens computed,
TTFT p50/p90, SLO attainment (the resource's default SLO), GPU-hours busy and for the fleet until the last answer.
The check on the agentic workload: at least 2x fewer prefill tokens and a lower TTFT p90 than round-robin.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from m3fleet.api.models import Plan
from m3fleet_simulator.fleet import ENGINE_CAPACITY_FACTOR, PerfModel
from m3fleet_simulator.prefix import BLOCK_TOKENS
from m3fleet_simulator.routing import EPP_WEIGHTS, EndpointPicker, RoundRobin, RoutedSimulation, Router
from m3fleet_simulator.sessions import WORKLOADS, describe, sessions_for, summary

from ..tables import load_plan, parse_seeds, table

SAMPLE = "vllm-mi355x-1m-fp8kv.yaml"
HORIZON_SECONDS = 12 * 3600.0  # every turn is answered well before this; a run that is not says so (finished)
GOAL_PREFILL_RATIO = 2.0


def fleet_description(plan: Plan, model: PerfModel, replicas: int) -> dict[str, Any]:
    return {
        "sample": f"manifests/samples/{SAMPLE}",
        "engine": str(plan.engine),
        "accelerator": str(plan.accelerator),
        "layout": f"TP{plan.tensor_parallel_size} x DP{plan.data_parallel_size}, {plan.gpus_per_replica} GPUs",
        "maxModelLen": plan.max_model_len,
        "kvCacheDtype": str(plan.kv_cache_dtype),
        "planKvCacheTokensPerReplica": plan.kv_cache_tokens_per_replica,
        "engineKvTokens": f"{model.capacity_tokens} (the plan's x {ENGINE_CAPACITY_FACTOR}, whole 128-token blocks)",
        "prefixCacheBlocksPerEngine": model.capacity_tokens // BLOCK_TOKENS,
        "replicas": replicas,
        "routers": {
            "round-robin": "ClusterIP Service (kube-proxy): requests spread in turn, blind to caches and load",
            "endpoint-picker": f"GIE v1.3.0 chart defaults (no m3fleet EndpointPickerConfig merged yet): {EPP_WEIGHTS}",
        },
    }


def seed_report(plan: Plan, model: PerfModel, workload: str, seed: int, replicas: int) -> dict[str, Any]:
    sessions = sessions_for(workload, seed, plan.max_model_len)
    routers: list[Router] = [RoundRobin(), EndpointPicker(seed)]
    results = {
        router.name: RoutedSimulation(plan, model, sessions, router, replicas=replicas)
        .run_all(HORIZON_SECONDS)
        .to_dict()
        for router in routers
    }
    rr, epp = results["round-robin"], results["endpoint-picker"]
    ratio = rr["prefillTokensComputed"] / max(1, epp["prefillTokensComputed"])
    return {
        "seed": seed,
        "workload": workload,
        "trace": summary(sessions),
        "results": results,
        "prefillRatio": round(ratio, 2),
        "ttftP90Lower": epp["ttftP90"] < rr["ttftP90"],
        "goalMet": ratio >= GOAL_PREFILL_RATIO and epp["ttftP90"] < rr["ttftP90"] if workload == "agentic" else None,
    }


ROW = (
    ("router", "router"),
    ("prefill tokens", "prefillTokensComputed"),
    ("reused", "prefillTokensReused"),
    ("TTFT p50 s", "ttftP50"),
    ("TTFT p90 s", "ttftP90"),
    ("SLO", "sloAttainment"),
    ("GPU-h busy", "busyGpuHours"),
    ("GPU-h fleet", "fleetGpuHours"),
    ("done", "finished"),
)


def format_table(reports: list[dict[str, Any]]) -> str:
    rows = []
    for report in reports:
        for result in report["results"].values():
            rows.append(
                [report["workload"], report["seed"]]
                + [f"{result[k]:.2%}" if k == "sloAttainment" else result[k] for _, k in ROW]
                + [report["prefillRatio"], report["goalMet"]]
            )
    return table(["workload", "seed", *(h for h, _ in ROW), "RR/EPP prefill", "goal"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.routing", description=__doc__)
    parser.add_argument("--seeds", default="1-5", help="A-B or A,B,C")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="agentic, mixed or both")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    workloads = args.workloads.split(",")
    if unknown := [w for w in workloads if w not in WORKLOADS]:
        parser.error(f"--workloads: unknown {unknown}; choose from {', '.join(WORKLOADS)}")
    plan = load_plan(SAMPLE)
    model = PerfModel.from_plan(plan)
    reports = []
    for workload in workloads:
        for seed in parse_seeds(args.seeds):
            reports.append(seed_report(plan, model, workload, seed, args.replicas))
            print(f"{workload} seed {seed} done", file=sys.stderr, flush=True)
    agentic = [r for r in reports if r["workload"] == "agentic"]
    header = {
        "fleet": fleet_description(plan, model, args.replicas),
        "engineModel": model.describe(),
        "workloads": {w: describe(w) for w in workloads},
        "goal": f"agentic: >= {GOAL_PREFILL_RATIO:g}x fewer prefill tokens and a lower TTFT p90 than round-robin",
        "goalMetOnSeeds": f"{sum(1 for r in agentic if r['goalMet'])} of {len(agentic)}",
    }
    if args.output == "json":
        print(json.dumps({**header, "seeds": reports}, indent=2))
    else:
        print(format_table(reports))
        print(f"\ngoal ({header['goal']}): met on {header['goalMetOnSeeds']} agentic seeds")
    return 0 if all(r["goalMet"] for r in agentic) else 1


if __name__ == "__main__":
    raise SystemExit(main())

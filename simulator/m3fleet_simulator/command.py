"""`m3fleet simulate`: what the autoscaler would do with a resource, on a seeded scenario.

`register(subparsers)` adds the subcommand to the main parser; `run(args)` executes it and returns the
exit status (0 ok, 2 invalid input with a one-line message naming the field and a fix, 1 internal
error; never a traceback unless M3FLEET_DEBUG is set).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from m3fleet.documents import InputError, one_deployment, parse_one
from m3fleet.exitcodes import EXIT_INVALID, EXIT_OK
from m3fleet_simulator.scenarios import SCENARIOS

MAX_SEEDS = 1000  # one run takes seconds to minutes: more is a typo, not a study

if TYPE_CHECKING:
    from m3fleet.api.models import MiniMaxM3Deployment
    from m3fleet.bench.results import BenchResult


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `simulate` to an argparse subparsers object (from `add_subparsers()`)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="simulate what the autoscaler would do with a resource on a seeded workload",
        description="Seeded discrete-event simulation of one MiniMaxM3Deployment under its context-aware "
        "autoscaler: SLO attainment, GPU-hours, scale events and the assumptions behind them.",
    )
    parser.add_argument(
        "-f", "--filename", help="a file with one MiniMaxM3Deployment (default: the vLLM 8xH200 TP8 sample)"
    )
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS), help="the workload")
    seeds = parser.add_mutually_exclusive_group()
    # default None, not 1: argparse tells "--seed 1 --seeds 1-2" from "--seeds 1-2" only by identity with the default
    seeds.add_argument("--seed", type=int, help="random seed (default 1)")
    seeds.add_argument(
        "--seeds", help=f"several seeds, e.g. 1-10 or 1,4,7 (at most {MAX_SEEDS}): one line (one JSON object) per seed"
    )
    cold = parser.add_mutually_exclusive_group()
    cold.add_argument(
        "--cold-start", type=float, help="seconds every new replica takes to become ready (default: the catalog's)"
    )
    cold.add_argument(
        "--cold-start-model",
        choices=("cache", "pvc", "hub"),
        help="build each new replica's time-to-ready from phases (schedule, image, start, load) with the weights "
        "read from a node-local cache (image pre-pulled), a network PVC or the Hugging Face Hub",
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--minutes", type=float, help="simulate only the first N minutes of the scenario")
    parser.add_argument(
        "--throughput-from",
        metavar="RESULT",
        help="an m3fleet bench result (its -o json output, or its ConfigMap): measured decode and prefill speed "
        "replace the assumed ones; without -f the benchmarked resource is simulated",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Bad input and internal errors are reported by `m3fleet.documents.guarded` (through `m3fleet.cli.main`)."""
    return _run(args)


def _invalid(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_INVALID


def _run(args: argparse.Namespace) -> int:
    from m3fleet.api.parse import parse_resource
    from m3fleet_simulator.whatif import prepare, run_report

    if args.minutes is not None and not (math.isfinite(args.minutes) and args.minutes > 0):
        return _invalid(f"--minutes: {args.minutes:g} is not positive; fix: give a duration in minutes, e.g. 20")
    if args.cold_start is not None and not 0 <= args.cold_start <= 7200:
        return _invalid(f"--cold-start: {args.cold_start:g} is outside 0-7200 seconds; fix: give e.g. 90")
    resource = None
    if args.filename:
        resource = parse_one(one_deployment(args.filename, "simulate"), parse_resource)
    measured = None
    if args.throughput_from:
        measured = (read_result(args.throughput_from), args.throughput_from)
        if resource is None:
            resource = benchmarked_resource(measured[0])
    seeds = [1 if args.seed is None else args.seed] if args.seeds is None else parse_seeds(args.seeds)
    if isinstance(seeds, str):
        return _invalid(f"--seeds: {args.seeds!r} {seeds}; fix: give A-B (e.g. 1-10) or a list (e.g. 1,4,7)")
    for index, seed in enumerate(seeds):  # each seed is printed as it finishes: a long run shows progress
        report = run_report(
            prepare(
                args.scenario,
                resource,
                seed=seed,
                minutes=args.minutes,
                cold_start=args.cold_start,
                measured=measured,
                cold_start_model=args.cold_start_model,
            )
        )
        last = index == len(seeds) - 1
        if args.output == "json":  # one JSON list, one object per seed
            opening, closing = "[\n" if index == 0 else "", "\n]\n" if last else ",\n"
            sys.stdout.write(opening + json.dumps(report, indent=2) + closing)
        else:
            sys.stdout.write(format_text(report, header=index == 0))
        sys.stdout.flush()
    return EXIT_OK


def read_result(path: str) -> BenchResult:
    """An m3fleet bench result from a file (or - for stdin). Raises InputError, SpecError."""
    from m3fleet.bench.results import load

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(
            f"--throughput-from {path}",
            f"cannot be read ({exc.strerror or exc})",
            "give the file `m3fleet bench -o json` wrote (or its ConfigMap), or - for stdin",
        ) from None
    return load(text, f"--throughput-from {path}")


def benchmarked_resource(result: BenchResult) -> MiniMaxM3Deployment:
    from m3fleet.api.models import API_VERSION, KIND
    from m3fleet.api.parse import parse_resource

    meta = {"name": result.resource.get("name") or "benchmarked", "namespace": result.resource.get("namespace")}
    return parse_resource({"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": result.spec})


def parse_seeds(text: str) -> list[int] | str:
    """`A-B` (inclusive) or `A,B,C` of seeds 0 and up; else what is wrong with it."""
    try:
        if "-" in text:
            low, high = (int(part) for part in text.split("-", 1))
            if high < low:
                return f"runs backwards ({low} > {high})"
            if high - low + 1 > MAX_SEEDS:
                return f"holds {high - low + 1} seeds, more than {MAX_SEEDS}"
            return list(range(low, high + 1))
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        return "is not a seed range or list of seeds (whole numbers, 0 and up)"
    return seeds if len(seeds) <= MAX_SEEDS else f"holds {len(seeds)} seeds, more than {MAX_SEEDS}"


def _prior_line(prior: Any) -> str:
    if not isinstance(prior, dict):
        return f"throughput: {prior or 'assumed'}"
    m = prior["measured"]
    return (
        f"throughput: measured by m3fleet bench ({prior['source']}: {m['client']} on {m['resource']}, "
        f"{m['completionTime']}): decode time x{prior['decodeScale']:g}, prefill time x{prior['prefillScale']:g} "
        "the assumed"
    )


def _gateway_line(gateway: dict[str, Any] | None) -> list[str]:
    """spec.autoscaling.gateway: what the simulated gateway records (the bytes per token drawn for the seed shown)."""
    if not gateway:
        return []
    return [
        f"gateway: {gateway['records']}, about {gateway['bytesPerToken']:g} bytes a prompt token "
        "(seeded; the policy measures it)"
    ]


def _replicas_line(replicas: dict[str, Any]) -> str:
    bounds = f"{replicas['min']}-{replicas['max']}"
    return f"replicas: {bounds}, {replicas['initial']} at the start; bounds {replicas['source']}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def format_text(report: dict[str, Any], header: bool = True) -> str:
    """The seed's line of the table; with `header`, first what the run assumes and the column names."""
    r = report["policies"]["context-aware"]
    line = (
        f"{report['seed']:>5}{r['requests']:>10}{_pct(r['sloAttainment']):>10}{r['gpuHours']:>9.1f}"
        f"{r['peakReplicas']:>6}{r['scaleEvents']:>14}{r['preemptions']:>9}{r['rejected']:>10}\n"
    )
    return (_header(report) if header else "") + line


def _header(first: dict[str, Any]) -> str:
    plan, params = first["plan"], first["parameters"]
    cold = params["coldStartSeconds"]
    cold_text = f"{cold['seconds']:g} s" if "seconds" in cold else f"{cold['low']:.0f}-{cold['high']:.0f} s"
    if "source" in cold:
        cold_text += f" (weights from {cold['description']})"
    lines = [
        f"scenario {first['scenario']}: {params['scenario']}",
        f"resource: {params['resource']}",
        f"plan: {plan['engine']} on {plan['accelerator']} {plan['variant']}, TP{plan['tensorParallelSize']} x "
        f"DP{plan['dataParallelSize']}, {plan['gpusPerReplica']} GPUs/replica on {plan['nodesPerReplica']} node(s), "
        f"{plan['kvCacheTokensPerReplica']} KV tokens/replica, maxModelLen {plan['maxModelLen']}",
        _prior_line(params.get("throughputPrior")),
        f"cold start {cold_text}; SLO: {params['slo']}",
        _replicas_line(params["replicas"]),
        *_gateway_line(params["simulator"].get("gateway")),
        "",
        f"{'SEED':>5}{'REQUESTS':>10}{'SLO MET':>10}{'GPU-H':>9}{'PEAK':>6}{'SCALE-EVENTS':>14}"
        f"{'PREEMPT':>9}{'REJECTED':>10}",
    ]
    return "\n".join(lines) + "\n"

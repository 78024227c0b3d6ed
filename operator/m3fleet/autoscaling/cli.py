"""`m3fleet simulate`: what the autoscaler would do with a resource, on a seeded scenario.

`register(subparsers)` adds the subcommand to the main parser; `run(args)` executes it and returns the
exit status (0 ok, 2 invalid input with a one-line message naming the field and a fix, 1 internal
error; never a traceback unless M3FLEET_DEBUG is set).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from m3fleet.autoscaling.scenarios import SCENARIOS
from m3fleet.documents import EXIT_INVALID, EXIT_OK, InputError, read_documents

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
    seeds.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    seeds.add_argument("--seeds", help="several seeds, e.g. 1-10 or 1,4,7: one line (one JSON object) per seed")
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
    from m3fleet.autoscaling.simulate import prepare, run_report

    if args.minutes is not None and args.minutes <= 0:
        return _invalid(f"--minutes: {args.minutes:g} is not positive; fix: give a duration in minutes, e.g. 20")
    if args.cold_start is not None and not 0 <= args.cold_start <= 7200:
        return _invalid(f"--cold-start: {args.cold_start:g} is outside 0-7200 seconds; fix: give e.g. 90")
    resource = None
    if args.filename:
        docs = read_documents(args.filename)
        if len(docs) != 1:
            return _invalid(
                f"{args.filename}: simulate takes exactly one MiniMaxM3Deployment, found {len(docs)}; "
                "fix: pass a file with one resource"
            )
        resource = parse_resource(docs[0].body)
    measured = None
    if args.throughput_from:
        measured = (read_result(args.throughput_from), args.throughput_from)
        if resource is None:
            resource = benchmarked_resource(measured[0])
    seeds = [args.seed] if args.seeds is None else parse_seeds(args.seeds)
    if seeds is None:
        return _invalid(
            f"--seeds: {args.seeds!r} is not a seed range; fix: give A-B (e.g. 1-10) or a list (e.g. 1,4,7)"
        )
    reports = [
        run_report(
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
        for seed in seeds
    ]
    if args.output == "json":
        sys.stdout.write(json.dumps(reports, indent=2) + "\n")
    else:
        sys.stdout.write(format_text(reports))
    return EXIT_OK


def read_result(path: str) -> BenchResult:
    """An m3fleet bench result from a file (or - for stdin). Raises InputError, SpecError."""
    from m3fleet.bench.results import load

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--throughput-from: {path}: {exc.strerror or exc}") from None
    return load(text, f"--throughput-from {path}")


def benchmarked_resource(result: BenchResult) -> MiniMaxM3Deployment:
    from m3fleet.api.models import API_VERSION, KIND
    from m3fleet.api.parse import parse_resource

    meta = {"name": result.resource.get("name") or "benchmarked", "namespace": result.resource.get("namespace")}
    return parse_resource({"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": result.spec})


def parse_seeds(text: str) -> list[int] | None:
    """`A-B` (inclusive) or `A,B,C`; None when it is neither or empty."""
    try:
        if "-" in text:
            low, high = (int(part) for part in text.split("-", 1))
            seeds = list(range(low, high + 1))
        else:
            seeds = [int(part) for part in text.split(",")]
    except ValueError:
        return None
    return seeds or None


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


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def format_text(reports: list[dict[str, Any]]) -> str:
    first = reports[0]
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
        *_gateway_line(params["simulator"].get("gateway")),
        "",
        f"{'SEED':>5}{'REQUESTS':>10}{'SLO MET':>10}{'GPU-H':>9}{'PEAK':>6}{'SCALE-EVENTS':>14}"
        f"{'PREEMPT':>9}{'REJECTED':>10}",
    ]
    for report in reports:
        r = report["policies"]["context-aware"]
        lines.append(
            f"{report['seed']:>5}{r['requests']:>10}{_pct(r['sloAttainment']):>10}{r['gpuHours']:>9.1f}"
            f"{r['peakReplicas']:>6}{r['scaleEvents']:>14}{r['preemptions']:>9}{r['rejected']:>10}"
        )
    return "\n".join(lines) + "\n"

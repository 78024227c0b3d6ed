"""`m3fleet simulate`: the autoscaling simulator and its benchmark, from the command line.

`register(subparsers)` adds the subcommand to the main parser; `run(args)` executes it and returns the
exit status (0 ok, 2 invalid input with a one-line message naming the field and a fix, 1 internal
error; never a traceback unless M3FLEET_DEBUG is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from m3fleet.autoscaling.scenarios import SCENARIOS

if TYPE_CHECKING:
    from m3fleet.api.models import MiniMaxM3Deployment
    from m3fleet.bench.results import BenchResult

EXIT_OK, EXIT_INTERNAL, EXIT_INVALID = 0, 1, 2


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `simulate` to an argparse subparsers object (from `add_subparsers()`)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="simulate one deployment under each autoscaling policy and compare them",
        description="Seeded discrete-event simulation of one MiniMaxM3Deployment: the context-aware policy, "
        "an HPA on requests, a KEDA KV-usage recipe and a perfect-foresight oracle on the same requests, "
        "plus a sweep of each baseline's target (the SLO-vs-GPU-hours frontier).",
    )
    parser.add_argument(
        "-f", "--filename", help="a file with one MiniMaxM3Deployment (default: the vLLM 8xH200 TP8 sample)"
    )
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS), help="the workload")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    seeds.add_argument(
        "--seeds", help="several seeds, e.g. 1-10 or 1,4,7: one line per seed and the means and ranges over them"
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--no-sweep", action="store_true", help="skip the target sweeps and the frontier")
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
    from m3fleet.cli import InputError  # lazily: m3fleet.cli imports this module to register it
    from m3fleet.errors import SpecError, SpecErrors

    try:
        return _run(args)
    except (InputError, SpecError, SpecErrors) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except Exception as exc:
        if os.environ.get("M3FLEET_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc} (set M3FLEET_DEBUG=1 for a traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _run(args: argparse.Namespace) -> int:
    from m3fleet.api.parse import parse_resource
    from m3fleet.autoscaling.benchmark import benchmark, prepare, summarize
    from m3fleet.cli import read_documents

    if args.minutes is not None and args.minutes <= 0:
        print(
            f"error: --minutes: {args.minutes:g} is not positive; fix: give a duration in minutes, e.g. 20",
            file=sys.stderr,
        )
        return EXIT_INVALID
    resource = None
    if args.filename:
        docs = read_documents(args.filename)
        if len(docs) != 1:
            print(
                f"error: {args.filename}: simulate takes exactly one MiniMaxM3Deployment, found {len(docs)}; "
                "fix: pass a file with one resource",
                file=sys.stderr,
            )
            return EXIT_INVALID
        resource = parse_resource(docs[0].body)
    measured = None
    if args.throughput_from:
        measured = (read_result(args.throughput_from), args.throughput_from)
        if resource is None:
            resource = benchmarked_resource(measured[0])
    if args.seeds is not None:
        seeds = parse_seeds(args.seeds)
        if seeds is None:
            print(
                f"error: --seeds: {args.seeds!r} is not a seed range; fix: give A-B (e.g. 1-10) or a list (e.g. 1,4,7)",
                file=sys.stderr,
            )
            return EXIT_INVALID
        reports = [
            benchmark(
                prepare(args.scenario, resource, seed=seed, minutes=args.minutes, measured=measured),
                with_sweep=not args.no_sweep,
            )
            for seed in seeds
        ]
        multi = {
            "scenario": args.scenario,
            "runs": [{k: r[k] for k in ("seed", "policies", "comparison") if k in r} for r in reports],
            "summary": summarize(reports),
        }
        sys.stdout.write(json.dumps(multi, indent=2) + "\n" if args.output == "json" else format_seeds(multi))
        return EXIT_OK
    setup = prepare(args.scenario, resource, seed=args.seed, minutes=args.minutes, measured=measured)
    report = benchmark(setup, with_sweep=not args.no_sweep)
    if args.output == "json":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(format_text(report))
    return EXIT_OK


def read_result(path: str) -> BenchResult:
    """An m3fleet bench result from a file (or - for stdin). Raises InputError, SpecError."""
    from m3fleet.bench.results import load
    from m3fleet.cli import InputError

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


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_text(report: dict[str, Any]) -> str:
    plan, params = report["plan"], report["parameters"]
    oracle = params["policySettings"]["oracle"]
    lines = [
        f"scenario {report['scenario']} (seed {report['seed']}): {params['scenario']}",
        f"resource: {params['resource']}",
        f"plan: {plan['engine']} on {plan['accelerator']} {plan['variant']}, TP{plan['tensorParallelSize']} x "
        f"DP{plan['dataParallelSize']}, {plan['gpusPerReplica']} GPUs/replica on {plan['nodesPerReplica']} node(s), "
        f"{plan['kvCacheTokensPerReplica']} KV tokens/replica, maxModelLen {plan['maxModelLen']}",
        _prior_line(params.get("throughputPrior")),
        f"requests: {params['requests']} over {params['durationMinutes']:g} min; cold start "
        f"{params['coldStartSeconds']['low']:.0f}-{params['coldStartSeconds']['high']:.0f} s",
        "",
        f"{'POLICY':<16}{'SLO':>8}{'GPU-H':>9}{'PREEMPT':>9}{'REJECTED':>10}{'SCALE-EVENTS':>14}{'PEAK':>6}",
    ]
    for name, r in report["policies"].items():
        label = f"oracle (x{oracle['headroom']:g})" if name == "oracle" else name
        lines.append(
            f"{label:<16}{_pct(r['sloAttainment']):>8}{r['gpuHours']:>9.1f}{r['preemptions']:>9}{r['rejected']:>10}"
            f"{r['scaleEvents']:>14}{r['peakReplicas']:>6}"
        )
    if not oracle["metGoal"]:
        lines.append("note: the oracle did not reach 99% at any headroom tried")
    if "frontier" in report:
        lines += ["", "frontier (setting: SLO attainment / GPU-hours; * = Pareto-optimal):"]
        for name, points in report["frontier"].items():
            key = next(iter(points[0])) if points else "target"
            cells = [
                f"{p[key]:g}: {_pct(p['sloAttainment'])}/{p['gpuHours']:.1f}{'*' if p['pareto'] else ''}"
                for p in points
            ]
            lines.append(f"  {name} ({key}): " + "  ".join(cells))
        lines += ["", "context-aware (default settings) against each baseline's frontier:"]
        for name, c in report["comparison"].items():
            ahead = "n/a" if c["attainmentPointsAhead"] is None else f"{c['attainmentPointsAhead']:+.1f} points"
            saved = "n/a" if c["gpuHoursSaved"] is None else f"{100 * c['gpuHoursSaved']:.1f}%"
            dominates = "; better on both axes than every setting" if c["dominatesEveryBaselineSetting"] else ""
            lines.append(
                f"  {name}: {ahead} at our GPU-hours; GPU-hours saved at our attainment {saved}{dominates}; "
                f"{c['gpuHoursVsOracle']}x the oracle's GPU-hours; aim met: {'yes' if c['aimMet'] else 'no'}"
            )
    return "\n".join(lines) + "\n"


def _range(spread: dict[str, float] | None, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
    if spread is None:
        return "n/a"
    low, mean, high = (f"{scale * spread[k]:.{digits}f}" for k in ("min", "mean", "max"))
    return f"{mean}{unit} (range {low} to {high}{unit}, {spread['seeds']} seeds)"


def format_seeds(multi: dict[str, Any]) -> str:
    summary = multi["summary"]
    lines = [f"scenario {multi['scenario']}, seeds {', '.join(str(s) for s in summary['seeds'])}", ""]
    for run in multi["runs"]:
        cells = [
            f"{name} {_pct(r['sloAttainment'])}/{r['gpuHours']:.1f} (peak {r['peakReplicas']})"
            for name, r in run["policies"].items()
        ]
        line = f"seed {run['seed']:>3}: " + ", ".join(cells)
        c = run.get("comparison", {}).get("context-aware vs request-count")
        if c is not None:
            ahead = "n/a" if c["attainmentPointsAhead"] is None else f"{c['attainmentPointsAhead']:+.1f}"
            saved = "n/a" if c["gpuHoursSaved"] is None else f"{100 * c['gpuHoursSaved']:.1f}%"
            line += (
                f"; vs request-count's frontier: {ahead} points, {saved} GPU-hours saved, "
                f"{c['gpuHoursVsOracle']}x oracle, aim {'met' if c['aimMet'] else 'not met'}"
            )
        lines.append(line)
    lines += ["", "means (SLO attainment / GPU-hours):"]
    for name, p in summary["policies"].items():
        lines.append(f"  {name}: {_range(p['sloAttainment'], 100, '%')} / {_range(p['gpuHours'])}")
    for name, c in summary.get("comparison", {}).items():
        met = c["aimMetOnSeeds"]
        lines += [
            f"{name}:",
            f"  points ahead at our GPU-hours: {_range(c['attainmentPointsAhead'])}",
            f"  GPU-hours saved at our attainment: {_range(c['gpuHoursSaved'], 100, '%')}",
            f"  GPU-hours vs the oracle: {_range(c['gpuHoursVsOracle'], 1, 'x', 2)}",
            f"  aim met on {len(met)} of {len(summary['seeds'])} seeds"
            + (f" ({', '.join(map(str, met))})" if met else ""),
        ]
    return "\n".join(lines) + "\n"

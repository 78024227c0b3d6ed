"""`python -m tests.bench.autoscaling --scenario NAME [--seeds A-B] [--cold-start S] [--gateway] [--slo-ttft S]
[--robustness] [-f FILE] [-o json|text]`.

Runs the policy, the swept baselines and the oracle on each seed and prints the per-seed table and the
summary of per-seed minimums (text), or the JSON list of per-seed objects (`-o json`: the
`m3fleet simulate` contract's shape, with `frontier`, `lateOracleCurve` (the late-oracle envelope, envelope.py),
`workLowerBound` and `checks`; `python -m tests.bench.autoscaling.check` judges it);
`--summary-json FILE` also writes the summary. `--cold-start-model cache|pvc|hub` builds every cold start
from phases (simulator/m3fleet_simulator/coldstart.py); `--compare-cold-start-models pvc,cache` runs each seed under
each model side by side (same requests; the policy, the default baselines and the oracle; no sweep) and
prints one row per seed and model. `--gateway` puts an inference gateway in front of the built-in resource
(spec.autoscaling.gateway): the policy also reads the request sizes it records as requests arrive; the baselines
and the oracle do not change. `--slo-ttft S` sets the resource's spec.autoscaling.slo.ttft.seconds: the policy
sizes prefill for it and every policy is scored against it (each seed's `slo` says which SLO was used); `--slo-itl S`
makes the ITL bound absolute (S seconds per output token).
`--speculative METHOD` (mtp, eagle3) runs the built-in resource with that draft (spec.speculativeDecoding): the
simulated engines decode its acceptance length's tokens per step and every policy and the oracle run on them.
`--robustness` also runs the policy with the simulator's time model x0.7 and x1.4, against the policy whose prior
matches that engine, and on engines that share each step's prefill budget among their prompts instead of prefilling
them first come, first served (`checks.robustness`: `byScale`, `byPrefillDiscipline`). `--scale-to-zero SECONDS`
(implies `--gateway`) instead runs, per seed,
the policy at minReplicas 1 against minReplicas 0 with the zero rule and that idle window (zero.py): GPU-hours saved
and attainment lost, with the gateway holding requests (bounded) while no replica is ready. `-f FILE` runs a
MiniMaxM3Deployment of your own instead of the built-in vLLM resource (another engine, accelerator or variant; its
own autoscaling settings), as `m3fleet simulate -f` does; `--gateway` and `--speculative` shape the built-in
resource only (with `-f`, set spec.autoscaling.gateway and spec.speculativeDecoding in the file).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from m3fleet.api.models import MiniMaxM3Deployment, SpeculativeMethod
from m3fleet.api.parse import parse_resource
from m3fleet.documents import InputError, ResourceError, one_deployment, parse_one
from m3fleet.errors import SpecError, SpecErrors
from m3fleet_simulator.scenarios import SCENARIOS
from m3fleet_simulator.whatif import Setup, prepare

from .report import _pct, format_text, seed_report, summarize
from .zero import format_zero, zero_report

MODELS = ("cache", "pvc", "hub")
TIME_SCALES = (0.7, 1.4)  # issue 46 item 3: the simulator's time model x0.7 and x1.4


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = (int(p) for p in text.split("-", 1))
        return list(range(low, high + 1))
    return [int(p) for p in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.autoscaling", description=__doc__)
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--seeds", default="1", help="A-B or A,B,C (develop on 1-30; check on others)")
    cold = parser.add_mutually_exclusive_group()
    cold.add_argument("--cold-start", type=float, help="every new replica takes this many seconds to be ready")
    cold.add_argument("--cold-start-model", choices=MODELS, help="cold starts built from phases with this source")
    cold.add_argument("--compare-cold-start-models", help="e.g. pvc,cache: each seed under each model, side by side")
    parser.add_argument("--minutes", type=float, help="only the first N minutes of the scenario")
    parser.add_argument("--no-sweep", action="store_true", help="defaults and the oracle only")
    parser.add_argument("--priors-off", action="store_true", help="also run ours with its priors x0.5 and x2")
    parser.add_argument(
        "--robustness",
        action="store_true",
        help="also run ours with the simulator's time model x0.7 and x1.4 and with shared prefill",
    )
    parser.add_argument("--gateway", action="store_true", help="a gateway exports request sizes (autoscaling.gateway)")
    parser.add_argument(
        "--scale-to-zero", type=float, metavar="SECONDS", help="minReplicas 0 with this idle window vs minReplicas 1"
    )
    parser.add_argument("--slo-ttft", type=float, help="the SLO's fixed TTFT allowance (slo.ttft.seconds)")
    parser.add_argument(
        "--slo-itl",
        type=float,
        help="an absolute ITL bound (slo.itl.seconds, unloadedFactor 0): the same with or "
        "without a draft, where the default is relative to the engine's own idle step",
    )
    parser.add_argument(
        "--speculative",
        choices=[m.value for m in SpeculativeMethod],
        help="draft with this method (speculativeDecoding)",
    )
    parser.add_argument(
        "-f", "--filename", help="a file with one MiniMaxM3Deployment to run instead of the built-in vLLM resource"
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--summary-json", help="also write the summary (per-seed min/mean/max, checks) here")
    args = parser.parse_args(argv)
    if args.filename and (args.gateway or args.speculative or args.scale_to_zero is not None):
        parser.error(
            "--gateway, --speculative and --scale-to-zero shape the built-in resource; with -f, set "
            "spec.autoscaling.gateway and spec.speculativeDecoding in the file"
        )
    if args.compare_cold_start_models:
        models = args.compare_cold_start_models.split(",")
        unknown = [m for m in models if m not in MODELS]
        if unknown:
            parser.error(f"--compare-cold-start-models: unknown {unknown}; choose from {', '.join(MODELS)}")
        return compare_models(args, models)
    if args.scale_to_zero is not None:
        return scale_to_zero(args)
    reports = []
    for seed in parse_seeds(args.seeds):
        setup = seed_setup(args, seed, args.gateway)
        reports.append(
            seed_report(
                setup,
                with_sweep=not args.no_sweep,
                prior_scales=(0.5, 2.0) if args.priors_off else (),
                time_scales=TIME_SCALES if args.robustness else (),
            )
        )
        print(f"seed {seed} done", file=sys.stderr, flush=True)
    summary = summarize(reports)
    if args.summary_json:
        with open(args.summary_json, "w") as out:
            json.dump(summary, out, indent=1)
    if args.output == "json":
        sys.stdout.write(json.dumps(reports, indent=1) + "\n")
    else:
        sys.stdout.write(format_text(reports, summary))
    return 0


def seed_setup(args: argparse.Namespace, seed: int, gateway: bool) -> Setup:
    """One seed's run as the options describe it."""
    setup = prepare(
        args.scenario,
        resource=own_resource(args.filename) if args.filename else None,
        seed=seed,
        minutes=args.minutes,
        cold_start=args.cold_start,
        cold_start_model=args.cold_start_model,
        gateway=gateway,
        speculative=args.speculative,
    )
    if args.slo_ttft is None and args.slo_itl is None:
        return setup
    return with_slo(setup, args.slo_ttft, args.slo_itl)


def own_resource(filename: str) -> MiniMaxM3Deployment:
    """The one MiniMaxM3Deployment in `filename`, validated as `m3fleet simulate -f` validates it."""
    try:
        resource: MiniMaxM3Deployment = parse_one(one_deployment(filename, "bench"), parse_resource)
    except (InputError, ResourceError) as error:
        raise SystemExit(f"-f {filename}: {error}") from None
    return resource


def with_slo(setup: Setup, ttft: float | None, itl: float | None) -> Setup:
    """The same run with spec.autoscaling.slo.ttft.seconds and/or an absolute ITL bound set, validated as
    `kubectl apply` would."""
    body = setup.resource.model_dump(by_alias=True, mode="json", exclude_none=True)
    slo = body["spec"]["autoscaling"]["slo"]
    if ttft is not None:
        slo["ttft"]["seconds"] = ttft
    if itl is not None:
        slo["itl"] = {"seconds": itl, "unloadedFactor": 0}
    try:
        resource = parse_resource(body)
    except (InputError, SpecError, SpecErrors) as error:
        raise SystemExit(f"--slo-ttft/--slo-itl: {error}") from None
    return replace(setup, resource=resource)


def scale_to_zero(args: argparse.Namespace) -> int:
    """Per seed: the policy at minReplicas 1 against minReplicas 0 with the zero rule (zero.py)."""
    if args.scale_to_zero < 0:
        raise SystemExit(f"--scale-to-zero: {args.scale_to_zero:g} is negative; give the idle window in seconds (>= 0)")
    rows = []
    for seed in parse_seeds(args.seeds):
        rows.append(zero_report(seed_setup(args, seed, gateway=True), args.scale_to_zero))
        print(f"seed {seed} done", file=sys.stderr, flush=True)
    sys.stdout.write(json.dumps(rows, indent=1) + "\n" if args.output == "json" else format_zero(rows))
    return 0


def compare_models(args: argparse.Namespace, models: list[str]) -> int:
    """Each seed under each cold-start model, on the same requests: one row per (seed, model)."""
    rows: list[dict[str, Any]] = []
    for seed in parse_seeds(args.seeds):
        for model in models:
            setup = prepare(
                args.scenario, seed=seed, minutes=args.minutes, cold_start_model=model, gateway=args.gateway
            )
            report = seed_report(setup, with_sweep=False)
            assert setup.cold_start_model is not None
            low, high = setup.cold_start_model.bounds()
            rows.append({"seed": seed, "model": model, "coldStart": [round(low), round(high)], **report})
        print(f"seed {seed} done", file=sys.stderr, flush=True)
    if args.output == "json":
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return 0
    names = list(rows[0]["policies"])
    lines = [f"scenario {args.scenario}: SLO attainment / GPU-hours per seed and cold-start model", ""]
    lines.append(f"seed  {'model':<6} {'cold start':>11}  " + "  ".join(f"{n:>18}" for n in names))
    for row in rows:
        policies = row["policies"]
        cells = [f"{_pct(policies[n]['sloAttainment'])}/{policies[n]['gpuHours']:.1f}" for n in names]
        cold = row["coldStart"]
        lines.append(
            f"{row['seed']:>4}  {row['model']:<6} {f'{cold[0]}-{cold[1]} s':>11}  "
            + "  ".join(f"{c:>18}" for c in cells)
        )
    lines += ["", "per-seed min / mean / max of the context-aware policy:"]
    for model in models:
        ours = [r["policies"]["context-aware"] for r in rows if r["model"] == model]
        a = [p["sloAttainment"] for p in ours]
        g = [p["gpuHours"] for p in ours]
        lines.append(
            f"  {model:<6} {_pct(min(a))} / {_pct(sum(a) / len(a))} / {_pct(max(a))};  "
            f"{min(g):.1f} / {sum(g) / len(g):.1f} / {max(g):.1f} GPU-h"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

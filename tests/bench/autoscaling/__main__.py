"""`python -m tests.bench.autoscaling --scenario NAME [--seeds A-B] [--cold-start S] [-o json|text]`.

Runs the policy, the swept baselines and the oracle on each seed and prints the per-seed table and the
summary of per-seed minimums (text), or the JSON list of per-seed objects (`-o json`: the
`m3fleet simulate` contract's shape, with `frontier`, `workLowerBound` and `checks`);
`--summary-json FILE` also writes the summary.
"""

from __future__ import annotations

import argparse
import json
import sys

from m3fleet.autoscaling.scenarios import SCENARIOS
from m3fleet.autoscaling.simulate import prepare

from .report import format_text, seed_report, summarize


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = (int(p) for p in text.split("-", 1))
        return list(range(low, high + 1))
    return [int(p) for p in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.autoscaling", description=__doc__)
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--seeds", default="1", help="A-B or A,B,C (develop on 1-30; check on others)")
    parser.add_argument("--cold-start", type=float, help="every new replica takes this many seconds to be ready")
    parser.add_argument("--minutes", type=float, help="only the first N minutes of the scenario")
    parser.add_argument("--no-sweep", action="store_true", help="defaults and the oracle only")
    parser.add_argument("--priors-off", action="store_true", help="also run ours with its priors x0.5 and x2")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--summary-json", help="also write the summary (per-seed min/mean/max, checks) here")
    args = parser.parse_args(argv)
    reports = []
    for seed in parse_seeds(args.seeds):
        setup = prepare(args.scenario, seed=seed, minutes=args.minutes, cold_start=args.cold_start)
        reports.append(
            seed_report(setup, with_sweep=not args.no_sweep, prior_scales=(0.5, 2.0) if args.priors_off else ())
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


if __name__ == "__main__":
    raise SystemExit(main())

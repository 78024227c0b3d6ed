"""`m3fleet plan -f FILE [-o table|json|yaml]`: the GPU layout of each MiniMaxM3Deployment in FILE, and the
autoscaler's bounds and SLO where spec.autoscaling is enabled."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from m3fleet.api import MiniMaxM3Deployment, Plan
from m3fleet.api.models import AutoscalingSpec, RolePlan, SloSpec
from m3fleet.cli.inputs import Caches, cache_of, input_flags, process
from m3fleet.documents import dump
from m3fleet.exitcodes import EXIT_INVALID, EXIT_OK
from m3fleet.planner import plan
from m3fleet.render import check


def register(sub: Any) -> None:
    parser = sub.add_parser("plan", help="the GPU layout of each MiniMaxM3Deployment in FILE")
    input_flags(parser)
    parser.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    parser.set_defaults(func=run)


Row = tuple[str, Plan, AutoscalingSpec | None]  # name, plan, spec.autoscaling when enabled


def plan_dict(p: Plan, autoscaling: AutoscalingSpec | None = None) -> dict[str, Any]:
    out = p.model_dump(by_alias=True, mode="json", exclude_none=True)
    if autoscaling is not None:
        out["autoscaling"] = {
            "minReplicas": autoscaling.min_replicas,
            "maxReplicas": autoscaling.max_replicas,
            "slo": autoscaling.slo.model_dump(by_alias=True, mode="json"),
        }
    return out


def slo_text(slo: SloSpec) -> str:
    """The SLO in one table cell, e.g. p95 TTFT<=2s+1.5xprefill ITL<=1.5xidle."""
    ttft = [f"{slo.ttft.seconds:g}s"] if slo.ttft.seconds or not slo.ttft.unloaded_prefill_factor else []
    if slo.ttft.per_prompt_token_seconds:
        ttft.append(f"{slo.ttft.per_prompt_token_seconds:g}s/tok")
    if slo.ttft.unloaded_prefill_factor:
        ttft.append(f"{slo.ttft.unloaded_prefill_factor:g}xprefill")
    itl = [f"{slo.itl.seconds:g}s"] if slo.itl.seconds else []
    if slo.itl.unloaded_factor:
        itl.append(f"{slo.itl.unloaded_factor:g}xidle")
    return f"p{slo.percentile:g} TTFT<={'+'.join(ttft)} ITL<={'+'.join(itl)}"


Column = tuple[str, Callable[[str, Plan], object]]
PLAN_COLUMNS: Sequence[Column] = (
    ("NAME", lambda n, p: n),
    ("ENGINE", lambda n, p: p.engine),
    ("ACCEL", lambda n, p: p.accelerator),
    ("VARIANT", lambda n, p: p.variant),
    ("STRATEGY", lambda n, p: p.strategy),
    ("TP", lambda n, p: p.tensor_parallel_size),
    ("DP", lambda n, p: p.data_parallel_size),
    ("EP", lambda n, p: p.expert_parallel_size),
    ("GPUS", lambda n, p: p.gpus_per_replica),
    ("NODES", lambda n, p: p.nodes_per_replica),
    ("CONTEXT", lambda n, p: p.max_model_len),
    ("KV", lambda n, p: p.kv_cache_dtype),
    ("KV-TOKENS", lambda n, p: p.kv_cache_tokens_per_replica),
    ("SEQS@MAX", lambda n, p: p.max_sequences_at_max_len),
    ("VALIDATED", lambda n, p: "yes" if p.validated else "no"),
)


CACHE_COLUMN: Column = (
    "CACHE",
    lambda n, p: f"{p.model_cache} ({p.model_cache_node_affinity})" if p.model_cache else "-",
)


def format_table(rows: list[Row]) -> str:
    columns = [*PLAN_COLUMNS, *([CACHE_COLUMN] if any(p.model_cache for _, p, _ in rows) else [])]
    cells = [[h for h, _ in columns]] + [[str(f(n, p)) for _, f in columns] for n, p, _ in rows]
    if any(a is not None for _, _, a in rows):  # as the cache: a column only when a row has something in it
        cells[0] += ["REPLICAS", "SLO"]
        for row, (_, _, a) in zip(cells[1:], rows, strict=True):
            row += [f"{a.min_replicas}-{a.max_replicas}", slo_text(a.slo)] if a is not None else ["-", "-"]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells) + "\n"
    return table + "".join(disaggregation_text(n, p) for n, p, _ in rows if p.disaggregation is not None)


def disaggregation_text(name: str, p: Plan) -> str:
    """Below the table, for a disaggregated resource: both roles, the ratio and how it was reached."""
    d = p.disaggregation
    if d is None:
        return ""

    def role(label: str, r: RolePlan) -> str:
        layout = f"{r.strategy} TP{r.tensor_parallel_size} DP{r.data_parallel_size} EP{r.expert_parallel_size}"
        return f"{r.replicas} {label} x ({layout}, {r.gpus_per_worker} GPUs on {r.nodes_per_worker} node(s))"

    head = (
        f"\n{name}: disaggregated on NVIDIA Dynamo {d.dynamo_version} ({d.render_as}), ratio {d.ratio}: "
        f"{role('prefill', d.prefill)} + {role('decode', d.decode)} + {d.frontend_replicas} frontend(s)\n"
    )
    return head + "".join(f"  {line}\n" for line in d.reasoning)


def _plan(resource: MiniMaxM3Deployment, caches: Caches) -> Row:
    """The plan, once everything `render` (and so the admission webhook) would refuse is ruled out."""
    planned = plan(resource.spec)
    check(resource, planned, cache_of(resource, caches))
    autoscaling = resource.spec.autoscaling
    return resource.metadata.name, planned, autoscaling if autoscaling.enabled else None


def run(args: argparse.Namespace) -> int:
    results, problems = process(args, _plan)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return EXIT_INVALID
    if args.output == "table":
        sys.stdout.write(format_table(results) if results else "")  # as kubectl: no header over nothing
    elif args.output == "json":
        sys.stdout.write(dump([plan_dict(p, a) for _, p, a in results], "json"))
    else:
        sys.stdout.write(dump([plan_dict(p, a) for _, p, a in results], "yaml"))
    return EXIT_OK

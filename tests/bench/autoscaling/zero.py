"""Scale to zero behind a gateway (issue 46 item 4): per seed, what idling at zero saves and what cold starts cost.

On the same requests and cold starts, with the gateway's bounded holding (the simulator's `Holding`: GIE v1.3.0's
flow control, the HTTPRoute's request timeout), the policy runs twice: at minReplicas 1, and at minReplicas 0 with
the product's zero rule (policy/zero.py) over it and `scaleToZeroAfterSeconds` = the idle window given. A request
refused or timed out while held fails, so it counts against attainment.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from m3fleet_simulator.fleet import Holding, PolicyResult
from m3fleet_simulator.whatif import ScaleToZero, Setup, context_aware, simulate


def holding(setup: Setup) -> Setup:
    """The same run with the gateway's bounded holding at zero ready replicas."""
    return replace(setup, settings=replace(setup.settings, holding=Holding()))


def _row(result: PolicyResult) -> dict[str, Any]:
    return {**result.to_dict(), "heldFailed": result.held_failed}


def zero_report(setup: Setup, idle_after_seconds: float) -> dict[str, Any]:
    """One seed: the policy at minReplicas 1 against the policy at minReplicas 0 with the zero rule."""
    held = holding(setup)
    kept = simulate(held, context_aware(held, min_replicas=1))
    zero = simulate(held, ScaleToZero(context_aware(held, min_replicas=0), idle_after_seconds))
    return {
        "scenario": setup.scenario.name,
        "seed": setup.seed,
        "coldStartSeconds": setup.cold_start,
        "scaleToZeroAfterSeconds": idle_after_seconds,
        "minReplicas1": _row(kept),
        "scaleToZero": _row(zero),
        "gpuHoursSaved": round(kept.gpu_hours - zero.gpu_hours, 2),
        "attainmentPointsLost": round((kept.slo_attainment - zero.slo_attainment) * 100, 2),
    }


def format_zero(rows: list[dict[str, Any]]) -> str:
    lines = ["seed  cold start  GPU-h min1 -> zero (saved)   attainment min1 -> zero (points lost)  held failed"]
    for row in rows:
        kept, zero = row["minReplicas1"], row["scaleToZero"]
        cold = "default" if row["coldStartSeconds"] is None else f"{row['coldStartSeconds']:g} s"
        lines.append(
            f"{row['seed']:>4}  {cold:>10}  {kept['gpuHours']:.2f} -> {zero['gpuHours']:.2f}"
            f" ({row['gpuHoursSaved']:.2f})"
            f"   {kept['sloAttainment']:.4f} -> {zero['sloAttainment']:.4f} ({row['attainmentPointsLost']:.2f})"
            f"   {zero['heldFailed']}"
        )
    return "\n".join(lines) + "\n"

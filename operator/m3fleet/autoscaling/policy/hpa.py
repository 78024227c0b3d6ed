"""HPA's behaviour: the tolerance band, the stabilization windows and the per-step limits, as HPA defines them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

HPA_SCALE_UP_PODS: Final = 4  # HPA default scale-up policy: max(+4 pods, +100%) per period


@dataclass(frozen=True)
class Behavior:
    """HPA `behavior`: stabilization windows and per-step limits (None = unlimited, HPA's 100%)."""

    scale_up_window_seconds: float = 0.0
    scale_down_window_seconds: float = 300.0
    max_scale_down_per_step: int | None = None
    limit_scale_up: bool = True  # max(+4, +100%) per step


def recommend(need: float, current: int, tolerance: float) -> int:
    """HPA's tolerance band: no change while need/current is within `tolerance` of 1."""
    if current > 0 and abs(need / current - 1.0) <= tolerance:
        return current
    return max(0, math.ceil(need - 1e-9))


def prune_history(
    history: Sequence[tuple[float, int]], now: float, up_window: float, down_window: float
) -> tuple[tuple[float, int], ...]:
    """Keep only entries a window can still use: a newer, higher (lower) one supersedes for max (min)."""
    kept: list[tuple[float, int]] = []
    later_max, later_min = -math.inf, math.inf
    for t, n in reversed(history):
        age = now - t
        if (age <= down_window and n > later_max) or (age <= up_window and n < later_min):
            kept.append((t, n))
        later_max, later_min = max(later_max, n), min(later_min, n)
    return tuple(reversed(kept))


def stabilize(
    history: Sequence[tuple[float, int]],
    now: float,
    recommendation: int,
    current: int,
    behavior: Behavior,
    hold_down: bool = False,
) -> tuple[int, tuple[tuple[float, int], ...]]:
    """HPA's normalizeDesiredReplicasWithBehaviors: (desired, new history)."""
    up_w, down_w = behavior.scale_up_window_seconds, behavior.scale_down_window_seconds
    entries = [*history, (now, recommendation)]
    up_rec = min(n for t, n in entries if now - t <= up_w)
    down_rec = max(n for t, n in entries if now - t <= down_w)
    desired = current
    if up_rec > current:
        desired = up_rec
        if behavior.limit_scale_up:
            desired = min(desired, max(current + HPA_SCALE_UP_PODS, 2 * current))
    elif down_rec < current and not hold_down:
        desired = down_rec
        if behavior.max_scale_down_per_step is not None:
            desired = max(desired, current - behavior.max_scale_down_per_step)
    return desired, prune_history(entries, now, up_w, down_w)

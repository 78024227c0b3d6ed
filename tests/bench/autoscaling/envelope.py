"""The late-oracle envelope: per seed, the best SLO attainment for each GPU-hour budget that a fleet can reach when
it knows each episode of the load from the second autoscaler tick that could see it.

What a causal policy cannot know is when the load changes; what it can learn, at best, is the whole of a change
once it is visible. So each reference run knows the requests of a scenario's phase (its chat, each burst, each
return to chat) from the `KNOWS_FROM_TICK`-th tick whose scrape follows the phase's start, and plans for them as
the oracle does (`oracle.oracle_need`: prefill work, KV in flight and long requests, ordered one cold start ahead).
A long prompt outside a burst (longer than any chat prompt, `CHAT_PROMPT.high`; `sporadic-long-prompts`: one every
few minutes at random) is its own episode: known from the second tick after it arrived. Until it knows an
episode a run serves it with what it already has.

The runs sweep the three things a policy chooses without knowing the future: replicas standing all the
time (minReplicas .. +2), headroom over the known need, and a scale-down hold (the count never falls below what
any tick in the last `hold` seconds ordered). The envelope is the Pareto front of every run: at a budget of B
GPU-hours, the best attainment of a run costing at most B (a step function: only whole runs are achievable; none
below the cheapest run). It is a reference, not a bound: the moment it knows an episode it knows all of it, which
a policy still has to estimate; and it is a discrete sweep, so a policy can beat it between its points.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from m3fleet_simulator.scenarios import CHAT_PROMPT, Request
from m3fleet_simulator.whatif import Setup, simulate

from .baselines import Schedule
from .oracle import LATE_STANDING_EXTRA, oracle_need

KNOWS_FROM_TICK: Final = 2  # the reference: an episode is known from the second tick that can see it
# The sweep (issue 46 item 2: standing replicas, headroom and a scale-down hold). Headroom: from the bare need to
# 3x it, where the oracle's bisected headroom lies on every development seed (1.0-2.3, RESULTS.md). Holds: none,
# two minutes, and HPA's default 300 s scale-down stabilization window.
HEADROOMS: Final = (1.0, 1.15, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0)
HOLD_SECONDS: Final = (0.0, 120.0, 300.0)
BURST_LABEL: Final = "burst"  # a phase whose label says burst is known as a whole from its start


@dataclass(frozen=True)
class ReferenceRun:
    standing: int
    headroom: float
    hold_seconds: float
    attainment: float
    gpu_hours: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "standingReplicas": self.standing,
            "headroom": self.headroom,
            "holdSeconds": self.hold_seconds,
            "sloAttainment": round(self.attainment, 4),
            "gpuHours": round(self.gpu_hours, 2),
        }


def _visible_cell(setup: Setup, when: float) -> int:
    """The tick (as a `Schedule` cell) that is the `KNOWS_FROM_TICK`-th to read a scrape taken after `when`."""
    settings = setup.settings
    first_scrape = math.ceil(when / settings.scrape_seconds) * settings.scrape_seconds
    return int((first_scrape + settings.tick_offset_seconds) // settings.tick_seconds) + KNOWS_FROM_TICK - 1


def known_from(setup: Setup) -> list[int]:
    """Per request of the measured window, the cell from which the late oracle knows it."""
    phases = setup.scenario.phases(setup.seed) if setup.scenario.kind == "scenario" else []  # type: ignore[attr-defined]
    out = []
    for r in setup.requests:
        phase = next((p for p in phases if p.start <= r.arrival < p.end), None)
        start = 0.0 if phase is None else phase.start
        if r.prompt > CHAT_PROMPT.high and (phase is None or BURST_LABEL not in phase.label):
            start = r.arrival  # a long prompt outside a burst: its own episode
        out.append(_visible_cell(setup, start))
    return out


def late_counts(setup: Setup, headroom: float) -> list[int]:
    """Per cell, the replicas the late oracle orders at `headroom` before any standing floor or hold: the need of
    the requests it knows by then, over the cells one cold start ahead."""
    step = setup.settings.tick_seconds
    span = setup.duration + setup.settings.tail_seconds
    cells = math.ceil(span / step) + 1
    lead = math.ceil((setup.worst_cold_start() + step) / step)
    known = known_from(setup)
    s = setup.scenario
    counts = [s.min_replicas] * cells
    marks = sorted(set(known))
    for mark, following in itertools.zip_longest(marks, marks[1:], fillvalue=cells):
        if mark >= cells:
            break
        requests: Sequence[Request] = [r for r, k in zip(setup.requests, known, strict=True) if k <= mark]
        need = oracle_need(requests, setup.model, setup.plan, span, step)
        base = [max(s.min_replicas, min(s.max_replicas, math.ceil(headroom * n - 1e-9))) for n in need]
        for i in range(max(0, mark), min(cells, following)):
            counts[i] = max(base[i : i + lead + 1])
    return counts


def shaped(counts: Sequence[int], standing: int, hold_cells: int) -> list[int]:
    """`counts` with `standing` replicas under them and each cell held for `hold_cells` cells after it."""
    floor = [max(standing, c) for c in counts]
    return [max(floor[max(0, i - hold_cells) : i + 1]) for i in range(len(floor))]


def reference_runs(setup: Setup) -> list[ReferenceRun]:
    """Every run of the sweep on this seed."""
    lowest = setup.scenario.min_replicas
    highest = min(setup.scenario.max_replicas, lowest + LATE_STANDING_EXTRA)
    step = setup.settings.tick_seconds
    runs = []
    seen: dict[tuple[int, ...], tuple[float, float]] = {}
    for headroom in HEADROOMS:
        base = late_counts(setup, headroom)
        for standing, hold in itertools.product(range(lowest, highest + 1), HOLD_SECONDS):
            counts = tuple(shaped(base, standing, round(hold / step)))
            if counts not in seen:  # e.g. a standing floor above every count: the same schedule
                result = simulate(setup, Schedule(counts, step, setup.clock_offset, name="late-oracle"))
                seen[counts] = (result.slo_attainment, result.gpu_hours)
            attainment, gpu_hours = seen[counts]
            runs.append(ReferenceRun(standing, headroom, hold, attainment, gpu_hours))
    return runs


def envelope(runs: Sequence[ReferenceRun]) -> list[ReferenceRun]:
    """The Pareto front of `runs`, cheapest first (attainment rises along it)."""
    out: list[ReferenceRun] = []
    for run in sorted(runs, key=lambda r: (r.gpu_hours, -r.attainment)):
        if not out or run.attainment > out[-1].attainment:
            out.append(run)
    return out


def attainment_at(curve: Sequence[dict[str, Any]], gpu_hours: float) -> float | None:
    """The envelope's best attainment for at most `gpu_hours`; None below its cheapest run."""
    within = [p["sloAttainment"] for p in curve if p["gpuHours"] <= gpu_hours]
    return max(within) if within else None


def gpu_hours_at(curve: Sequence[dict[str, Any]], attainment: float) -> float | None:
    """The envelope's fewest GPU-hours for at least `attainment`; None where no run reaches it."""
    reaching = [p["gpuHours"] for p in curve if p["sloAttainment"] >= attainment]
    return min(reaching) if reaching else None

"""Floors under the recommendation: the forecast from the resource's own history and the standing capacity a
burst of chat leaves behind.

**Standing capacity** (`standing_seconds`): a burst of chat (more requests, not longer ones) lasts minutes, less
than a cold start, so it is served only by replicas already there; released, they come back a time-to-ready after
the next such burst began, and that burst's requests beyond the fleet left standing miss the SLO meanwhile. Keeping
them costs GPU-hours, releasing them costs attainment; the SLO says how much attainment may go: (100 - percentile)%
of requests. So the capacity the burst needed stands until the error budget accrued since it began would cover
what a recurrence would lose: the share of its requests beyond the need without it, for one time-to-ready. The
burst's request rate is taken as the average's (it is higher), which shortens the hold: the rule errs towards
GPU-hours. At the default p95 and a 90 s cold start, a burst twice the steady need stands 15 minutes.

**The fleet as found** stands by the same rule: the replicas the autoscaler finds at its first tick (the spec's,
set by someone who knows the traffic, or what the fleet ran before the autoscaler was turned on) are the one
evidence of a need it has not seen yet. Released at once, a first burst of that need is met a cold start short,
and a constant fleet of that size, autoscaling left off, would have served it: so they stand until the error
budget covers such a miss. The rule does not hold a fleet with nothing to serve: a need of zero is the idle rule's
(`scaleToZeroAfterSeconds`, `minReplicas`).

**Nothing holds a burst of long prompts** after its prompts stop: it lasts long enough to be served by the replicas
it orders, and once its long prompts stop arriving the scale-down window forgets it. A hold for two such bursts
within three cold starts of each other was measured on `repeated-long-bursts` (bursts that come back within
minutes) and removed: a recurrence that soon arrives while the prompt estimate still remembers the last burst, so
it is seldom a burst of its own to pair with; at 90 s the hold never acted, and at 3-6 minute cold starts it acted
on 8 of 32 seeds and held replicas for a third burst that mostly did not come, 1-87% more GPU-hours for 0-7 points
(RESULTS.md, "The burst floor's recurring half").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from m3fleet.autoscaling.forecast import Bounds, Forecast, forecast_floor
from m3fleet.autoscaling.policy.config import PolicyConfig
from m3fleet.autoscaling.policy.demand import Terms
from m3fleet.autoscaling.policy.hpa import recommend
from m3fleet.autoscaling.policy.state import Burst, PolicyState
from m3fleet.autoscaling.signals import MetricsSnapshot

# The smallest error budget the standing rule divides by: the CRD's largest slo.percentile, 99.99, leaves 0.01%.
MIN_ERROR_BUDGET: Final = 1e-4


@dataclass(frozen=True)
class Floors:
    """The recommendation after the floors under it: the forecast from the resource's own history and the
    standing capacity."""

    recommendation: int
    forecast: Forecast | None
    burst: Burst | None  # the last burst, to keep
    standing: int
    bounds: Bounds
    raised_by: str | None = None  # the floor that set the recommendation: forecast, standing
    found: tuple[float, int] | None = None  # (time, replicas) of the fleet at the policy's first tick


def with_floors(
    config: PolicyConfig,
    state: PolicyState,
    snapshot: MetricsSnapshot,
    terms: Terms,
    bounds: Bounds,
    current: int,
    when: tuple[float, float, float],
    notes: list[str],
) -> Floors:
    """`when`: now, the horizon and the time-to-ready. Says in `notes` which floor raised the recommendation."""
    now, horizon, time_to_ready = when

    def clamp(n: int) -> int:
        return max(bounds.min_replicas, min(bounds.max_replicas, n))

    recommendation = clamp(recommend(terms.need, current, config.tolerance))
    raised_by = None
    # A burst is recorded with what it needed, not with the forecast floor under it: a chat blip at a floor of 6
    # would stand at 6 long after the floor fell.
    needed = recommendation
    forecast = forecast_floor(snapshot.demand_history, config.tolerance) if config.forecast else None
    if forecast is not None:
        terms.values["forecastReplicas"] = float(forecast.replicas)
        if forecast.replicas > recommendation:
            recommendation, raised_by = clamp(forecast.replicas), "forecast"
            notes.append(f"forecast floor {recommendation}: {forecast.reason}")
    # A burst's need is recorded from a rate window after its start (within the horizon, which can be short).
    lasting = min(snapshot.window_seconds, horizon / 2)
    chat = terms.prompt_tokens < config.long_prompt_tokens
    budget = 1.0 - config.slo.percentile / 100.0
    # Kept while it can still stand, be the same burst (a horizon) or shape the rate window's estimates (demand's
    # time since the last burst).
    memory = max(standing_seconds(1.0, time_to_ready, budget), horizon, snapshot.window_seconds)
    burst = _record_burst(state.burst, now, terms.burst, needed, horizon, memory, lasting, chat)
    found = state.found if state.found is not None else (now, current)
    standing, why = _standing(burst, found, now, needed, time_to_ready, budget) if config.burst_hold else (0, "")
    terms.values["standingReplicas"] = float(standing)
    if standing > recommendation:
        recommendation, raised_by = clamp(standing), "standing"
        notes.append(f"standing capacity {recommendation}: {why}")
    return Floors(recommendation, forecast, burst, standing, bounds, raised_by, found)


def standing_seconds(shortfall: float, time_to_ready: float, budget: float) -> float:
    """How long a burst of chat's capacity stands (the module docstring): until the error budget (`budget`, the
    share of requests the SLO lets miss) accrued since it began covers the `shortfall` share of a recurrence's
    requests missing for one `time_to_ready`."""
    return shortfall * time_to_ready / max(budget, MIN_ERROR_BUDGET)


def _standing(
    burst: Burst | None,
    found: tuple[float, int],
    now: float,
    needed: int,
    time_to_ready: float,
    budget: float,
) -> tuple[int, str]:
    """(replicas, why): the most that the last burst of chat needed or the fleet as found, while
    `standing_seconds` since it began (the module docstring)."""
    sources: list[tuple[float, int, str]] = [
        (found[0], found[1], f"the fleet had {found[1]} replicas when the autoscaler first saw it")
    ]
    if burst is not None and burst.chat:
        sources.append((burst.start, burst.replicas, f"a burst of chat needed {burst.replicas}"))
    standing, why = 0, ""
    for start, most, what in sources:
        if needed == 0 or most <= max(needed, standing):
            continue
        stands = standing_seconds(1.0 - needed / most, time_to_ready, budget)
        if now - start > stands:
            continue
        standing, why = (
            most,
            (
                f"{what} {now - start:.0f}s ago; released, a recurrence would miss {1.0 - needed / most:.0%} of its "
                f"requests for a {time_to_ready:.0f}s cold start, which the SLO's {budget:.1%} error budget covers "
                f"only after {stands:.0f}s"
            ),
        )
    return standing, why


def _record_burst(
    last: Burst | None,
    now: float,
    burst: bool,
    needed: int,
    horizon: float,
    memory: float,
    lasting: float,
    chat: bool,
) -> Burst | None:
    """The last burst, with the replicas the need recommended from `lasting` after its start until one horizon after
    it and whether the prompt estimate said chat throughout that horizon; a burst detected within the horizon of the
    previous one is the same burst. What a burst needs in its first `lasting` seconds is not recorded: a
    lone long prompt looks like a burst's start for a tick or two, is served within a rate window and leaves
    nothing to hold, while a burst still needs its replicas then. Dropped once `memory` old."""
    kept = last if last is not None and now - last.start <= memory else None
    if kept is not None and now - kept.start <= horizon:
        most = max(kept.replicas, needed) if now - kept.start >= lasting else kept.replicas
        return Burst(kept.start, most, kept.chat and chat)
    if burst:
        return Burst(now, 0, chat)
    return kept

"""How far a tick moves: HPA's windows and step limits over the recommendation, the scale-down window forgetting a
burst once its long prompts stopped, and the replicas still starting that the need no longer wants."""

from __future__ import annotations

from typing import Final

from m3fleet.autoscaling.policy.config import PolicyConfig
from m3fleet.autoscaling.policy.demand import Terms
from m3fleet.autoscaling.policy.floors import Floors
from m3fleet.autoscaling.policy.hpa import Behavior, prune_history, recommend, stabilize
from m3fleet.autoscaling.policy.state import PolicyState
from m3fleet.autoscaling.signals import FleetState

DEFAULT_SCALE_DOWN_PER_STEP: Final = 1  # replicas a tick removes when the spec sets no limit (but see _scale_down_step)


# A replica still starting is released only below the highest need the window recorded this long ago: tick to tick
# the estimates are noisy, and a replica released and ordered again a tick later starts its cold start over.
RELEASE_STARTING_AFTER_SECONDS: Final = 60.0


# The reason's note on a tick whose scale-down window forgot a burst (so it may scale down inside the window).
WINDOW_RELEASED: Final = "long prompts stopped arriving: the scale-down window forgets the burst"


def forgets_burst(config: PolicyConfig, terms: Terms) -> bool:
    """Whether this tick's scale-down window forgets what it remembered: long prompts stopped arriving."""
    return terms.long_prompts_ended and config.release_ended_bursts


def when_burst_ended(config: PolicyConfig, state: PolicyState, terms: Terms, now: float) -> float | None:
    """When today's last burst ended (its long prompts stopped arriving); None once a new burst came since."""
    if forgets_burst(config, terms):
        return now
    return None if terms.burst else state.burst_ended


def _scale_down_step(config: PolicyConfig, terms: Terms, burst_ended: float | None) -> int | None:
    """Most replicas one tick removes (None: no limit). The spec's limit when it sets one. Else one a tick,
    except once today's burst has ended (its long prompts stopped arriving, see `when_burst_ended`) and no request
    waits: the replicas the burst needed serve nothing any more, and shrinking one a tick kept most of them for
    as many ticks (on `long-context-burst` at 90 s, 20 replicas took five minutes to go). While requests wait
    the end may be a lull inside the burst (its estimate fell for a tick): one a tick, as before."""
    if config.max_scale_down_per_step is not None:
        return config.max_scale_down_per_step
    if burst_ended is not None and not terms.values["waitingRequests"]:
        return None
    return DEFAULT_SCALE_DOWN_PER_STEP


def stabilized(
    config: PolicyConfig,
    state: PolicyState,
    fleet: FleetState,
    floors: Floors,
    terms: Terms,
    burst_ended: float | None,
    hold_down: bool,
    limit_scale_up: bool,
) -> tuple[int, tuple[tuple[float, int], ...]]:
    """HPA's stabilization and step limits over the recommendation: (replicas, the history to keep)."""
    now, current, recommendation = fleet.now, fleet.current_replicas, floors.recommendation
    behavior = Behavior(
        scale_up_window_seconds=config.scale_up_window_seconds,
        scale_down_window_seconds=config.scale_down_window_seconds,
        max_scale_down_per_step=_scale_down_step(config, terms, burst_ended),
        limit_scale_up=limit_scale_up,
    )
    history_in = state.history
    if forgets_burst(config, terms):
        # Long prompts stopped arriving and none is resident: the window's memory of what they needed goes
        # with them (what still decodes drains on the replicas being removed).
        history_in = ()
    elif not history_in and config.scale_down_window_seconds > config.scale_up_window_seconds:
        # A first tick (or a restart without saved state): as if `current` had just been recommended,
        # so nothing is removed before a whole scale-down window of evidence exists.
        history_in = ((now - config.scale_up_window_seconds - 1e-6, current),)
    desired, history = stabilize(history_in, now, recommendation, current, behavior, hold_down=hold_down)
    if config.transient_release and history and history[-1][0] == now:
        # What the stabilization window remembers: the recommendation without the replicas kept busy
        # by backlogs. A backlog is drained by the replicas it is queued on within a horizon, so the
        # extra replicas ordered for it must not hold for a whole scale-down window after it is gone;
        # the panic hold covers the backlog's own life. Nor, once today's burst has ended, the forecast
        # floor: it still holds while the earlier days' burst lasted, but the window must not hold it a
        # second time after it falls. Until then the window keeps it, a margin when the measured need is
        # wrong (a prior off by 2x): forgetting it during a burst cost the priors check 5 development and 9
        # held-out seeds.
        steady = config.clamp(recommend(terms.values["demandReplicas"], current, config.tolerance))
        forecast = floors.forecast.replicas if floors.forecast is not None else 0
        if burst_ended is not None:
            forecast = 0
        steady = max(steady, forecast, floors.standing, floors.bounds.min_replicas)
        # Pruned with the value recorded, not the recommendation: a higher recommendation would supersede
        # (and drop) earlier entries that the lower value recorded does not.
        recorded = (now, min(recommendation, max(steady, 1)))
        history = prune_history(
            (*history_in, recorded), now, behavior.scale_up_window_seconds, behavior.scale_down_window_seconds
        )
    return desired, history


def unneeded_starting(
    config: PolicyConfig,
    state: PolicyState,
    fleet: FleetState,
    terms: Terms,
    desired: int,
    recommendation: int,
    missing: int,
    time_to_ready: float,
) -> tuple[int, str]:
    """(replicas still starting to release, why): those the windows (or the panic hold) keep but the need has not
    wanted for a minute (`RELEASE_STARTING_AFTER_SECONDS`), while long prompts arrive or once they stopped
    arriving. A long-context burst is first ordered on its first minute of prompt lengths and, until a replica has
    been measured, the prior throughput; both are revised within a few ticks, and a replica ordered on the first
    estimate would serve nothing until ready and then hold GPUs for a whole window. Once long prompts stopped
    arriving (a tick ago or more, and the estimate still says chat), a replica still starting for them serves
    nothing: a lone long prompt, taken for a burst's start, is served long before the replicas it ordered are
    ready, and the panic hold would keep them for its whole length. Ready replicas keep the windows' protection.
    Chat bursts keep it for starting replicas too: shorter than a cold start, they recur, and the replica still
    starting serves the next one (releasing them cost `bursty` up to 22 points a seed). While long prompts arrive, a
    replica due before the next tick counts as ready (below)."""
    if missing:
        return 0, ""
    long_prompts = terms.prompt_tokens >= config.long_prompt_tokens
    if not long_prompts and state.burst_ended is None:
        return 0, ""  # chat, and no long prompts have come and gone since the last burst
    if (
        long_prompts
        and state.burst_ended is not None
        and fleet.now - state.burst_ended < RELEASE_STARTING_AFTER_SECONDS
    ):
        return 0, ""  # the window just forgot a burst: it holds no minute of needs to release against
    recent = [n for t, n in state.history if fleet.now - t <= RELEASE_STARTING_AFTER_SECONDS]
    # While long prompts arrive, a replica due before the next tick serves from then on and keeps a ready replica's
    # protection: the need may have fallen only because it is due (arrivals stop piling up once it serves), and if
    # arrivals rise again it is ordered again with a whole cold start ahead. Once they stopped arriving it has
    # nothing to serve, due or not.
    remaining = fleet.starting_remaining or tuple(time_to_ready - age for age in fleet.starting_ages)
    due = sum(1 for seconds in remaining if seconds <= config.interval_seconds)
    why = (
        "long prompts arriving, beyond the need now and the window's last minute"
        if long_prompts
        else "long prompts stopped arriving"
    )
    ready = fleet.ready_replicas + (due if long_prompts else 0)
    return max(0, desired - max(recommendation, *recent, ready)), why

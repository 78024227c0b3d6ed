"""One tick of the policy: `decide(config, state, snapshot, fleet) -> (Decision, PolicyState)`."""

from __future__ import annotations

from dataclasses import replace

from m3fleet.autoscaling.policy.apply import removal_costs
from m3fleet.autoscaling.policy.config import PolicyConfig
from m3fleet.autoscaling.policy.decision import (
    MEASURED,
    PRIOR,
    Decision,
    action_phrase,
    decided_by,
    explain_need,
    make_decision,
)
from m3fleet.autoscaling.policy.demand import check_health, compute_terms
from m3fleet.autoscaling.policy.floors import with_floors
from m3fleet.autoscaling.policy.scale_down import (
    WINDOW_RELEASED,
    forgets_burst,
    stabilized,
    unneeded_starting,
    when_burst_ended,
)
from m3fleet.autoscaling.policy.state import PolicyState
from m3fleet.autoscaling.signals import FleetState, MetricsSnapshot


def decide(
    config: PolicyConfig, state: PolicyState, snapshot: MetricsSnapshot, fleet: FleetState
) -> tuple[Decision, PolicyState]:
    """One tick: the decision and the state to keep for the next tick."""
    now, current = fleet.now, fleet.current_replicas
    # The horizon: the measured time-to-ready (the operator's p90 of the last replicas to become ready),
    # and the spec's coldStartSeconds only until a replica has been measured.
    measured = fleet.time_to_ready_seconds is not None
    time_to_ready = (
        fleet.time_to_ready_seconds if fleet.time_to_ready_seconds is not None else config.cold_start_seconds
    )
    horizon = time_to_ready + config.interval_seconds
    ttr = (time_to_ready, MEASURED if measured else PRIOR)
    panic_active = state.panic_until is not None and now < state.panic_until
    health = check_health(config, snapshot, fleet)
    bounds = config.bounds(now)

    def clamp(n: int) -> int:
        return max(bounds.min_replicas, min(bounds.max_replicas, n))

    if health.hold is not None:
        desired = clamp(current)
        reason = f"hold: {health.hold}; never scale down without metrics"
        if desired != current:
            reason = f"{health.hold}; only the min/max bounds apply ({current} -> {desired})"
        hold_terms = {"horizonSeconds": horizon, "freshReplicas": float(len(health.fresh))}
        decision = make_decision(
            config,
            fleet,
            desired,
            desired,
            reason,
            bounds,
            panic_active,
            terms=hold_terms,
            time_to_ready=ttr,
            decided_by="metricsUnavailable",
        )
        return decision, replace(state, last_time=None, in_flight=())

    terms = compute_terms(config, state, health, snapshot, fleet, horizon)
    notes: list[str] = []
    if bounds.windows:
        notes.append(f"schedule {', '.join(bounds.windows)} in force: {bounds.min_replicas}-{bounds.max_replicas}")
    floors = with_floors(config, state, snapshot, terms, bounds, current, (now, horizon, time_to_ready), notes)
    recommendation = floors.recommendation
    if health.missing:
        # Held, not recommended: a replica that just became ready has no scrape yet, and recording
        # `current` would keep the whole scale-down window at today's count.
        notes.append(f"{health.missing} ready replicas have no fresh metrics: no scale-down")
    if terms.capacity.warning:
        notes.append("KV capacity reported unlike the plan (see capacity)")
    sparse = sum(1 for r in health.fresh if r.scrapes_in_window is not None and r.scrapes_in_window < 2)
    if sparse:
        window = snapshot.window_seconds
        notes.append(
            f"{sparse} replicas have fewer than two scrapes in the {window:.0f}s rate window, so their token and "
            f"request rates are unknown: scrape engine pods every {window / 2:.0f}s or less, or raise "
            "spec.autoscaling.prometheus.rateWindowSeconds to 4x the scrape interval"
        )

    if forgets_burst(config, terms) and state.history:
        notes.append(WINDOW_RELEASED)
    panic_until = state.panic_until if panic_active else None
    if terms.need >= config.panic_threshold * max(1, fleet.ready_replicas):
        panic_until = now + config.panic_hold_seconds
    panic = panic_until is not None
    burst_ended = when_burst_ended(config, state, terms, now)
    desired, history = stabilized(
        config, state, fleet, floors, terms, burst_ended, panic or health.missing > 0, not panic
    )
    released, why = unneeded_starting(
        config, state, fleet, terms, desired, recommendation, health.missing, time_to_ready
    )
    if released:
        desired -= released
        notes.append(f"{released} starting replicas released: {why}")
    desired = clamp(desired)  # the bounds are hard, whatever the step limits say
    limiter = "panic" if panic else "missingMetrics" if health.missing else "releasedStarting" if released else None
    if limiter is None and desired != recommendation:
        limiter = "scaleDownWindow" if desired > recommendation else "scaleUpWindow"

    if panic:
        notes.append(f"panic (need >= {config.panic_threshold}x ready) until t={panic_until:.0f}")
    held_by = "panic" if panic else "missing metrics" if health.missing else None
    verb = action_phrase(config, current, desired, recommendation, round(terms.need), held_by)
    reason = f"{verb}: {explain_need(terms)}" + "".join(f"; {n}" for n in notes)

    warnings = (("KVCapacityMismatch", terms.capacity.warning),) if terms.capacity.warning else ()
    decision = make_decision(
        config,
        fleet,
        desired,
        recommendation,
        reason,
        bounds,
        panic,
        terms=terms.values,
        unservable_requests=terms.unservable,
        forecast=None if floors.forecast is None else (floors.forecast.replicas, floors.forecast.reason),
        capacity=terms.capacity.status,
        prefill=terms.prefill,
        time_to_ready=ttr,
        warnings=warnings,
        removal_costs=removal_costs(health.fresh, terms.capacity.replica) if desired < current else {},
        decided_by=decided_by(terms, floors.raised_by, bounds, recommendation, desired, limiter),
    )
    new_state = PolicyState(
        history=history,
        panic_until=panic_until,
        last_time=now,
        in_flight=terms.in_flight,
        request_rate=terms.request_rate,
        prompt_tokens=terms.prompt_tokens,
        burst=floors.burst,
        prefill_rate=terms.prefill_rate,
        prefill_samples=terms.prefill_samples,
        prefill_cap_ticks=terms.prefill_cap_ticks,
        burst_ended=burst_ended,
        bytes_per_token=terms.bytes_per_token,
        gateway_jump=terms.gateway_jump,
        gateway_since=terms.gateway_since,
        found=floors.found,
    )
    return decision, new_state

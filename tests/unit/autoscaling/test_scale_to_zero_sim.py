"""Scale to zero in the simulator (issue 46 item 4): the gateway's bounded holding at zero ready replicas, and the
product's zero rule (policy/zero.py) run over the policy on the held-request count."""

from __future__ import annotations

from m3fleet_simulator import whatif as sim
from m3fleet_simulator.fleet import HELD_TIMEOUT_SECONDS, GatewayModel, Holding, SimSettings, Simulation
from m3fleet_simulator.scenarios import Request
from tests.bench.autoscaling.zero import holding, zero_report
from tests.support.autoscaling.simulation import outside_fleet

REQUESTS = [Request(i, 1.0 + i, 1000, 50) for i in range(3)]


def gatewayed(requests: list[Request], held: Holding | None) -> Simulation:
    """At zero replicas behind a holding gateway; its replicas are the names given to `follow`."""
    return outside_fleet(requests, SimSettings(gateway=GatewayModel(bytes_per_token=4.0, seed=1), holding=held))


def test_the_held_timeout_is_the_routes_default_request_timeout() -> None:
    assert HELD_TIMEOUT_SECONDS == 900.0


def test_requests_are_held_at_zero_and_released_to_the_first_ready_replica() -> None:
    live = gatewayed(REQUESTS, Holding())
    live.advance(10.0)
    assert len(live.held) == 3 and live.in_flight == 0
    live.follow({"r0"})
    assert not live.held
    live.advance(600.0)
    result = live.result()
    assert len(live.finished) == 3 and result.held_failed == 0 and result.unfinished == 0


def test_a_request_held_past_the_timeout_fails_and_counts_against_attainment() -> None:
    live = gatewayed(REQUESTS, Holding(timeout_seconds=5.0))
    live.advance(5.5)  # the first request (t = 1) has waited 4.5 s: still held
    assert len(live.held) == 3 and live.held_failed == 0
    live.advance(7.5)  # t = 1 and t = 2 have waited past 5 s
    assert live.held_failed == 2 and len(live.held) == 1
    live.follow({"r0"})
    live.advance(600.0)
    result = live.result()
    assert len(live.finished) == 1  # the third, served after 4.5 s held: past its TTFT SLO too
    assert (result.held_failed, result.met, result.slo_attainment) == (2, 0, 0.0)


def test_the_byte_bound_refuses_what_does_not_fit() -> None:
    live = gatewayed(REQUESTS, Holding(max_bytes=10_000.0))  # about two 1000-token prompts at 4 bytes a token
    live.advance(10.0)
    assert len(live.held) == 2 and live.held_failed == 1


def test_the_zero_rule_idles_the_fleet_at_zero_and_scales_from_zero_on_held_requests() -> None:
    setup = sim.prepare("idle-gaps", seed=1, gateway=True)
    row = zero_report(setup, 300.0)
    zero, kept = row["scaleToZero"], row["minReplicas1"]
    assert row["gpuHoursSaved"] > 0 and zero["gpuHours"] < kept["gpuHours"]
    # Every request arriving at zero was held and served once a replica came up (none failed at the 900 s timeout).
    assert zero["heldFailed"] == 0 and zero["unfinished"] == 0 and zero["requests"] == kept["requests"]
    assert row["attainmentPointsLost"] > 0  # they waited a cold start: the TTFT SLO is missed


def test_the_fleet_reaches_zero_only_through_the_rule() -> None:
    setup = holding(sim.prepare("idle-gaps", seed=1, gateway=True))
    idled = sim.simulate(setup, sim.ScaleToZero(sim.context_aware(setup, min_replicas=0), 300.0))
    assert 0 in idled.replica_minutes
    # The idle window longer than the scenario: the rule never takes the fleet to zero, whatever the policy asks.
    never = sim.simulate(setup, sim.ScaleToZero(sim.context_aware(setup, min_replicas=0), 10 * setup.duration))
    assert 0 not in never.replica_minutes


def test_without_holding_requests_wait_unbounded_as_before() -> None:
    live = gatewayed(REQUESTS, None)
    live.advance(HELD_TIMEOUT_SECONDS + 100.0)
    live.follow({"r0"})
    live.advance(HELD_TIMEOUT_SECONDS + 700.0)
    assert len(live.finished) == 3 and live.held_failed == 0

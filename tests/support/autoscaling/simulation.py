"""A started simulation with no autoscaler: its replicas are the names given to `follow`, ready at once."""

from __future__ import annotations

from collections.abc import Sequence

from m3fleet.api.models import Plan
from m3fleet_simulator.fleet import PerfModel, SimSettings, Simulation
from m3fleet_simulator.scenarios import Request
from tests.support.autoscaling.plans import sample_plan


def outside_fleet(
    requests: Sequence[Request], settings: SimSettings | None = None, plan: Plan | None = None
) -> Simulation:
    """`plan`: the vLLM 8xH200 sample's when None."""
    plan = plan or sample_plan()
    live = Simulation(
        plan,
        PerfModel.from_plan(plan),
        requests,
        None,
        duration=60.0,
        initial_replicas=0,
        cold_starts=(0.0,),
        measured_cold_starts=(),
        settings=settings or SimSettings(),
    )
    live.begin()
    return live

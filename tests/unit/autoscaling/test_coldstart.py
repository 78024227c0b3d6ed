"""The simulator's cold-start model built from the measured phases: a node-local cache (image pre-pulled) is
faster than a network PVC, which is faster than the Hub; draws stay within the stated bounds; the simulator
and `m3fleet simulate` use it and say so."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from m3fleet_simulator.coldstart import SOURCES, ColdStartModel
from m3fleet_simulator.whatif import parameters, prepare
from tests.support.autoscaling.plans import sample_plan


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_draws_are_the_sum_of_the_phases_and_within_the_bounds(source: str) -> None:
    model = ColdStartModel.of(source, sample_plan())
    low, high = model.bounds()
    rng = random.Random(7)
    for _ in range(200):
        phases = model.phases(rng)
        assert set(phases) == {"schedule", "image", "start", "load"}
        assert low <= sum(phases.values()) <= high
        assert (phases["image"] == 0.0) == SOURCES[source].image_pre_pulled


def test_a_cache_is_faster_than_a_pvc_and_a_pvc_than_the_hub() -> None:
    plan = sample_plan()  # BF16 TP8 on one H200 node: about 250 GB of weights per node
    cache, pvc, hub = (ColdStartModel.of(s, plan).bounds() for s in ("cache", "pvc", "hub"))
    assert cache[1] < pvc[0] and pvc[1] < hub[0]
    weights = ColdStartModel.of("pvc", plan).weights_gb_per_node
    assert weights == pytest.approx(plan.weights_gib_per_gpu * plan.gpus_per_node * 1.073741824)
    # The weight read is the load phase's bulk: with the PVC it takes weights / 2 GB/s at the nominal speed.
    assert pvc[0] > weights / (2.0 * 1.2)


def test_the_simulator_draws_its_cold_starts_from_the_model() -> None:
    setup = prepare("long-context-burst", seed=3, minutes=5, cold_start_model="cache")
    assert setup.cold_start_model is not None
    low, high = setup.cold_start_model.bounds()
    assert all(low <= c <= high for c in setup.streams.cold_starts)
    assert all(low <= c <= high for c in setup.streams.measured)
    assert setup.worst_cold_start() == high
    described = parameters(setup)["coldStartSeconds"]
    assert described["source"] == "cache" and described["image"] == "pre-pulled"
    # The same seed under a PVC: every replica slower.
    pvc = prepare("long-context-burst", seed=3, minutes=5, cold_start_model="pvc")
    assert min(pvc.streams.cold_starts) > max(setup.streams.cold_starts)


def test_the_cli_takes_a_model_and_refuses_it_with_a_fixed_cold_start() -> None:
    m3fleet = [str(Path(sys.executable).parent / "m3fleet")]  # the console script
    ok = subprocess.run(
        [*m3fleet, "simulate", "--scenario", "steady-chat", "--minutes", "3", "--cold-start-model", "cache"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "weights from node-local NVMe copy (model cache), image pre-pulled" in ok.stdout
    both = subprocess.run(
        [*m3fleet, "simulate", "--scenario", "steady-chat", "--cold-start", "90", "--cold-start-model", "pvc"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert both.returncode == 2 and "not allowed with argument" in both.stderr

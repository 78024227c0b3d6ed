"""spec.autoscaling.slo: the policy sizes prefill for it, the simulator and the benchmark score against it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from m3fleet.api.models import AutoscalingSpec, SloSpec
from m3fleet.autoscaling.policy import PolicyConfig, PolicyState, decide
from m3fleet_simulator.fleet import PerfModel, Simulation
from m3fleet_simulator.scenarios import Request
from tests.bench.autoscaling.__main__ import main as bench_main
from tests.bench.autoscaling.baselines import Schedule
from tests.support.autoscaling.plans import sample_plan
from tests.support.autoscaling.snapshots import ROUND, fleet, replica, snapshot

TIGHT = SloSpec.model_validate({"ttft": {"seconds": 1, "perPromptTokenSeconds": 1e-6, "unloadedPrefillFactor": 0}})


def test_the_default_slo_is_the_rule_used_before_it_was_a_field() -> None:
    slo = SloSpec()
    assert slo.ttft_seconds(prompt_tokens=1_000_000, unloaded_prefill_seconds=10.0) == 2.0 + 1.5 * 10.0
    assert slo.itl_seconds(unloaded_itl_seconds=0.03) == 1.5 * 0.03
    assert slo.percentile == 95.0


def test_the_policy_plans_prefill_for_the_spec_ttft_bound() -> None:
    config = PolicyConfig.from_spec(AutoscalingSpec(slo=TIGHT), sample_plan(), prefill_tokens_per_second=100_000)
    # 1M tokens at 100k/s = 10 s unloaded; the spec allows 1 s + 1M x 1 us = 2 s, so the factor plays no part.
    assert config.ttft_objective_seconds(1_000_000, 10.0) == pytest.approx(2.0)
    # 10 s of prefill cannot meet 2 s however idle the replica: the utilisation floor applies.
    assert config.prefill_utilisation(1_000_000) == 0.05
    medium = config.prefill_utilisation(50_000)  # 0.5 s prefill against 1.05 s: u <= 1 - 0.5 / 1.05
    assert medium == pytest.approx(config.prefill_safety * (1 - 0.5 / 1.05))
    default = PolicyConfig.from_spec(AutoscalingSpec(), sample_plan(), prefill_tokens_per_second=100_000)
    assert default.prefill_utilisation(50_000) == default.prefill_target_cap  # against 2 + 1.5 x 0.5 s


def test_a_tighter_slo_asks_for_more_replicas_for_the_same_load() -> None:
    load = snapshot(replica(running=4, kv_usage=0.1, prompt_tokens=50_000, request_rate=2.0))
    default = replace(ROUND, prefill_target=None)
    tight = replace(default, slo=TIGHT)
    default_need = decide(default, PolicyState(), load, fleet(1))[0].terms["prefillReplicas"]
    tight_need = decide(tight, PolicyState(), load, fleet(1))[0].terms["prefillReplicas"]
    assert tight_need > default_need


def _alone(slo: SloSpec | None) -> Simulation:
    plan = sample_plan(131072)
    sim = Simulation(
        plan,
        PerfModel.from_plan(plan),
        [Request(0, 10.0, 100_000, 500)],
        Schedule([1] * 100, 15.0, 0.0, "fixed"),
        duration=600.0,
        initial_replicas=1,
        cold_starts=(300.0,),
        measured_cold_starts=(300.0,),
        slo=slo,
    )
    sim.run()
    return sim


def test_the_simulator_scores_each_request_against_the_given_slo() -> None:
    assert _alone(None).met == 1  # alone, a request meets the default bound (1.5x its unloaded times)
    unloaded = PerfModel.from_plan(sample_plan(131072)).unloaded_prefill_seconds(100_000)
    below = SloSpec.model_validate({"ttft": {"seconds": unloaded * 0.9, "unloadedPrefillFactor": 0}})
    assert _alone(below).met == 0  # an absolute TTFT under its own prefill time cannot be met
    itl = SloSpec.model_validate({"itl": {"seconds": 0.001, "unloadedFactor": 0}})
    assert _alone(itl).met == 0


def test_the_benchmark_reports_and_scores_the_slo_it_was_given(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--scenario", "long-context-burst", "--minutes", "20", "--no-sweep", "-o", "json"]
    assert bench_main(argv) == 0
    (default,) = json.loads(capsys.readouterr().out)
    assert bench_main([*argv, "--slo-ttft", "0.5"]) == 0
    (tight,) = json.loads(capsys.readouterr().out)
    assert default["slo"] == SloSpec().model_dump(by_alias=True, mode="json")
    assert tight["slo"]["ttft"] == {"seconds": 0.5, "perPromptTokenSeconds": 0.0, "unloadedPrefillFactor": 1.5}
    # The baselines do not read the SLO: the same fleet, scored against a bound 1.5 s tighter, meets fewer.
    baselines = ("request-count", "kv-utilization", "queue-length")
    for name in baselines:
        assert tight["policies"][name]["gpuHours"] == default["policies"][name]["gpuHours"]
        assert tight["policies"][name]["metSlo"] <= default["policies"][name]["metSlo"]
    assert any(tight["policies"][n]["metSlo"] < default["policies"][n]["metSlo"] for n in baselines)

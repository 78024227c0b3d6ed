"""Speculative decoding in the autoscaler: the acceptance length from the engines' own counters (vLLM's accepted and
draft counters, SGLang's gauge), the plan's cited prior before, the decode term dividing by it, and the simulator's
decode model taking it and reporting it as vLLM's counters would."""

from __future__ import annotations

from dataclasses import replace

import pytest

from m3fleet.api import parse_resource
from m3fleet.autoscaling.policy import PolicyConfig, PolicyState, decide
from m3fleet.autoscaling.policy.capacity import acceptance_length, checked_capacity
from m3fleet.autoscaling.policy.terms import decode_term
from m3fleet.autoscaling.prometheus import acceptance_length as measured_acceptance
from m3fleet.autoscaling.promql import build_queries
from m3fleet.autoscaling.signals import ReplicaSignals
from m3fleet.catalog.engine_metrics import ENGINE_METRICS
from m3fleet.planner import plan
from m3fleet_simulator.fleet import PerfModel
from m3fleet_simulator.scenarios import Request
from m3fleet_simulator.whatif import prepare, run_context_aware
from tests.support.autoscaling.plans import config, sample_plan
from tests.support.autoscaling.simulation import outside_fleet
from tests.support.autoscaling.snapshots import ROUND, fleet, replica, snapshot
from tests.support.samples import SAMPLES_DIR, load_sample

EAGLE3_SAMPLE = SAMPLES_DIR / "vllm-gb200-nvfp4-eagle3-tp4.yaml"


def eagle3_config() -> PolicyConfig:
    resource = parse_resource(load_sample(EAGLE3_SAMPLE))
    return PolicyConfig.from_spec(resource.spec.autoscaling, plan(resource.spec))


def test_vllm_acceptance_is_one_plus_accepted_tokens_per_draft() -> None:
    # 3 drafts of 3 tokens, 5 accepted: 1 + 5/3 tokens per target pass (vLLM's own "mean acceptance length").
    assert measured_acceptance(accepted_rate=5.0, draft_rate=3.0, gauge=None) == pytest.approx(1 + 5 / 3)
    assert measured_acceptance(accepted_rate=0.0, draft_rate=0.0, gauge=None) is None  # no drafts in the window
    assert measured_acceptance(accepted_rate=None, draft_rate=None, gauge=2.4) == 2.4  # SGLang's gauge
    assert measured_acceptance(accepted_rate=None, draft_rate=None, gauge=0.0) is None


@pytest.mark.parametrize(
    ("engine", "signals"),
    [("vllm", {"specAcceptedRate", "specDraftRate"}), ("sglang", {"specAcceptanceLength"}), ("trtllm", set())],
)
def test_the_adapter_queries_each_engines_own_counters(engine: str, signals: set[str]) -> None:
    metrics = ENGINE_METRICS[engine]
    queries = build_queries(metrics, {"namespace": "llm"}, "pod", 60, 300)
    assert {name for name in queries.scalars if name.startswith("spec")} == signals
    names = (*metrics.spec_accepted_tokens, *metrics.spec_drafts, *metrics.spec_acceptance_length)
    assert all(any(n in q for q in queries.scalars.values()) for n in names)


def test_the_prior_stands_until_the_engines_measure_it() -> None:
    cfg = eagle3_config()
    assert cfg.acceptance_length_prior == 2.7  # catalog.speculative: the EAGLE3 model card's MT-Bench 2.698
    quiet = [ReplicaSignals(replica="a")]
    assert acceptance_length(cfg, quiet) == {"tokensPerStep": 2.7, "source": "prior"}
    measured = [ReplicaSignals(replica="a", acceptance_length=2.0), ReplicaSignals(replica="b", acceptance_length=3.0)]
    assert acceptance_length(cfg, measured) == {"tokensPerStep": 2.5, "source": "engines", "prior": 2.7}
    assert checked_capacity(cfg, measured).status["acceptanceLength"]["source"] == "engines"


def test_without_a_draft_nothing_changes() -> None:
    cfg = config()
    assert cfg.acceptance_length_prior is None
    assert acceptance_length(cfg, [ReplicaSignals(replica="a", acceptance_length=2.0)]) is None
    assert "acceptanceLength" not in checked_capacity(cfg, []).status


def test_the_simulators_decode_emits_the_acceptance_length_per_step() -> None:
    drafted = plan(parse_resource(load_sample(EAGLE3_SAMPLE)).spec)
    plain_doc = load_sample(EAGLE3_SAMPLE)
    del plain_doc["spec"]["speculativeDecoding"]
    plain = PerfModel.from_plan(plan(parse_resource(plain_doc).spec))
    model = PerfModel.from_plan(drafted)
    # One target pass costs what it did and emits 2.7 tokens a sequence: 1/2.7 of the time per token.
    assert (model.decode_step, model.tokens_per_step) == (plain.decode_step, 2.7)
    assert model.unloaded_itl(100_000) == pytest.approx(plain.unloaded_itl(100_000) / 2.7)
    assert PerfModel.from_plan(sample_plan()).decode_step == 0.025  # no draft: the model as before


def test_the_decode_term_divides_by_the_acceptance_length() -> None:
    """A step emitting 2.7 tokens a sequence decodes the same output in 1/2.7 of the steps: 2.7x the throughput."""
    plain = decode_term(
        ROUND, request_rate=10.0, prompt_tokens=200, output_tokens=4000, rank_capacity=1e6, tokens_per_step=1.0
    )
    drafted = decode_term(
        ROUND, request_rate=10.0, prompt_tokens=200, output_tokens=4000, rank_capacity=1e6, tokens_per_step=2.7
    )
    assert plain.output_rate == drafted.output_rate == 40_000
    assert drafted.per_replica == pytest.approx(2.7 * plain.per_replica)
    assert drafted.replicas == pytest.approx(plain.replicas / 2.7)
    # A full batch of 256 sequences of 2,200 tokens each: 25 ms + 256 x 0.05 ms + 563,200 x 3e-9 s a step.
    assert plain.step_seconds == pytest.approx(0.025 + 256 * 5e-5 + 256 * 2200 * 3e-9)


def _decode_bound_tick(cfg: PolicyConfig, acceptance: float | None) -> dict[str, float]:
    """One tick on a replica decoding a full batch of long answers to short prompts: 10 requests/s of 200 prompt and
    4,000 output tokens (its KV a third full), so the need is decode's."""
    busy = replica(running=256, kv_usage=0.35, prompt_tokens=200, request_rate=10.0, output_tokens=4000)
    decision, _ = decide(cfg, PolicyState(), snapshot(replace(busy, acceptance_length=acceptance)), fleet(1))
    return {**decision.terms, "desired": float(decision.desired_replicas), "decode": decision.decided_by == "decode"}


def test_the_acceptance_length_changes_the_replicas_a_decode_bound_load_needs() -> None:
    plain = _decode_bound_tick(ROUND, None)
    assert plain["decode"] and plain["tokensPerDecodeStep"] == 1.0
    drafted = _decode_bound_tick(replace(ROUND, acceptance_length_prior=2.7), None)  # the prior, nothing measured
    assert drafted["tokensPerDecodeStep"] == 2.7
    assert drafted["decodeReplicas"] == pytest.approx(plain["decodeReplicas"] / 2.7, rel=1e-3)
    assert drafted["desired"] < plain["desired"]  # 8 replicas without the draft, 3 with it
    measured = _decode_bound_tick(replace(ROUND, acceptance_length_prior=2.7), 2.0)  # the engines' counters win
    assert measured["tokensPerDecodeStep"] == 2.0
    assert measured["decodeReplicas"] == pytest.approx(plain["decodeReplicas"] / 2.0, rel=1e-3)
    # A draft that accepts nothing (MTP's prior, 1) changes nothing.
    assert _decode_bound_tick(replace(ROUND, acceptance_length_prior=1.0), None)["desired"] == plain["desired"]


def test_the_simulated_engine_reports_its_acceptance_length_as_vllms_counters_would() -> None:
    drafted = plan(parse_resource(load_sample(EAGLE3_SAMPLE)).spec)
    requests = [Request(i, 1.0 + i, 500, 300) for i in range(60)]  # a request a second, decoding all minute
    seen = {}
    for name, p in (("drafted", drafted), ("plain", sample_plan())):
        live = outside_fleet(requests, plan=p)
        live.follow({"r-0"})
        live.advance(50.0)
        seen[name] = [r.acceptance_length for r in live.snapshot().replicas]
    assert seen == {"drafted": [2.7], "plain": [None]}


def test_on_a_decode_bound_load_the_acceptance_length_saves_replicas_end_to_end() -> None:
    """The simulator's `long-answers` (short prompts, long answers) with EAGLE3: the policy reading the acceptance
    length the simulated engines report keeps one replica; told there is none, it orders a second for sequences it
    believes hold their batch slots 2.7x as long. Both serve every request."""
    setup = prepare("long-answers", seed=1, minutes=40, speculative="eagle3")
    reading = run_context_aware(setup)
    ignoring = run_context_aware(setup, acceptance_length_prior=None)
    assert reading.slo_attainment == ignoring.slo_attainment == 1.0
    assert (reading.peak_replicas, ignoring.peak_replicas) == (1, 2)
    assert reading.gpu_hours < 0.7 * ignoring.gpu_hours

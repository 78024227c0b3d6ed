"""Speculative decoding in the autoscaler: the acceptance length from the engines' own counters (vLLM's accepted and
draft counters, SGLang's gauge), the plan's cited prior before, the decode term dividing by it, and the simulator's
decode model taking it and reporting it as vLLM's counters would."""

from __future__ import annotations

from dataclasses import replace

import pytest

from m3fleet.api import parse_resource
from m3fleet.api.spec_autoscaling import ItlObjective, SloSpec
from m3fleet.autoscaling.policy import PolicyConfig, PolicyState, decide
from m3fleet.autoscaling.policy.capacity import acceptance_length, checked_capacity
from m3fleet.autoscaling.policy.terms import DecodeTerm, decode_term
from m3fleet.autoscaling.prometheus import acceptance_length as measured_acceptance
from m3fleet.autoscaling.promql import build_queries
from m3fleet.autoscaling.signals import ReplicaSignals
from m3fleet.catalog.engine_metrics import ENGINE_METRICS
from m3fleet.planner import plan
from m3fleet_simulator.fleet import PerfModel
from m3fleet_simulator.scenarios import Request
from m3fleet_simulator.whatif import prepare, run_context_aware
from tests.bench.autoscaling.__main__ import with_slo
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
    # One target pass reads the weights once, computes 1 + 3 drafted tokens a sequence and emits 2.7 of them.
    assert (model.decode_step, model.tokens_per_step, model.verified_per_step) == (plain.decode_step, 2.7, 4.0)
    # Its KV is read once a step; the per-sequence share is paid for each of the 4 tokens computed.
    step = plain.decode_step + 4 * plain.decode_per_sequence + plain.decode_per_context_token * 100_000
    assert model.unloaded_itl(100_000) == pytest.approx(step / 2.7)
    assert plain.unloaded_itl(100_000) / 2.7 < model.unloaded_itl(100_000) < plain.unloaded_itl(100_000)
    assert PerfModel.from_plan(sample_plan()).decode_step == 0.025  # no draft: the model as before


def _decode(cfg: PolicyConfig, tokens_per_step: float) -> DecodeTerm:
    """10 requests/s of 200 prompt and 4,000 output tokens."""
    return decode_term(cfg, request_rate=10.0, prompt_tokens=200, output_tokens=4000, tokens_per_step=tokens_per_step)


def test_the_decode_term_divides_by_the_acceptance_length() -> None:
    """A step emitting 2.7 tokens a sequence decodes the same output in 1/2.7 of the steps: 2.7x the throughput."""
    plain, drafted = _decode(ROUND, 1.0), _decode(ROUND, 2.7)
    assert plain.output_rate == drafted.output_rate == 40_000
    assert drafted.per_replica == pytest.approx(2.7 * plain.per_replica)
    assert drafted.replicas == pytest.approx(plain.replicas / 2.7)


def test_the_batch_is_the_largest_whose_step_meets_the_itl_objective() -> None:
    """Default SLO: ITL <= 1.5x an idle step at the sequences' mean context (200 + 4,000 / 2 tokens)."""
    idle = 0.025 + 5e-5 + 3e-9 * 2200
    plain = _decode(ROUND, 1.0)
    assert plain.step_seconds == pytest.approx(1.5 * idle)
    assert 1 < plain.batch < 256
    loose = _decode(replace(ROUND, slo=SloSpec(itl=ItlObjective(seconds=1.0, unloaded_factor=0.0))), 1.0)
    assert loose.batch == 256  # an ITL bound no batch reaches: the engine's own cap


def test_verifying_the_drafts_bounds_the_gain() -> None:
    """With 3 drafted tokens the target computes 4 a sequence each step: the step's per-sequence share is 4x, so at a
    40 ms ITL bound the draft buys less than its acceptance length in throughput, and more than nothing."""
    absolute = replace(ROUND, slo=SloSpec(itl=ItlObjective(seconds=0.04, unloaded_factor=0.0)))
    plain = _decode(absolute, 1.0)
    drafted = _decode(replace(absolute, verified_per_step=4.0), 2.7)
    assert plain.per_replica < drafted.per_replica < 2.7 * plain.per_replica
    assert drafted.step_seconds / 2.7 <= 0.04 + 1e-12  # each token still within the bound


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


def test_on_a_decode_bound_load_the_decode_term_sizes_an_eagle3_fleet_end_to_end() -> None:
    """The simulator's `long-answers` (short prompts, long answers) with EAGLE3, 40 minutes: the policy reading the
    acceptance length and the verification cost, against the same policy unaware of the draft (acceptance 1, nothing
    verified: the policy before the decode term knew of drafts). At the default SLO, whose ITL bound is relative to
    the draft-shortened idle step, the verification cost shrinks the batch that meets it: the aware policy orders
    more replicas and meets the SLO far more often. At an absolute 40 ms bound both meet it; the aware one for less."""
    setup = prepare("long-answers", seed=1, minutes=40, speculative="eagle3")
    unaware = {"acceptance_length_prior": None, "verified_per_step": 1.0}
    aware, blind = run_context_aware(setup), run_context_aware(setup, **unaware)
    assert aware.slo_attainment > blind.slo_attainment + 0.2
    assert aware.peak_replicas > blind.peak_replicas
    absolute = with_slo(setup, None, 0.04)
    aware, blind = run_context_aware(absolute), run_context_aware(absolute, **unaware)
    assert aware.slo_attainment == blind.slo_attainment == 1.0
    assert aware.gpu_hours < blind.gpu_hours

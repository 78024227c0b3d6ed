"""Speculative decoding in the autoscaler: the acceptance length from the engines' own counters (vLLM's accepted and
draft counters, SGLang's gauge), the plan's cited prior before, and the simulator's decode model taking it."""

from __future__ import annotations

import pytest

from m3fleet.api import parse_resource
from m3fleet.autoscaling.policy import PolicyConfig
from m3fleet.autoscaling.policy.capacity import acceptance_length, checked_capacity
from m3fleet.autoscaling.prometheus import acceptance_length as measured_acceptance
from m3fleet.autoscaling.promql import build_queries
from m3fleet.autoscaling.signals import ReplicaSignals
from m3fleet.catalog.engine_metrics import ENGINE_METRICS
from m3fleet.planner import plan
from m3fleet_simulator.fleet import PerfModel
from tests.support.autoscaling.plans import config, sample_plan
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
    assert model.decode_step == pytest.approx(plain.decode_step / 2.7)
    assert model.unloaded_itl(100_000) == pytest.approx(plain.unloaded_itl(100_000) / 2.7)
    assert PerfModel.from_plan(sample_plan()).decode_step == 0.025  # no draft: the model as before

"""status.autoscaling.slo: the share of requests within the SLO's TTFT bound, from the engines' histograms."""

from __future__ import annotations

import pytest

from m3fleet.api.models import SloSpec
from m3fleet.autoscaling.signals import TTFT_BUCKETS, Histogram, ReplicaSignals
from m3fleet.autoscaling.slo import ITL_NOT_EXPORTED, ITL_RELATIVE, measure
from tests.support.autoscaling.snapshots import prompt_histogram

BOUNDS = (*TTFT_BUCKETS, float("inf"))


def ttft_histogram(observations: dict[float, float]) -> Histogram:
    """TTFT observations (seconds -> how many), cumulated over vLLM's buckets."""
    cumulative = tuple(sum(n for value, n in observations.items() if value <= bound) for bound in BOUNDS)
    total = sum(value * n for value, n in observations.items())
    return Histogram(BOUNDS, cumulative, total, sum(observations.values()))


def replica(name: str, ttfts: dict[float, float], prompt_tokens: float) -> ReplicaSignals:
    count = sum(ttfts.values())
    return ReplicaSignals(
        replica=name, ttft_seconds=ttft_histogram(ttfts), prompt_tokens=prompt_histogram(prompt_tokens, count)
    )


def test_the_share_counts_up_to_the_largest_boundary_under_the_bound_and_says_which() -> None:
    # 4k-token prompts at 40k tokens/s: 0.1 s unloaded, bound 2 + 1.5 x 0.1 = 2.15 s; vLLM's boundaries 1.0 and
    # 2.5 straddle it, so requests of 0.9 s count and those of 2.1 s (within the bound, above 1.0) do not.
    replicas = [replica("r-0", {0.9: 6, 2.1: 2}, 4_000), replica("r-1", {0.9: 1, 30.0: 1}, 4_000)]
    met = measure(SloSpec(), replicas, prefill_tokens_per_second=40_000, window_seconds=300)
    assert met.mean_prompt_tokens == pytest.approx(4_000)
    assert met.ttft.bound_seconds == pytest.approx(2.15)
    assert met.ttft.bucket_seconds == 1.0
    assert met.requests == 10 and met.ttft.attainment == pytest.approx(7 / 10)
    status = met.to_status()
    assert status["ttft"] == {"boundSeconds": 2.15, "bucketSeconds": 1.0, "attainment": 0.7, "met": False}
    assert status["percentile"] == 95.0 and status["windowSeconds"] == 300 and status["itl"] == ITL_RELATIVE


def test_a_bound_on_a_boundary_counts_that_bucket_and_the_objective_is_met_at_the_percentile() -> None:
    slo = SloSpec.model_validate({"percentile": 90, "ttft": {"seconds": 2.5, "unloadedPrefillFactor": 0}})
    met = measure(slo, [replica("r-0", {2.1: 9, 30.0: 1}, 1_000)], 40_000, 300)
    assert (met.ttft.bucket_seconds, met.ttft.attainment) == (2.5, 0.9)
    assert met.to_status()["ttft"]["met"] is True
    assert met.itl == ITL_RELATIVE  # the default ITL bound is relative to an idle decode step: not measured


def test_a_bound_below_every_boundary_reports_none_met_and_no_requests_no_share() -> None:
    tiny = SloSpec.model_validate({"ttft": {"seconds": 0.0005, "unloadedPrefillFactor": 0}})
    met = measure(tiny, [replica("r-0", {0.5: 3}, 1_000)], 40_000, 300)
    assert met.ttft.bucket_seconds is None and met.ttft.attainment == 0.0
    idle = measure(SloSpec(), [ReplicaSignals(replica="r-0")], 40_000, 300)
    assert idle.requests == 0 and idle.ttft.attainment is None and "attainment" not in idle.to_status()["ttft"]


def test_an_absolute_itl_bound_is_counted_from_the_per_request_histogram() -> None:
    absolute = SloSpec.model_validate({"itl": {"seconds": 0.06, "unloadedFactor": 0}})
    # vLLM's per-request time-per-output-token boundaries ..., 0.05, 0.075, ...: 0.06 s is counted at 0.05 s.
    itl_bounds = (0.01, 0.025, 0.05, 0.075, 0.1, float("inf"))
    itl = Histogram(itl_bounds, (0, 2, 7, 9, 10, 10), total=0.5, count=10)
    met = measure(absolute, [ReplicaSignals(replica="r-0", itl_seconds=itl)], 40_000, 300)
    assert not isinstance(met.itl, str)
    assert (met.itl.bucket_seconds, met.itl.requests, met.itl.attainment) == (0.05, 10, 0.7)
    assert met.to_status()["itl"] == {"boundSeconds": 0.06, "bucketSeconds": 0.05, "attainment": 0.7, "met": False}
    without = measure(absolute, [ReplicaSignals(replica="r-0")], 40_000, 300)
    assert without.itl == ITL_NOT_EXPORTED  # TensorRT-LLM: no per-request histogram

"""Signal types: histogram quantiles (the policy's "what finished recently")."""

from __future__ import annotations

import math

from m3fleet.autoscaling.signals import Histogram
from tests.support.autoscaling.snapshots import prompt_histogram


def test_histogram_quantile_is_the_upper_bound_of_its_bucket() -> None:
    assert prompt_histogram(3_000, 10).quantile(0.9) == 5_000  # vLLM's 1-2-5 buckets: (2000, 5000]
    mixed = Histogram(bounds=(10.0, 100.0, math.inf), cumulative=(5.0, 9.0, 10.0), total=500.0, count=10.0)
    assert (mixed.quantile(0.5), mixed.quantile(0.9), mixed.quantile(1.0)) == (10.0, 100.0, 100.0)  # +inf: last bound
    assert Histogram(bounds=(10.0, math.inf), cumulative=(0.0, 0.0)).quantile(0.9) is None

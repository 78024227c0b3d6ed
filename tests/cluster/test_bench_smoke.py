"""The real-tier benchmark's code path in CI: a few resources, a short quiet window."""

from __future__ import annotations

from tests.cluster import bench
from tests.cluster.cluster import Cluster


def test_real_tier_benchmark_smoke(chart: Cluster) -> None:
    result = bench.run(chart, 12, per_namespace=6, quiet=15.0)
    print(result.table())
    assert result.forbidden == []
    assert result.quiet_traffic.get("write", 0) == 0, result.quiet_traffic
    # exactly one apply per child; status written as the rollout moves (created, ready), not more
    assert result.applies_per_resource == bench.CHILDREN, result.table()
    assert 1 <= result.status_writes_per_resource <= 3, result.table()

"""The real-tier benchmark's code path in CI: a few resources, a short quiet window."""

from __future__ import annotations

from tests.support.cluster import bench
from tests.support.cluster.cluster import Cluster


def test_real_tier_benchmark_smoke(chart: Cluster) -> None:
    result = bench.run(chart, 12, per_namespace=6, quiet=15.0)
    print(result.table())
    assert result.forbidden == []
    assert result.quiet_traffic.get("write", 0) == 0, result.quiet_traffic
    # no resync and no polling either: at rest the watches are open and quiet, nothing is read by name or listed
    assert result.quiet_traffic.get("get", 0) == result.quiet_traffic.get("list", 0) == 0, result.quiet_traffic
    # exactly one apply per child; status written as the rollout moves (created, ready) and once for the new
    # replica's time-to-ready record, not more (a pod's Ready and its Deployment's readyReplicas can arrive
    # in two reconciles: one more write for some resources, never a write per event)
    assert result.applies_per_resource == bench.CHILDREN, result.table()
    assert 1 <= result.status_writes_per_resource <= 3.5, result.table()

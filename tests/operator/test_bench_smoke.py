"""The benchmark's code path in CI: a few resources, a short quiet period at rest."""

from __future__ import annotations

from tests.bench.bench_operator import run_benchmark


async def test_benchmark_smoke() -> None:
    result = await run_benchmark(20, per_namespace=10, quiet=2.0)
    print(result.table())
    # The one-node vLLM sample: Deployment, Service, NetworkPolicy, PodDisruptionBudget.
    assert result.children_per_resource == 4
    assert result.ratio == 1.0  # one apply per child and one status write per resource, nothing more
    assert result.traffic["create events"] == result.resources  # one "Applied" Event each
    assert result.quiet_requests == 0 and result.quiet_traffic == {}  # no resync, no polling
    assert result.rbac_violations == []

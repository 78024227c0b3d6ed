"""The real control plane's fixtures (cluster, chart): tests/support/cluster/fixtures.py, shared by the cluster and
fault tiers."""

from tests.support.cluster.fixtures import chart, cluster, fleets_removed_after_each_module, pytest_runtest_makereport

__all__ = ["chart", "cluster", "fleets_removed_after_each_module", "pytest_runtest_makereport"]

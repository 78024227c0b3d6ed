"""The cluster tier's share of tests/support/cluster/fixtures.py: each file's fleets removed after it, and the control
plane's logs in a failure's report. The control plane itself (`cluster`, `chart`) is tests/conftest.py's: one per
session for this tier and the fault tier."""

from tests.support.cluster.fixtures import fleets_removed_after_each_module, pytest_runtest_makereport

__all__ = ["fleets_removed_after_each_module", "pytest_runtest_makereport"]

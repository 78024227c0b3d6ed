"""The fault tier's fixtures: the real control plane's (tests/support/cluster/fixtures.py; `cluster` and `chart` are
tests/conftest.py's, the same control plane as the cluster tier's), a fault proxy in front of its apiserver, and the
operator talking to the apiserver through it."""

from collections.abc import Iterator

import pytest

from tests.support.cluster.cluster import Cluster, OperatorProcess
from tests.support.cluster.faultproxy import FaultProxy
from tests.support.cluster.fixtures import fleets_removed_after_each_module, pytest_runtest_makereport

__all__ = ["fleets_removed_after_each_module", "operator", "proxy", "pytest_runtest_makereport"]


@pytest.fixture()
def proxy(cluster: Cluster) -> Iterator[FaultProxy]:
    with FaultProxy(cluster.control_plane, cluster.workdir).running() as running:
        yield running


@pytest.fixture()
def operator(cluster: Cluster, proxy: FaultProxy) -> Iterator[OperatorProcess]:
    """`m3fleet run --all-namespaces --standalone`, through the proxy."""
    with cluster.operator("--all-namespaces", "--standalone", name="operator-faults", server=proxy.server) as running:
        yield running

"""Fixtures for the operator tests; the harness itself is `tests/operator/harness.py`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest

from tests.kube.emulator import ApiServerEmulator
from tests.operator.harness import Cluster, OperatorProcess, assert_rbac, declare_cluster, running_operator


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "apis(lws=True, compute_domains=True): which optional APIs the cluster serves")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here talks to the apiserver emulator, not to plain kmock."""
    for item in items:
        if "tests/operator/" in str(item.path):
            item.add_marker(pytest.mark.kmock(cls=ApiServerEmulator))


@pytest.fixture(autouse=True)
def rbac_conformance(request: pytest.FixtureRequest) -> Iterable[None]:
    """Hold every operator test to RBAC: each request of the whole run is checked, test by test. And print
    the operators' logs at the end (pytest shows them when the test fails)."""
    if "kmock" not in request.fixturenames:
        yield
        return
    emulator = request.getfixturevalue("kmock")
    directory: Path = request.getfixturevalue("tmp_path")
    yield
    for log in sorted(directory.glob("operator-*.log")):
        print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-20000:]}")
    assert_rbac(emulator)


@pytest.fixture
def cluster(kmock: ApiServerEmulator, request: pytest.FixtureRequest) -> Cluster:
    marker = request.node.get_closest_marker("apis")
    declare_cluster(kmock, **(marker.kwargs if marker else {}))
    return Cluster(kmock)


@pytest.fixture
async def operator(cluster: Cluster, tmp_path: Path) -> AsyncIterator[OperatorProcess]:
    """`m3fleet run -n llm --standalone` against the cluster, for the whole test."""
    async with running_operator(cluster.kmock, tmp_path) as process:
        yield process

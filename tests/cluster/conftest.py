"""Fixtures of the real control plane tier (see controlplane.py). One control plane per test session;
the chart is installed once with Helm; each test starts the operator it needs as its own process."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cluster.cluster import Cluster
from tests.cluster.controlplane import ControlPlane, build


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    # Not under pytest's basetemp: another pytest run on the machine may prune that while we run.
    workdir = Path(tempfile.mkdtemp(prefix="m3fleet-cluster-"))
    control_plane = ControlPlane(build(), workdir)
    try:
        control_plane.start()
    except Exception:
        control_plane.dump_logs()
        control_plane.stop()
        raise
    cluster = Cluster(control_plane, workdir)
    try:
        yield cluster
    finally:
        control_plane.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def chart(cluster: Cluster) -> Cluster:
    """The operator chart installed with Helm (cluster scope, the defaults); CRDs come with it."""
    cluster.install_chart()
    return cluster


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.failed and "cluster" in getattr(item, "fixturenames", ()):
        cluster = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None  # type: ignore[attr-defined]
        if isinstance(cluster, Cluster):
            cluster.control_plane.dump_logs(sys.stderr, tail=2000)
    return report

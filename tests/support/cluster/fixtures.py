"""Fixtures of the real control plane tier and of the fault tier (see controlplane.py). One control plane per test
session (per xdist worker that reaches these tiers); the chart is installed once on it with Helm; each test starts
the operator it needs as its own process."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import pytest

from tests.support.cluster.cluster import OPERATOR_NAMESPACE, RELEASE, Cluster, fresh_cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with fresh_cluster("m3fleet-cluster-") as cluster:
        yield cluster


# The namespaces where this tier's tests use a feature that needs Secrets (multi-node TensorRT-LLM's SSH key, a
# Prometheus CA, a model cache's token): the chart grants the operator Secrets only there (docs/security.md).
# Every other namespace, e.g. test_journeys.py's, has the chart's default: no Secrets.
SECRET_NAMESPACES = (
    "cache",
    "contract",
    "disagg",  # test_disaggregation.py: the TensorRT-LLM multi-node workers' SSH key
    "failing",  # test_failure_status.py: a multi-node TensorRT-LLM fleet's SSH key
    "faults",  # test_faults.py: the model cache's token Secret is checked
    "groups",
    "lifecycle",
    "ownership",
    "prom-safety",
    "psa-trtllm-gb200-baseline",
    "psa-trtllm-gb200-restricted",
)


@pytest.fixture(scope="session")
def chart(cluster: Cluster) -> Cluster:
    """The operator chart installed with Helm (cluster scope, the defaults but rbac.secretNamespaces); CRDs come
    with it. tests/cluster/test_least_privilege.py installs it with every default, on a control plane of its own."""
    for namespace in SECRET_NAMESPACES:  # a Role needs its namespace
        cluster.namespace(namespace)
    granted = f"rbac.secretNamespaces={{{','.join(SECRET_NAMESPACES)}}}"
    cluster.install_chart(RELEASE, OPERATOR_NAMESPACE, "--set", granted)
    return cluster


ENGINE_PODS = "app.kubernetes.io/component=engine,app.kubernetes.io/managed-by=m3fleet"  # render/labels.py's


@pytest.fixture(scope="module", autouse=True)
def fleets_removed_after_each_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """The GPU nodes are few (kwok's 7 H200, 4 GB200, 2 B200, 4 MI355X, one H100, GB300 and MI300X): what one test
    file leaves running would leave the next without a node. After each file every MiniMaxM3Deployment goes (its
    children by garbage collection), and the next file starts once their engine pods are gone. Only those: a model
    cache's staging pods (also managed by m3fleet) hold no GPU and stay Completed until their cache goes, so waiting
    for them ran out the whole deadline after every file that leaves a cache (2 min each)."""
    yield
    if "cluster" not in request.fixturenames and "chart" not in request.fixturenames:
        return
    cluster: Cluster = request.getfixturevalue("cluster")
    listed = cluster.kubectl("get", "minimaxm3deployments", "-A", "-o", "name", check=False)
    if listed.returncode != 0 or not listed.stdout.strip():
        return  # no CRD (this file never installed one) or nothing left
    cluster.kubectl("delete", "minimaxm3deployments", "--all", "--all-namespaces", "--wait=false", check=False)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and cluster.list("pods", None, ENGINE_PODS):
        time.sleep(1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.failed and "cluster" in getattr(item, "fixturenames", ()):
        cluster = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None  # type: ignore[attr-defined]
        if isinstance(cluster, Cluster):
            # In the failure's report, not raw on stderr, where two workers' output and the progress dots interleave.
            logs = io.StringIO()
            cluster.control_plane.dump_logs(logs, tail=2000)
            report.sections.append(("control plane logs (tails)", logs.getvalue()))
    return report

"""A fleet that needs an API the cluster does not serve yet (the ComputeDomain of NVIDIA's DRA driver, for a GB200
group) says so: Degraded/ComputeDomainNotInstalled. Installing the API sends the operator no event about the fleet:
it must look again by itself (once the discovery it caches, 30 s, is asked again), not wait for an edit or a
restart."""

from __future__ import annotations

import pytest
from tests.support.cluster import dra
from tests.support.cluster.cluster import Cluster, eventually
from tests.support.cluster.fleet import condition, delete, operated_namespace, renamed, sample

NAMESPACE = "missing-api"
COMPUTE_DOMAINS = "computedomains.resource.nvidia.com"


def degraded_reason(cluster: Cluster, name: str) -> str | None:
    reason: str | None = condition(cluster.get("m3d", name, NAMESPACE), "Degraded").get("reason")
    return reason


@pytest.mark.usefixtures("chart")
def test_a_fleet_blocked_on_a_missing_api_is_applied_once_the_api_is_installed(cluster: Cluster) -> None:
    # Another file of this session may have installed the driver's API: this one starts without it.
    cluster.kubectl("delete", "crd", COMPUTE_DOMAINS, "--ignore-not-found", "--wait=true")
    name = "waits-for-api"
    try:
        with operated_namespace(cluster, NAMESPACE, "operator-missing-api") as operator:
            cluster.apply(renamed(sample("sglang-gb200-mxfp8-2x4-tp8-ep8"), name, NAMESPACE))
            eventually(
                "Degraded/ComputeDomainNotInstalled",
                lambda: degraded_reason(cluster, name) == "ComputeDomainNotInstalled",
                60,
            )
            assert cluster.get("leaderworkerset", name, NAMESPACE) is None  # nothing half-applied
            dra.install(cluster)
            domain = f"{name}-compute-domain"
            eventually("the ComputeDomain applied", lambda: cluster.get("computedomain", domain, NAMESPACE), 90)
            eventually("no longer degraded", lambda: degraded_reason(cluster, name) == "AsExpected", 60)
            assert cluster.get("leaderworkerset", name, NAMESPACE) is not None
            assert "Traceback" not in operator.log()
    finally:
        delete(cluster, name, NAMESPACE, wait=False)
        dra.install(cluster)  # the API as the other files of this session expect it

"""RBAC conformance: every request the operator makes is allowed by `m3fleet.permissions.RBAC`.

The autouse fixture in conftest checks each test's requests; this module pins the request -> rule
mapping down and drives one cluster through everything the operator does, in one request log.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from m3fleet.permissions import RBAC
from tests.kube.waiting import eventually
from tests.operator.harness import (
    DEPLOYMENTS,
    LWS,
    NS,
    PEERINGS,
    TRTLLM,
    TWO_NODES,
    VLLM,
    Cluster,
    operator_requests,
    rbac_rule,
    rbac_violations,
    running_operator,
    sample,
)


@pytest.mark.parametrize(
    ("method", "path", "params", "rule"),
    [
        ("GET", "/version", {}, None),
        ("GET", "/api/v1", {}, None),
        ("GET", "/apis/leaderworkerset.x-k8s.io/v1", {}, None),
        ("GET", "/api/v1/namespaces", {"watch": "true"}, ("", "namespaces", "watch")),
        ("GET", "/api/v1/namespaces/llm", {}, ("", "namespaces", "get")),
        ("GET", "/api/v1/namespaces/llm/secrets", {"labelSelector": "a=b"}, ("", "secrets", "list")),
        ("GET", "/api/v1/namespaces/llm/secrets/x", {}, ("", "secrets", "get")),
        ("POST", "/api/v1/namespaces/llm/events", {}, ("", "events", "create")),
        ("PATCH", "/apis/apps/v1/namespaces/llm/deployments/x", {"force": "true"}, ("apps", "deployments", "patch")),
        ("DELETE", "/apis/apps/v1/namespaces/llm/deployments/x", {}, ("apps", "deployments", "delete")),
        ("DELETE", "/apis/apps/v1/namespaces/llm/deployments", {}, ("apps", "deployments", "deletecollection")),
        ("PUT", "/apis/apps/v1/namespaces/llm/deployments/x", {}, ("apps", "deployments", "update")),
        (
            "PATCH",
            "/apis/m3fleet.dev/v1alpha1/namespaces/llm/minimaxm3deployments/x/status",
            {},
            ("m3fleet.dev", "minimaxm3deployments/status", "patch"),
        ),
        ("GET", "/apis/kopf.dev/v1/clusterkopfpeerings", {"watch": "1"}, ("kopf.dev", "clusterkopfpeerings", "watch")),
        ("GET", "/apis/apps/v1/deployments", {"watch": "true"}, ("apps", "deployments", "watch")),
    ],
)
def test_request_to_rule(method: str, path: str, params: dict[str, str], rule: tuple[str, str, str] | None) -> None:
    assert rbac_rule(method, path, params) == rule


async def test_everything_the_operator_does_stays_within_rbac(cluster: Cluster, tmp_path: Path) -> None:
    """As deployed: with peering (a KopfPeering named m3fleet) and kopf's resource scanning."""
    cluster.kmock.seed(PEERINGS, {"metadata": {"name": "m3fleet", "namespace": NS}})
    async with running_operator(cluster.kmock, tmp_path, standalone=False):
        trtllm = await cluster.create(sample(TRTLLM))
        vllm = await cluster.create(sample(VLLM))
        await eventually(lambda: cluster.converged(trtllm) and cluster.converged(vllm))
        await cluster.report_workload(DEPLOYMENTS, vllm)
        await cluster.patch_spec(vllm, {"replicas": 2})
        await cluster.patch_spec(vllm, TWO_NODES)  # LWS applied, Deployment pruned
        await eventually(lambda: cluster.get(LWS, vllm) is not None and cluster.get(DEPLOYMENTS, vllm) is None)
        await cluster.patch_spec(trtllm, {"parallelism": {"tensorParallelSize": 3}})  # invalid: Degraded
        await eventually(lambda: cluster.condition(trtllm, "Degraded")["status"] == "True")
        cluster.kmock.expire_watches()
        await cluster.delete(vllm)
        await cluster.settled()
    async with running_operator(cluster.kmock, tmp_path, standalone=False):  # a restart: dry runs
        await cluster.settled()

    requests = operator_requests(cluster.kmock)
    assert rbac_violations(requests) == []
    used = {rule for r in requests if (rule := rbac_rule(str(r.method.value), r.url.path, dict(r.params)))}
    # The check is only worth something if the writes, reads and watches really happened.
    assert {
        ("", "secrets", "create"),
        ("", "secrets", "get"),
        ("", "events", "create"),
        ("", "configmaps", "watch"),
        ("", "services", "watch"),
        ("apps", "deployments", "delete"),
        ("apps", "deployments", "watch"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets", "patch"),
        ("resource.nvidia.com", "computedomains", "patch"),
        ("resource.nvidia.com", "computedomains", "watch"),
        ("m3fleet.dev", "minimaxm3deployments", "list"),
        ("m3fleet.dev", "minimaxm3deployments", "watch"),
        ("m3fleet.dev", "minimaxm3deployments/status", "patch"),
        ("kopf.dev", "kopfpeerings", "patch"),
        ("kopf.dev", "kopfpeerings", "watch"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    } <= used
    granted = {(grant.group, grant.resource, verb) for grant in RBAC for verb in grant.verbs}
    print("granted but not used here:", sorted(granted - used))

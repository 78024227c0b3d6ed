"""RBAC conformance: every request the operator makes is allowed by `m3fleet.controller.kube.RBAC`.

The autouse fixture in conftest checks each test's requests; this module pins the request -> rule
mapping down and drives one cluster through everything the operator does, in one request log.
"""

from __future__ import annotations

import kopf
import pytest

from m3fleet.controller.kube import RBAC
from tests.kube.conftest_helpers import eventually
from tests.operator.harness import (
    DEPLOYMENTS,
    LWS,
    NS,
    ONE_MILLION,
    TRTLLM,
    VLLM,
    Cluster,
    operator_requests,
    rbac_rule,
    rbac_violations,
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
    ],
)
def test_request_to_rule(method: str, path: str, params: dict[str, str], rule: tuple[str, str, str] | None) -> None:
    assert rbac_rule(method, path, params) == rule


def as_deployed(settings: kopf.OperatorSettings) -> None:
    """As `m3fleet run` runs: with peering (a KopfPeering named m3fleet) and kopf's resource scanning."""
    settings.scanning.disabled = False
    settings.peering.standalone = False
    settings.peering.name = "m3fleet"


async def test_everything_the_operator_does_stays_within_rbac(cluster: Cluster) -> None:
    cluster.kmock.seed("kopf.dev/v1/kopfpeerings", {"metadata": {"name": "m3fleet", "namespace": NS}})
    async with cluster.operator(resync=0.2, settings_hook=as_deployed):
        trtllm = await cluster.create(sample(TRTLLM))
        vllm = await cluster.create(sample(VLLM))
        await eventually(lambda: cluster.converged(trtllm) and cluster.converged(vllm))
        await cluster.report_workload(DEPLOYMENTS, vllm)
        await cluster.scale(vllm, 2)
        await cluster.patch_spec(vllm, {"context": {"maxModelLen": ONE_MILLION}})  # LWS applied, Deployment pruned
        await eventually(lambda: cluster.get(LWS, vllm) is not None and cluster.get(DEPLOYMENTS, vllm) is None)
        await cluster.patch_spec(trtllm, {"parallelism": {"tensorParallelSize": 3}})  # invalid: Degraded
        await eventually(lambda: cluster.condition(trtllm, "Degraded")["status"] == "True")
        cluster.kmock.expire_watches()
        await cluster.delete(vllm)
        await cluster.settled()
    async with cluster.operator(settings_hook=as_deployed):  # a restart: on.resume
        await cluster.settled()

    requests = operator_requests(cluster.kmock)
    assert rbac_violations(requests) == []
    used = {rule for r in requests if (rule := rbac_rule(str(r.method.value), r.url.path, dict(r.params)))}
    # The check is only worth something if the writes, reads and watches really happened.
    assert {
        ("", "secrets", "create"),
        ("", "events", "create"),
        ("apps", "deployments", "delete"),
        ("apps", "deployments", "watch"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets", "patch"),
        ("resource.nvidia.com", "computedomains", "patch"),
        ("m3fleet.dev", "minimaxm3deployments", "watch"),
        ("m3fleet.dev", "minimaxm3deployments", "patch"),
        ("m3fleet.dev", "minimaxm3deployments/status", "patch"),
        ("m3fleet.dev", "minimaxm3deployments", "get"),
        ("kopf.dev", "kopfpeerings", "patch"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    } <= used
    granted = {(group, resource, verb) for group, resource, verbs in RBAC for verb in verbs}
    print("granted but not used here:", sorted(granted - used))

"""Engine endpoints and pod security in the rendered objects: API keys, the NetworkPolicy, Pod Security levels."""

from __future__ import annotations

import json
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan
from m3fleet.render import POD_SECURITY_ANNOTATION, render
from m3fleet.render.pod import NON_ROOT_UID


def doc(name: str = "vllm", accelerator: str = "h200", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"source": {"pvc": {"claimName": "w"}}},
        "engine": {"name": name},
        "accelerator": accelerator,
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    meta = {"name": "m3", "namespace": "llm"}
    return {"apiVersion": "m3fleet.dev/v1alpha1", "kind": "MiniMaxM3Deployment", "metadata": meta, "spec": base}


def objects(resource: dict[str, Any]) -> list[dict[str, Any]]:
    parsed = parse_resource(resource)
    return render(parsed, plan(parsed.spec))


def templates(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    workload = next(o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    if workload["kind"] == "Deployment":
        return [workload["spec"]["template"]]
    lwt = workload["spec"]["leaderWorkerTemplate"]
    return [lwt["leaderTemplate"], lwt["workerTemplate"]]


KEY = {"apiKeySecretRef": {"name": "llm-api", "key": "key"}}


@pytest.mark.parametrize(
    ("engine", "accelerator", "variable", "holder"),
    [
        ("vllm", "h200", "VLLM_API_KEY", "engine"),
        ("sglang", "h200", "M3FLEET_API_KEY", "key-guard"),
        ("sglang", "gb200", "M3FLEET_API_KEY", "key-guard"),
    ],
)
def test_the_api_key_comes_from_its_secret_and_nowhere_else(
    engine: str, accelerator: str, variable: str, holder: str
) -> None:
    """The key reaches one container, as env from its Secret: vLLM's engine (it reads VLLM_API_KEY), SGLang's key
    guard (SGLang itself gets none: it would print it). Never in argv, and no container sees another's processes."""
    objs = objects(doc(engine, accelerator, engine=KEY, context={"maxModelLen": 262144}))
    ref = {"secretKeyRef": {"name": "llm-api", "key": "key"}}
    for template in templates(objs):
        assert "shareProcessNamespace" not in template["spec"]
        containers = {c["name"]: c for c in template["spec"]["containers"]}
        assert {"name": variable, "valueFrom": ref} in containers[holder]["env"]
        for name, container in containers.items():
            argv = [*container["command"], *container.get("args", [])]
            assert not any(arg.startswith(("--api-key", "--admin-api-key")) for arg in argv)
            if name != holder:
                assert "llm-api" not in json.dumps(container["env"])
    assert "llm-api" not in json.dumps([o for o in objs if o["kind"] == "ConfigMap"])


def test_trtllm_refuses_an_api_key_naming_the_field() -> None:
    with pytest.raises(SpecErrors) as info:
        parse_resource(doc("trtllm", "gb200", engine=KEY))
    (error,) = info.value.errors
    assert error.field == "spec.engine.apiKeySecretRef" and "no API key option" in str(error)


def test_admin_key_is_sglang_only() -> None:
    with pytest.raises((SpecError, SpecErrors)) as info:
        parse_resource(doc("vllm", engine={"adminApiKeySecretRef": {"name": "a"}}))
    assert "adminApiKeySecretRef" in str(info.value) and "sglang only" in str(info.value)


def network_policy(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == "NetworkPolicy")


def test_default_network_policy_admits_the_namespace_prometheus_and_the_group() -> None:
    policy = network_policy(objects(doc("trtllm", "gb200")))
    assert policy["metadata"]["name"] == "m3-ingress"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"m3fleet.dev/name": "m3"}} and spec["policyTypes"] == ["Ingress"]
    group, api, metrics = spec["ingress"]
    assert group == {"from": [{"podSelector": {"matchLabels": {"m3fleet.dev/name": "m3"}}}]}  # every port
    assert api == {"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 8000}]}
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert metrics == {"from": [monitoring], "ports": [{"protocol": "TCP", "port": 8000}]}


def test_network_policy_widens_narrows_or_goes() -> None:
    gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}
    prom = {"namespaceSelector": {"matchLabels": {"team": "obs"}}, "podSelector": {"matchLabels": {"app": "prom"}}}
    spec = network_policy(objects(doc(network={"allowFrom": [gateway], "metricsFrom": [prom]})))["spec"]
    assert spec["ingress"][1]["from"] == [{"podSelector": {}}, gateway]
    assert spec["ingress"][2]["from"] == [prom]
    no_scrape = network_policy(objects(doc(network={"metricsFrom": []})))["spec"]
    assert len(no_scrape["ingress"]) == 2
    assert not [o for o in objects(doc(network={"ingressPolicy": False})) if o["kind"] == "NetworkPolicy"]


# (engine, accelerator, extra spec, level, every pod non-root)
LEVELS = [
    ("vllm", "h200", {}, "restricted", True),
    ("sglang", "gb200", {"context": {"maxModelLen": 262144}}, "restricted", True),
    ("trtllm", "h200", {}, "restricted", True),
    ("trtllm", "gb200", {}, "baseline", False),  # multi-node: sshd
    ("vllm", "mi355x", {}, "privileged", False),
    ("vllm", "h200", {"nodePool": {"extraResources": {"rdma/ib": 1}}}, "privileged", False),
]


@pytest.mark.parametrize(("engine", "accelerator", "extra", "level", "non_root"), LEVELS)
def test_pod_security_level_per_engine_and_accelerator(
    engine: str, accelerator: str, extra: dict[str, Any], level: str, non_root: bool
) -> None:
    objs = objects(doc(engine, accelerator, **extra))
    workload = next(o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    assert workload["metadata"]["annotations"][POD_SECURITY_ANNOTATION] == level
    for template in templates(objs):
        pod = template["spec"]
        container = pod["containers"][0]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert {"name": "HOME", "value": "/home/m3fleet"} in container["env"]
        assert {"name": "home", "mountPath": "/home/m3fleet"} in container["volumeMounts"]
        if non_root:
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["securityContext"]["runAsUser"] == NON_ROOT_UID != 0
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            assert "add" not in container["securityContext"]["capabilities"]
        else:
            assert "securityContext" not in pod and "runAsNonRoot" not in container["securityContext"]

"""Replicas that span nodes, through the real LeaderWorkerSet controller: vLLM and SGLang at 1M context on
H200 (two nodes each) and the TensorRT-LLM GB200 2x4 sample."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.cluster import dra
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import (
    assert_on_pool,
    delete,
    operated_namespace,
    pods,
    renamed,
    sample,
    wait_ready,
)

NAMESPACE = "groups"
ONE_MILLION = 1_048_576
LWS_ENV = {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"}
CLIQUE = "nvidia.com/gpu.clique"


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    dra.install(chart)
    with operated_namespace(chart, NAMESPACE, "operator-groups") as running:
        yield running


def _one_million(stem: str, name: str, **context: int) -> dict[str, Any]:
    document = renamed(sample(stem), name, NAMESPACE)
    document["spec"]["context"] = {**document["spec"].get("context", {}), "maxModelLen": ONE_MILLION, **context}
    document["spec"]["parallelism"] = {**document["spec"].get("parallelism", {}), "tensorParallelSize": 0}
    return document


def _vllm_one_million() -> dict[str, Any]:
    # vLLM's NVIDIA M3 model ignores rope_scaling, so 1M needs the natively-1M MXFP8 checkpoint; it fits
    # one H200 node, so ask for three full-length sequences to need a second one.
    document = _one_million("vllm-h200-tp8", "vllm-1m", minSequencesAtMaxLen=3)
    document["spec"]["model"] = {"variant": "mxfp8", "source": {"pvc": {"claimName": "m3-weights-mxfp8"}}}
    return document


CASES = {
    "vllm-1m": _vllm_one_million,
    "sglang-1m": lambda: _one_million("sglang-h200-bf16-tp8", "sglang-1m"),
    "trtllm-gb200": lambda: renamed(sample("trtllm-gb200-2x4-tep"), "trtllm-gb200", NAMESPACE),
    "sglang-gb200": lambda: renamed(sample("sglang-gb200-mxfp8-2x4-tp8-ep8"), "sglang-gb200", NAMESPACE),
}


def _env_names(pod: dict[str, Any]) -> set[str]:
    return {e["name"] for c in pod["spec"]["containers"] for e in c.get("env") or []}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_group_forms_through_the_real_leaderworkerset_controller(
    chart: Cluster, operator: OperatorProcess, name: str
) -> None:
    document = CASES[name]()
    chart.apply(document)
    try:
        if document["spec"]["accelerator"] == "gb200":
            dra.serve_compute_domain(chart, f"{name}-compute-domain", NAMESPACE)
        body = wait_ready(chart, name, NAMESPACE, timeout=240)
        assert body["status"]["plan"]["nodesPerReplica"] == 2
        lws = chart.get("leaderworkerset", name, NAMESPACE)
        assert lws is not None and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        found = assert_on_pool(chart, name, NAMESPACE, document["spec"]["accelerator"])
        assert len(found) == 2
        roles = sorted(p["metadata"]["labels"]["m3fleet.dev/role"] for p in found)
        assert roles == ["leader", "worker"], roles
        for pod in found:
            assert _env_names(pod) >= LWS_ENV, (pod["metadata"]["name"], _env_names(pod))
        # LWS's own headless Service carries the resource's name and is what LWS_LEADER_ADDRESS resolves
        # through (<name>-0.<name>.<namespace>); ours, for clients, is a different object.
        headless = chart.get("service", name, NAMESPACE)
        assert headless is not None and headless["spec"].get("clusterIP") == "None", headless
        assert headless["metadata"]["ownerReferences"][0]["kind"] == "LeaderWorkerSet"
        leader = next(p for p in found if p["metadata"]["labels"]["m3fleet.dev/role"] == "leader")
        assert leader["spec"].get("subdomain") == name and leader["spec"].get("hostname") == f"{name}-0", leader["spec"]
        address = next(
            e.get("value")
            for c in leader["spec"]["containers"]
            for e in c.get("env") or []
            if e["name"] == "LWS_LEADER_ADDRESS"
        )
        assert address == f"{name}-0.{name}.{NAMESPACE}", address
        slices = eventually(
            "the headless Service's EndpointSlice lists both pods",
            lambda: [
                s
                for s in chart.list("endpointslices", NAMESPACE, f"kubernetes.io/service-name={name}")
                if len(s.get("endpoints") or []) == 2
            ],
            60,
        )
        assert slices
        api = [
            s for s in chart.list("services", NAMESPACE, f"m3fleet.dev/name={name}") if s["metadata"]["name"] != name
        ]
        assert len(api) == 1 and api[0]["spec"]["selector"]["m3fleet.dev/serving"] == "true", api
        if document["spec"]["accelerator"] == "gb200":
            # one NVLink domain per group: both trays in the same clique (there are two to choose from)
            cliques = {chart.get("node", p["spec"]["nodeName"])["metadata"]["labels"][CLIQUE] for p in found}  # type: ignore[index]
            assert len(cliques) == 1, cliques
            claims = chart.list("resourceclaims", NAMESPACE)
            assert sum(1 for c in claims if (c.get("status") or {}).get("allocation")) >= 2, claims
    finally:
        delete(chart, name, NAMESPACE)
        eventually(f"{name} pods gone", lambda: not pods(chart, name, NAMESPACE), 120)

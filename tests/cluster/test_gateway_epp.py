"""The serving path's endpoint picker, proven with the real one on what the operator renders (issue 44 item 4).

The operator (`m3fleet run`, the chart's ServiceAccount) reconciles gatewayed fleets (spec.gateway): InferencePool,
the endpoint picker's Deployment, Service, ServiceAccount, Role and config, and an HTTPRoute. The pinned EPP image
(hack/build-epp-image.sh: GIE v1.3.0's EPP with the m3fleet-context-tier filter) then runs as a kubelet would run
the rendered Deployment's container (its entrypoint, user and read-only root; its args, env and ConfigMap; the
rendered ServiceAccount's token at the standard path, so the apiserver enforces the rendered Role), on loopback
against the real apiserver, with the GIE CRDs installed from the module it pins. Its serving pods
run on kwok nodes with loopback pod IPs, and on each pod's own IP and engine port an engine stand-in exports its
engine's real metric format (vLLM's or SGLang's), which the EPP scrapes, and answers completions with its pod's name.
The test drives the EPP through Envoy's ext-proc protocol as a Gateway does (tests/support/cluster/extproc.py) and
forwards each request to the endpoint it picked.

Shown: it picks only its fleet's endpoints though another gatewayed fleet's pods (SGLang's) run beside them, and each
picker reads its engine's own metric names; a repeated prefix (a session resending its growing history) goes back to
the replica that holds it; a replica whose engine reports a full KV cache and a long queue is avoided; a long prompt
goes to the long-context tier and a short one to the short tier; a fleet at zero replicas holds its requests in the
EPP's flow control, the operator's autoscaler reads the held count from Prometheus and scales from zero, and the
requests are served by the new replica; a deleted fleet leaves no pool, picker or route behind.

One flag is added to the rendered args: --cert-path, a serving certificate the test's CA signed. The EPP's default
self-signed certificate names no host, which a Gateway does not check but gRPC's Python client cannot be told to skip.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.autoscaling.prom import prometheus
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.epp import (
    HELD_METRIC,
    IDLE,
    LOADED,
    Build,
    EndpointPicker,
    EngineStandIns,
    build,
    build_image,
    install_crds,
    rendered_endpoint_picker,
)
from tests.support.cluster.extproc import Gateway, Routed
from tests.support.cluster.fleet import operated_namespace, renamed, sample, wait_ready
from tests.support.cluster.image import Image, unpacked
from tests.support.cluster.nodes import LOOPBACK_NODE_SELECTOR
from tests.support.ports import free_port

NAMESPACE = "gateway-epp"
CHAT, OTHER, COLD = "chat", "other", "cold"
SHORT_CONTEXT, LONG_CONTEXT = 131_072, 524_288  # the sample's tiers: short, and the spec's own
MODEL = "MiniMaxAI/MiniMax-M3"
GATEWAY = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "Gateway",
    "metadata": {"name": "inference-gateway", "namespace": NAMESPACE},
    "spec": {"gatewayClassName": "inference", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
}


def on_loopback_nodes(document: dict[str, Any]) -> dict[str, Any]:
    """On the H200 nodes whose pods have loopback addresses, where the stand-ins listen and the picker dials them."""
    document["spec"].setdefault("nodePool", {})["nodeSelector"] = dict(LOOPBACK_NODE_SELECTOR)
    return document


def gatewayed(name: str, replicas: int, short_replicas: int | None = None) -> dict[str, Any]:
    """The gateway sample (vLLM on H200 behind `inference-gateway`), with a short tier of `short_replicas` or none."""
    document = on_loopback_nodes(renamed(sample("vllm-h200-gateway-tiers"), name, NAMESPACE))
    document["spec"]["replicas"] = replicas
    tiers = [{"name": "short", "maxModelLen": SHORT_CONTEXT, "replicas": short_replicas}]
    document["spec"]["gateway"]["tiers"] = tiers if short_replicas is not None else []
    return document


def sglang_gatewayed(name: str) -> dict[str, Any]:
    """SGLang on H200 (its sample) behind the same Gateway: its picker reads SGLang's own metric names."""
    document = on_loopback_nodes(renamed(sample("sglang-h200-bf16-tp8"), name, NAMESPACE))
    document["spec"]["gateway"] = {"gatewayRef": {"name": GATEWAY["metadata"]["name"]}}
    return document


def scaling_from_zero(prometheus_url: str) -> dict[str, Any]:
    """A fleet at zero replicas whose autoscaler may scale it from zero (minReplicas 0 behind a gateway)."""
    document = gatewayed(COLD, 0)
    document["spec"]["autoscaling"] = {
        "enabled": True,
        "mode": "act",
        "minReplicas": 0,
        "maxReplicas": 1,
        "intervalSeconds": 5,
        "prometheus": {"url": prometheus_url},
    }
    return document


def scrape_config(picker_metrics: int) -> str:
    """Prometheus scraping the cold fleet's picker as the chart's PodMonitor would label it: by namespace."""
    return (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: endpoint-picker\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{picker_metrics}']\n        labels: {{namespace: {NAMESPACE}}}\n"
    )


class Fleet:
    """One gatewayed fleet as served: its engine stand-ins, its picker and a gateway client to it."""

    def __init__(self, name: str, picker: EndpointPicker, gateway: Gateway, engines: EngineStandIns) -> None:
        self.name, self.picker, self.gateway, self.engines = name, picker, gateway, engines

    def pods(self, workload: str) -> list[str]:
        return sorted(p for p in self.engines.pods() if p.rsplit("-", 2)[0] == workload)

    def ask(self, prompt: str, history: list[dict[str, str]] | None = None) -> Routed:
        messages = [*(history or []), {"role": "user", "content": prompt}]
        routed = self.gateway.route({"model": MODEL, "messages": messages, "max_tokens": 16})
        assert routed.status == 200, f"{routed}\n--- EPP log ---\n{self.picker.log()[-4000:]}"
        return routed

    def served_by(self, routed: Routed) -> str:
        """The pod that answered: the stand-in on the endpoint the EPP picked names its pod in the answer."""
        assert routed.endpoint is not None
        pod = self.engines.pod_at(routed.endpoint)
        assert pod is not None, f"the EPP picked {routed.endpoint}, no pod of {self.name} ({self.engines.ips})"
        assert routed.body["choices"][0]["message"]["content"] == pod
        return pod


@contextlib.contextmanager
def served(
    cluster: Cluster,
    epp: Build,
    image: Image,
    name: str,
    pods: int,
    engine: str = "vllm",
    metrics_port: int | None = None,
) -> Iterator[Fleet]:
    """Stand-ins of `engine` on the fleet's serving pods (`pods` of them first), and its picker as rendered, with a
    client."""
    pool = cluster.get("inferencepool.inference.networking.k8s.io", name, NAMESPACE)
    assert pool is not None, f"the operator rendered no InferencePool {name}"
    selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    port = pool["spec"]["targetPorts"][0]["number"]
    with EngineStandIns(cluster, NAMESPACE, selector, port, engine) as engines:
        eventually(f"{pods} stand-ins on {name}'s pods", lambda: len(engines.pods()) == pods, 90)
        with rendered_endpoint_picker(cluster, image, NAMESPACE, name, metrics_port) as picker:
            gateway = Gateway(picker.grpc_address, epp.descriptors, picker.ca)
            try:
                ready = f'inference_pool_ready_pods{{name="{name}"}}'
                eventually(f"{name}'s EPP sees {pods} ready pods", lambda: picker.sample(ready) == pods, 60)
                yield Fleet(name, picker, gateway, engines)
            finally:
                gateway.close()


@pytest.fixture(scope="module")
def epp_build() -> Build:
    return build()


@pytest.fixture(scope="module")
def epp_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    with unpacked(build_image(), tmp_path_factory.mktemp("epp-image")) as image:
        yield image


@pytest.fixture(scope="module")
def operator(chart: Cluster, epp_build: Build) -> Iterator[OperatorProcess]:
    install_crds(chart, epp_build)  # before the operator starts: it renders pools and routes only where they exist
    with operated_namespace(chart, NAMESPACE, "operator-epp") as running:
        chart.apply(GATEWAY)
        yield running


@pytest.fixture(scope="module")
def fleets(
    chart: Cluster, operator: OperatorProcess, epp_build: Build, epp_image: Image
) -> Iterator[tuple[Fleet, Fleet]]:
    chart.apply(gatewayed(CHAT, 1, short_replicas=2))
    chart.apply(sglang_gatewayed(OTHER))
    for name in (CHAT, OTHER):
        wait_ready(chart, name, NAMESPACE)
    with (
        served(chart, epp_build, epp_image, CHAT, 3) as chat,
        served(chart, epp_build, epp_image, OTHER, 1, "sglang") as other,
    ):
        yield chat, other


def test_only_the_fleets_endpoints_are_picked(fleets: tuple[Fleet, Fleet]) -> None:
    chat, other = fleets
    picked = [chat.served_by(chat.ask(f"question {uuid.uuid4()}")) for _ in range(12)]
    assert set(picked) <= set(chat.pods(f"{CHAT}-short")), picked  # short prompts: the short tier, of this fleet
    assert not {other.engines.endpoint(p) for p in other.engines.pods()} & {chat.engines.endpoint(p) for p in picked}
    assert sum(other.engines.served().values()) == 0
    assert other.served_by(other.ask("and you?")) in other.engines.pods()  # the other fleet's picker: its own pod


def test_a_repeated_prefix_returns_to_its_replica(fleets: tuple[Fleet, Fleet]) -> None:
    """Sessions resend their growing history each turn, as agents do: every turn lands where the first did."""
    chat, _ = fleets
    for session in range(4):
        history = [{"role": "system", "content": f"session {session} {uuid.uuid4()} " + "context " * 1500}]
        first = None
        for turn in range(3):
            pod = chat.served_by(chat.ask(f"turn {turn}", history))
            first = first or pod
            assert pod == first, f"session {session} turn {turn} went to {pod}, its prefix is on {first}"
            history += [{"role": "user", "content": f"turn {turn}"}, {"role": "assistant", "content": pod}]


def test_a_loaded_replica_is_avoided(fleets: tuple[Fleet, Fleet]) -> None:
    chat, _ = fleets
    loaded, idle = chat.pods(f"{CHAT}-short")
    chat.engines.set_reading(loaded, LOADED)
    try:
        eventually(
            "the EPP reads the loaded replica's KV utilisation",
            lambda: chat.picker.sample(f'inference_pool_average_kv_cache_utilization{{name="{CHAT}"}}') > 0.3,
            30,
        )
        picked = [chat.served_by(chat.ask(f"fresh {uuid.uuid4()}")) for _ in range(8)]
        assert picked == [idle] * 8, f"{loaded} reports KV {LOADED.kv_usage} and {LOADED.waiting} waiting: {picked}"
    finally:
        chat.engines.set_reading(loaded, IDLE)


def test_each_picker_reads_its_engines_own_metric_names(fleets: tuple[Fleet, Fleet]) -> None:
    """The SGLang fleet's picker is rendered with SGLang's names (sglang:token_usage, sglang:num_queue_reqs): what its
    engine reports is what the picker sees; the vLLM fleet's sees vLLM's (test_a_loaded_replica_is_avoided)."""
    _, other = fleets
    (pod,) = other.engines.pods()
    other.engines.set_reading(pod, LOADED)
    try:
        seen = {
            "average_kv_cache_utilization": LOADED.kv_usage,
            "average_queue_size": LOADED.waiting,
        }
        eventually(
            f"the SGLang fleet's picker reads KV {LOADED.kv_usage} and {LOADED.waiting} queued",
            lambda: all(
                other.picker.sample(f'inference_pool_{metric}{{name="{OTHER}"}}') == value
                for metric, value in seen.items()
            ),
            30,
        )
    finally:
        other.engines.set_reading(pod, IDLE)


def test_a_long_prompt_goes_to_the_long_tier(fleets: tuple[Fleet, Fleet]) -> None:
    chat, _ = fleets
    # About 150k tokens (450 kB at the filter's 3 bytes a token): past the short tier's 131072, within 524288.
    assert chat.served_by(chat.ask("summarise: " + "lorem ipsum " * 37_500)) in chat.pods(CHAT)
    assert chat.served_by(chat.ask("summarise: " + "lorem ipsum " * 2_000)) in chat.pods(f"{CHAT}-short")  # ~8k


def test_requests_are_held_at_zero_and_served_after_the_autoscaler_scales_from_zero(
    chart: Cluster, operator: OperatorProcess, epp_build: Build, epp_image: Image, tmp_path: Path
) -> None:
    picker_metrics = free_port()
    with prometheus(tmp_path, scrape_config(picker_metrics)) as url:
        chart.apply(scaling_from_zero(url))
        eventually("the cold fleet's picker rendered", lambda: chart.get("deployment", f"{COLD}-epp", NAMESPACE), 60)
        with (
            served(chart, epp_build, epp_image, COLD, 0, metrics_port=picker_metrics) as cold,
            concurrent.futures.ThreadPoolExecutor(2) as pool,
        ):
            held = [pool.submit(cold.ask, f"while at zero {i}") for i in range(2)]
            eventually("flow control holding both requests", lambda: cold.picker.sample(HELD_METRIC) == 2, 30)
            assert not any(f.done() for f in held)
            answers = [f.result(timeout=120) for f in held]  # the autoscaler reads them and scales from zero
            (pod,) = cold.pods(COLD)
            assert [cold.served_by(a) for a in answers] == [pod, pod]
            assert cold.picker.sample(HELD_METRIC) == 0
    # The operator's autoscaler scaled it, for the held requests (an Event: status moves on at its next tick).
    scaled = [
        str(e.get("message"))
        for e in chart.list("events", NAMESPACE)
        if e.get("reason") == "Scaled" and e["involvedObject"].get("name") == COLD
    ]
    assert any("held by the endpoint picker at zero replicas" in m for m in scaled), scaled


KINDS = ",".join(
    (
        "inferencepools.inference.networking.k8s.io",
        "httproutes.gateway.networking.k8s.io",
        "deployments",
        "services",
        "configmaps",
        "serviceaccounts",
        "roles",
        "rolebindings",
    )
)


def test_a_deleted_fleet_leaves_no_pool_picker_or_route(chart: Cluster, fleets: tuple[Fleet, Fleet]) -> None:
    def owned(fleet: str) -> set[str]:
        """The fleet's objects of those kinds (one kubectl call: each costs a second on a busy machine)."""
        listed = chart.kubectl("get", KINDS, "-n", NAMESPACE, "-l", f"m3fleet.dev/name={fleet}", "-o", "name")
        return set(listed.stdout.split())

    path = {
        f"inferencepool.inference.networking.k8s.io/{CHAT}",
        f"httproute.gateway.networking.k8s.io/{CHAT}",
        *(f"{kind}/{CHAT}-epp" for kind in ("deployment.apps", "service", "serviceaccount")),
        *(f"{kind}.rbac.authorization.k8s.io/{CHAT}-epp" for kind in ("role", "rolebinding")),
        f"configmap/{CHAT}-epp-config",
    }
    assert path <= owned(CHAT), f"the operator never rendered {path - owned(CHAT)}"
    chart.kubectl("delete", f"m3d/{CHAT}", "-n", NAMESPACE)
    eventually("the chat fleet's pool, picker, route and workloads gone", lambda: not owned(CHAT), 90)
    assert f"inferencepool.inference.networking.k8s.io/{OTHER}" in owned(OTHER)  # the other fleet's path stays

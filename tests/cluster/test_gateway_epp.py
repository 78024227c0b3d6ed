"""The serving path's endpoint picker, proven with the real one (issue 44 item 4): m3fleet's EPP build (GIE v1.3.0's
EPP with the m3fleet-context-tier filter, .ci/epp.sh) runs as a process on loopback against the real apiserver, as the
ServiceAccount its pod has (a TokenRequest token: the apiserver enforces its Role), with the GIE CRDs installed from
the module it pins. The serving pods run on kwok nodes with loopback pod IPs, and an engine stand-in listens on each
pod's own IP and engine port, exporting its engine's real metric format (vLLM's here), which the EPP scrapes, and
answering completions with its pod's name. The test drives the EPP through Envoy's ext-proc protocol as a Gateway does
(tests/support/cluster/extproc.py) and forwards each request to the endpoint it picked.

Shown: it picks only its pool's endpoints though another pool's pods run beside them; a repeated prefix (a session
resending its growing history) goes back to the replica that holds it; a replica whose engine reports a full KV cache
and a long queue is avoided; a long prompt goes to the long-context tier and a short one to the short tier; with no
replica left, requests are held by flow control (its queue gauge shows them) and served once a replica is back.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.cluster.cluster import Cluster, eventually
from tests.support.cluster.epp import (
    HELD_METRIC,
    IDLE,
    LOADED,
    Build,
    EndpointPicker,
    EngineStandIns,
    build,
    endpoint_picker,
    install_crds,
)
from tests.support.cluster.extproc import Gateway, Routed

NAMESPACE = "gateway-epp"
POOL = "chat"
ENGINE_PORT = 8000
SHORT_CONTEXT, LONG_CONTEXT = 131_072, 1_048_576
TIER_LABEL = "m3fleet.io/max-context-tokens"
MODEL = "MiniMaxAI/MiniMax-M3"
# The picker's scorers as upstream's chart weighs them, our filter first, flow control on (request holding).
CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: m3fleet-context-tier
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: m3fleet-context-tier
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - pluginRef: max-score-picker
saturationDetector:
  metricsStalenessThreshold: 1s
"""
# Scrapes 10 a second (upstream: 20) and a second before a reading is stale (upstream: 200 ms): 2 busy cores.
ARGS = ["--tracing=false", "--enable-pprof=false", "--zap-encoder=json", "--v=2", "--refresh-metrics-interval=100ms"]


def workload(name: str, pool: str, max_context: int, replicas: int) -> dict[str, Any]:
    labels = {"app": name, "pool": pool, TIER_LABEL: str(max_context)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:stand-in",
                            "ports": [{"containerPort": ENGINE_PORT}],
                        }
                    ]
                },
            },
        },
    }


def serving_objects() -> list[dict[str, Any]]:
    """The pool, the EPP's ServiceAccount and Role, and the serving workloads: a short and a long tier of pool `chat`
    and another pool's pods beside them."""
    epp = f"{POOL}-epp"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": epp, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": epp, "namespace": NAMESPACE},
            "rules": [
                {
                    "apiGroups": ["inference.networking.x-k8s.io"],
                    "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                    "verbs": ["get", "watch", "list"],
                },
                {
                    "apiGroups": ["inference.networking.k8s.io"],
                    "resources": ["inferencepools"],
                    "verbs": ["get", "watch", "list"],
                },
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": epp, "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp},
            "subjects": [{"kind": "ServiceAccount", "name": epp, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": POOL, "namespace": NAMESPACE},
            "spec": {
                "selector": {"matchLabels": {"pool": POOL}},
                "targetPorts": [{"number": ENGINE_PORT}],
                "endpointPickerRef": {"name": epp, "port": {"number": 9002}},
            },
        },
        workload("chat-short", POOL, SHORT_CONTEXT, 2),
        workload("chat-long", POOL, LONG_CONTEXT, 1),
        workload("other", "other", SHORT_CONTEXT, 2),
    ]


class Serving:
    """The running setup: the stand-ins of each workload, the EPP, and the gateway client."""

    def __init__(
        self, cluster: Cluster, picker: EndpointPicker, gateway: Gateway, engines: EngineStandIns, other: EngineStandIns
    ) -> None:
        self.cluster, self.picker, self.gateway, self.engines, self.other = cluster, picker, gateway, engines, other

    def pods(self, workload: str) -> list[str]:
        return sorted(p for p in self.engines.pods() if p.startswith(f"{workload}-"))

    def ask(self, prompt: str, history: list[dict[str, str]] | None = None) -> Routed:
        messages = [*(history or []), {"role": "user", "content": prompt}]
        routed = self.gateway.route({"model": MODEL, "messages": messages, "max_tokens": 16})
        assert routed.status == 200, f"{routed}\n--- EPP log ---\n{self.picker.log()[-4000:]}"
        return routed

    def served_by(self, routed: Routed) -> str:
        """The pod that answered: the stand-in on the endpoint the EPP picked names its pod in the answer."""
        assert routed.endpoint is not None
        pod = self.engines.pod_at(routed.endpoint)
        assert pod is not None, f"the EPP picked {routed.endpoint}, no pod of pool {POOL} ({self.engines.ips})"
        assert routed.body["choices"][0]["message"]["content"] == pod
        return pod


@pytest.fixture(scope="module")
def epp_build() -> Build:
    return build()


@pytest.fixture(scope="module")
def serving(cluster: Cluster, epp_build: Build) -> Iterator[Serving]:
    install_crds(cluster, epp_build)
    cluster.namespace(NAMESPACE)
    for document in serving_objects():
        cluster.apply(document)
    with (
        EngineStandIns(cluster, NAMESPACE, f"pool={POOL}", ENGINE_PORT, "vllm") as engines,
        EngineStandIns(cluster, NAMESPACE, "pool=other", ENGINE_PORT, "vllm") as other,
    ):
        eventually(
            "3 chat and 2 other stand-ins on their pods' IPs",
            lambda: len(engines.pods()) == 3 and len(other.pods()) == 2,
            90,
        )
        with endpoint_picker(cluster, epp_build, NAMESPACE, POOL, f"{POOL}-epp", ARGS, CONFIG) as picker:
            gateway = Gateway(picker.grpc_address, epp_build.descriptors, picker.ca)
            setup = Serving(cluster, picker, gateway, engines, other)
            eventually(
                "the EPP sees the pool's 3 ready pods",
                lambda: picker.sample('inference_pool_ready_pods{name="chat"}') == 3,
                60,
            )
            try:
                yield setup
            finally:
                gateway.close()
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def test_only_the_pools_endpoints_are_picked(serving: Serving) -> None:
    picked = [serving.served_by(serving.ask(f"question {uuid.uuid4()}")) for _ in range(12)]
    assert set(picked) <= set(serving.pods("chat-short")), picked  # short prompts: the short tier, of this pool only
    other = {serving.other.endpoint(p) for p in serving.other.pods()}
    assert not other & {serving.engines.endpoint(p) for p in picked}
    assert sum(serving.other.served().values()) == 0


def test_a_repeated_prefix_returns_to_its_replica(serving: Serving) -> None:
    """Sessions resend their growing history each turn, as agents do: every turn lands where the first did."""
    for session in range(4):
        history = [{"role": "system", "content": f"session {session} {uuid.uuid4()} " + "context " * 1500}]
        first = None
        for turn in range(3):
            routed = serving.ask(f"turn {turn}", history)
            pod = serving.served_by(routed)
            first = first or pod
            assert pod == first, f"session {session} turn {turn} went to {pod}, its prefix is on {first}"
            history += [{"role": "user", "content": f"turn {turn}"}, {"role": "assistant", "content": pod}]


def test_a_loaded_replica_is_avoided(serving: Serving) -> None:
    loaded, idle = serving.pods("chat-short")
    serving.engines.set_reading(loaded, LOADED)
    try:
        eventually(
            "the EPP reads the loaded replica's KV utilisation",
            lambda: serving.picker.sample('inference_pool_average_kv_cache_utilization{name="chat"}') > 0.3,
            30,
        )
        picked = [serving.served_by(serving.ask(f"fresh {uuid.uuid4()}")) for _ in range(8)]
        assert picked == [idle] * 8, f"{loaded} reports KV {LOADED.kv_usage} and {LOADED.waiting} waiting: {picked}"
    finally:
        serving.engines.set_reading(loaded, IDLE)


def test_a_long_prompt_goes_to_the_long_tier(serving: Serving) -> None:
    # About 150k tokens (450 kB at the filter's 3 bytes a token): past the short tier's 131072, within 1M.
    long = serving.served_by(serving.ask("summarise: " + "lorem ipsum " * 37_500))
    assert long in serving.pods("chat-long")
    short = serving.served_by(serving.ask("summarise: " + "lorem ipsum " * 2_000))  # about 8k tokens
    assert short in serving.pods("chat-short")


def test_requests_are_held_at_zero_replicas_and_served_after_the_scale_up(serving: Serving) -> None:
    for name in ("chat-short", "chat-long"):
        serving.cluster.kubectl("scale", "deployment", name, "-n", NAMESPACE, "--replicas=0")
    eventually(
        "the pool has no ready pod", lambda: serving.picker.sample('inference_pool_ready_pods{name="chat"}') == 0, 60
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = [pool.submit(serving.ask, f"while scaled to zero {i}") for i in range(2)]
        eventually("flow control holding both requests", lambda: serving.picker.sample(HELD_METRIC) == 2, 30)
        assert not any(f.done() for f in held)
        serving.cluster.kubectl("scale", "deployment", "chat-short", "-n", NAMESPACE, "--replicas=1")
        answers = [f.result(timeout=90) for f in held]
    (pod,) = serving.pods("chat-short")
    assert [serving.served_by(a) for a in answers] == [pod, pod]
    assert serving.picker.sample(HELD_METRIC) == 0

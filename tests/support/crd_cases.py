"""Resources the CRD admits and refuses, with the field each refusal names: the unit tier checks them against the
CRD's schema and CEL rules (tests/unit/test_crd.py), the cluster tier against the real apiserver
(tests/cluster/test_admission.py)."""

from __future__ import annotations

import copy
from typing import Any

from m3fleet.api.models import MAX_NAME_LENGTH

MINIMAL: dict[str, Any] = {
    "apiVersion": "m3fleet.dev/v1alpha1",
    "kind": "MiniMaxM3Deployment",
    "metadata": {"name": "x"},
    "spec": {"model": {"source": {"pvc": {"claimName": "w"}}}},
}


def with_spec(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(MINIMAL)
    for dotted, value in changes.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return doc


def with_name(name: str, **changes: Any) -> dict[str, Any]:
    doc = with_spec(**changes)
    doc["metadata"]["name"] = name
    return doc


LONGEST_NAME = "m" + "3" * (MAX_NAME_LENGTH - 1)
PROM_URL = "spec.autoscaling.prometheus.url"

ENV = "spec.engine.env[0]"
FIELD_REF = {"fieldRef": {"fieldPath": "spec.nodeName"}}
TOLERATION = "spec.nodePool.tolerations[0]"
# Node pool values the apiserver refuses in a Pod (tests/cluster/test_admission.py shows it does): (value, fragment
# of the CRD's message[, the toleration's field]); and values it admits there, which the CRD must admit too.
NODE_SELECTORS_REFUSED: list[tuple[dict[str, str], str]] = [
    ({"pool name": "a"}, "not a label key"),
    ({"a.io/b/c": "a"}, "not a label key"),
    ({"Example.com/pool": "a"}, "not a label key"),
    ({"/pool": "a"}, "not a label key"),
    ({"k" * 64: "a"}, "not a label key"),
    ({".".join(["p" * 63] * 4) + "/k": "a"}, "not a label key"),  # a 255-character prefix
    ({"pool": "a/b"}, "not a label value"),
    ({"pool": "gpu-"}, "not a label value"),
]
TOLERATIONS_REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"key": "a b", "operator": "Exists"}, "not a label key", "key"),
    ({"operator": "Equal", "value": "x"}, "only operator Exists", "key"),
    ({"key": "a", "operator": "Gt", "value": "1"}, "Equal or Exists", "operator"),
    ({"key": "a", "effect": "NoRun"}, "not a taint effect", "effect"),
    ({"key": "a", "operator": "Exists", "value": "b"}, "must be empty", "value"),
    ({"key": "a", "value": "b c"}, "not a label value", "value"),
    ({"key": "a", "effect": "NoSchedule", "tolerationSeconds": 10}, "only to effect NoExecute", "tolerationSeconds"),
]
NODE_SELECTORS_ADMITTED: list[dict[str, str]] = [
    {"example.com/pool": "gpu-a", "tier": "", "zone_1.b": "A-z", "k" * 63: "v" * 63},
    {".".join(["p" * 63] * 3) + "." + "p" * 61 + "/k": "a"},  # a 253-character prefix
]
TOLERATIONS_ADMITTED: list[dict[str, Any]] = [
    {"operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "example.com/x", "value": "gpu-a", "effect": "NoExecute", "tolerationSeconds": 30},
    {"key": "a", "operator": "", "value": "", "effect": ""},
]
# NetworkPolicyPeers (network.allowFrom): (peer, fragment of the CRD's message, the field under the peer), and
# peers the apiserver admits in a NetworkPolicy.
PEERS_REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"namespaceSelector": {"matchLabels": {"bad key": "x"}}}, "not a label key", ".namespaceSelector.matchLabels"),
    ({"podSelector": {"matchLabels": {"app": "a b"}}}, "not a label value", ".podSelector.matchLabels"),
    (
        {"podSelector": {"matchExpressions": [{"key": "a b", "operator": "Exists"}]}},
        "not a label key",
        ".podSelector.matchExpressions[0].key",
    ),
    (
        {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Has"}]}},
        "must be In, NotIn",
        ".podSelector.matchExpressions[0].operator",
    ),
    (
        {"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}},
        "must be given with In",
        ".podSelector.matchExpressions[0].values",
    ),
    (
        {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["a"]}]}},
        "must be given with In",
        ".podSelector.matchExpressions[0].values",
    ),
    (
        {"podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a b"]}]}},
        "not a label value",
        ".podSelector.matchExpressions[0].values",
    ),
    ({}, "a peer needs", ""),
    ({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}, "a peer needs", ""),
]
PEERS_ADMITTED: list[dict[str, Any]] = [
    {"podSelector": {}},
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}, "podSelector": {}},
    {"podSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a", ""]}]}},
    {"namespaceSelector": {"matchExpressions": [{"key": "example.com/team", "operator": "DoesNotExist"}]}},
    {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
]
# spec.podTemplate: (podTemplate, fragment of the CRD's message, the field under spec.podTemplate). m3fleet's own
# names are refused (the CLI and the webhook say the same, tests/unit/test_crd.py); what platforms set is admitted.
SCRATCH = {"name": "scratch", "emptyDir": {}}
POD_TEMPLATES_REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"metadata": {"labels": {"m3fleet.dev/name": "x"}}}, "is m3fleet's", "metadata.labels"),
    ({"metadata": {"labels": {"app.kubernetes.io/instance": "x"}}}, "is m3fleet's", "metadata.labels"),
    ({"metadata": {"labels": {"leaderworkerset.sigs.k8s.io/group-key": "x"}}}, "is m3fleet's", "metadata.labels"),
    ({"metadata": {"labels": {"team": "a b"}}}, "not a label value", "metadata.labels"),
    ({"metadata": {"labels": {"bad key": "x"}}}, "not a label key", "metadata.labels"),
    ({"metadata": {"annotations": {"m3fleet.dev/engine-config-digest": "x"}}}, "is m3fleet's", "metadata.annotations"),
    ({"metadata": {"annotations": {"prometheus.io/port": "1"}}}, "is m3fleet's", "metadata.annotations"),
    ({"metadata": {"annotations": {"bad key": "x"}}}, "not a label key", "metadata.annotations"),
    ({"priorityClassName": "High"}, "DNS-1123 subdomain", "priorityClassName"),
    ({"schedulerName": "my scheduler"}, "DNS-1123 subdomain", "schedulerName"),
    ({"volumes": [{"name": "model", "emptyDir": {}}]}, "a volume m3fleet mounts", "volumes[0].name"),
    ({"volumes": [{"name": "Scratch", "emptyDir": {}}]}, "not a DNS-1123 label", "volumes[0].name"),
    ({"volumes": [SCRATCH, SCRATCH]}, "two volumes of one name", "volumes"),
    ({"volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}, "does not declare", "volumeMounts"),
    (
        {"volumes": [SCRATCH], "volumeMounts": [{"name": "scratch", "mountPath": "scratch"}]},
        "not an absolute path",
        "volumeMounts[0].mountPath",
    ),
    *[
        (
            {"volumes": [SCRATCH], "volumeMounts": [{"name": "scratch", "mountPath": path}]},
            "would mount over",
            "volumeMounts[0].mountPath",
        )
        for path in ("/models", "/models/", "/hf-cache/hub", "/dev", "/", "/etc/m3fleet-ssh", "/home/m3fleet/.cache")
    ],
]
POD_TEMPLATES_ADMITTED: list[dict[str, Any]] = [
    {
        "metadata": {
            "labels": {"kueue.x-k8s.io/queue-name": "gpu-queue", "example.com/cost-center": "ml-42"},
            "annotations": {"scheduling.volcano.sh/queue-name": "serving", "sidecar.istio.io/inject": "false"},
        },
        "priorityClassName": "serving-high",
        "schedulerName": "volcano",
        "volumes": [SCRATCH, {"name": "site-ca", "configMap": {"name": "site-ca"}}],
        "volumeMounts": [
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "site-ca", "mountPath": "/etc/ssl/site", "readOnly": True, "subPath": "certs"},
            {"name": "scratch", "mountPath": "/models-extra"},
        ],
    },
    {"metadata": {"labels": {"example.com/m3fleet.dev": "x", "app.kubernetes.io/part-of": "search"}}},
]
CHILD_VALUE_CASES: list[tuple[dict[str, Any], str, str]] = [
    (with_spec(model__source={"pvc": {"claimName": "other/k"}}), "DNS-1123", "spec.model.source.pvc.claimName"),
    (
        with_spec(model__source={"pvc": {"claimName": "w", "subPath": "a/../b"}}),
        "'..'",
        "spec.model.source.pvc.subPath",
    ),
    (with_spec(model__source={"pvc": {"claimName": "w", "subPath": "/etc"}}), "'/'", "spec.model.source.pvc.subPath"),
    (
        with_spec(model__source={"huggingFace": {"cacheClaimName": "HF"}}),
        "DNS-1123",
        "spec.model.source.huggingFace.cacheClaimName",
    ),
    (with_spec(model__checkpoint="MiniMaxAI/../../etc"), "'..'", "spec.model.checkpoint"),
    (with_spec(engine__apiKeySecretRef={"name": "other/k"}), "DNS-1123", "spec.engine.apiKeySecretRef.name"),
    (
        with_spec(engine__apiKeySecretRef={"name": "k", "key": "a b"}),
        "not a valid key",
        "spec.engine.apiKeySecretRef.key",
    ),
    (with_spec(engine__image="vllm/vllm-openai: v0.33.0"), "image reference", "spec.engine.image"),
    (with_spec(engine__image="Team/vllm"), "image reference", "spec.engine.image"),
    (with_spec(engine__env=[{"name": "A=B", "value": "1"}]), "environment variable name", f"{ENV}.name"),
    (with_spec(engine__env=[{"name": "A", "value": "1", "valueFrom": FIELD_REF}]), "both set", ENV),
    (
        with_spec(engine__env=[{"name": "A", "valueFrom": {**FIELD_REF, "secretKeyRef": {"name": "s", "key": "k"}}}]),
        "exactly one",
        f"{ENV}.valueFrom",
    ),
    (
        with_spec(engine__env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}]),
        "not a pod field",
        f"{ENV}.valueFrom.fieldRef.fieldPath",
    ),
    (
        with_spec(engine__env=[{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "a_b", "key": "k"}}}]),
        "DNS-1123",
        f"{ENV}.valueFrom.configMapKeyRef.name",
    ),
    *[
        (with_spec(nodePool__nodeSelector=labels), fragment, "spec.nodePool.nodeSelector")
        for labels, fragment in NODE_SELECTORS_REFUSED
    ],
    *[
        (with_spec(nodePool__tolerations=[toleration]), fragment, f"{TOLERATION}.{field}")
        for toleration, fragment, field in TOLERATIONS_REFUSED
    ],
    *[
        (with_spec(network__allowFrom=[peer]), fragment, f"spec.network.allowFrom[0]{field}")
        for peer, fragment, field in PEERS_REFUSED
    ],
    *[
        (with_spec(podTemplate=template), fragment, f"spec.podTemplate.{field}")
        for template, fragment, field in POD_TEMPLATES_REFUSED
    ],
]

# spec.gateway.tiers the CRD refuses: (tiers, a fragment of the message, the field named)
TIERS_REFUSED: list[tuple[list[dict[str, Any]], str, str]] = [
    ([{"name": "long", "maxModelLen": 262144}], "shorter than spec.context.maxModelLen", "spec.gateway.tiers"),
    ([{"name": "main", "maxModelLen": 8192}], "the spec's own context", "spec.gateway.tiers[0].name"),
    ([{"name": "s", "maxModelLen": 8192}, {"name": "s", "maxModelLen": 16384}], "same name", "spec.gateway.tiers"),
    (
        [{"name": "a", "maxModelLen": 8192}, {"name": "b", "maxModelLen": 8192}],
        "same maxModelLen",
        "spec.gateway.tiers",
    ),
    (
        [{"name": "s", "maxModelLen": 8192, "minReplicas": 3, "maxReplicas": 2}],
        "exceeds its maxReplicas",
        "spec.gateway.tiers",
    ),
    (
        [{"name": "s", "maxModelLen": 8192, "minReplicas": 5}],
        "an absent one is spec.autoscaling's",
        "spec.gateway.tiers",
    ),
]

# (resource, a fragment of the message, the field the apiserver's rejection names)
CEL_CASES: list[tuple[dict[str, Any], str, str]] = [
    (with_spec(model__variant="mxfp4", accelerator="h200"), "mxfp4", "spec.model.variant"),
    (with_spec(model__variant="mxfp4", accelerator="gb200"), "mxfp4", "spec.model.variant"),
    (with_spec(model__variant="mxfp4", accelerator="mi300x"), "gfx950", "spec.model.variant"),
    (with_spec(engine__name="trtllm", accelerator="mi355x"), "NVIDIA", "spec.engine.name"),
    (with_spec(engine__name="trtllm", accelerator="gb300"), "its MiniMax-M3 guide documents", "spec.engine.name"),
    (with_spec(engine__name="trtllm", accelerator="gb200", model__variant="mxfp8"), "bf16 only", "spec.model.variant"),
    (with_spec(accelerator="mi355x", disaggregation={}), "NVIDIA GPUs only", "spec.disaggregation"),
    (
        with_spec(disaggregation={"inputTokens": 131072}),
        "together with outputTokens is longer",
        "spec.disaggregation.inputTokens",
    ),
    (
        with_spec(disaggregation={"ratio": "1:2", "prefill": {"replicas": 1}}),
        "ratio cannot be pinned together",
        "spec.disaggregation.ratio",
    ),
    (
        with_spec(engine__name="trtllm", accelerator="h200", engine__apiKeySecretRef={"name": "k", "key": "key"}),
        "no API key option",
        "spec.engine.apiKeySecretRef",
    ),
    (
        with_spec(engine__name="trtllm", accelerator="gb200", speculativeDecoding={"method": "eagle3"}),
        "pinned TensorRT-LLM",
        "spec.speculativeDecoding",
    ),
    (
        with_spec(engine__name="sglang", speculativeDecoding={"method": "mtp"}),
        "no MTP (NextN) module",
        "spec.speculativeDecoding.method",
    ),
    (
        with_spec(speculativeDecoding={"method": "mtp", "draftModel": "Inferact/MiniMax-M3-EAGLE3"}),
        "is for eagle3",
        "spec.speculativeDecoding.draftModel",
    ),
    (
        with_spec(engine__name="vllm", engine__adminApiKeySecretRef={"name": "k"}),
        "sglang only",
        "spec.engine.adminApiKeySecretRef",
    ),
    (with_spec(parallelism__tensorParallelSize=3), "tensorParallelSize", "spec.parallelism.tensorParallelSize"),
    (with_spec(parallelism__tensorParallelSize=12), "tensorParallelSize", "spec.parallelism.tensorParallelSize"),
    (with_spec(parallelism__dataParallelSize=6), "dataParallelSize", "spec.parallelism.dataParallelSize"),
    (with_spec(autoscaling__minReplicas=5, autoscaling__maxReplicas=2), "minReplicas", "spec.autoscaling.minReplicas"),
    (with_spec(autoscaling__minReplicas=0), "without spec.gateway", "spec.autoscaling.minReplicas"),
    *[
        (with_spec(gateway={"gatewayRef": {"name": "gw"}, "tiers": tiers}), fragment, field)
        for tiers, fragment, field in TIERS_REFUSED
    ],
    (with_spec(gateway={"gatewayRef": {"name": "Edge_1"}}), "DNS-1123", "spec.gateway.gatewayRef.name"),
    (
        with_spec(gateway={"gatewayRef": {"name": "gw"}}, disaggregation={}),
        "two routers for one fleet",
        "spec.gateway",
    ),
    (
        with_spec(gateway={"gatewayRef": {"name": "gw", "namespace": "Gateways"}}),
        "DNS-1123",
        "spec.gateway.gatewayRef.namespace",
    ),
    (
        with_spec(gateway={"gatewayRef": {"name": "gw"}, "endpointPicker": {"image": "EPP image"}}),
        "not an image reference",
        "spec.gateway.endpointPicker.image",
    ),
    (
        with_spec(
            autoscaling__schedule=[
                {"name": "peak", "start": "09:00", "end": "11:00", "minReplicas": 5, "maxReplicas": 3}
            ]
        ),
        "exceeds its maxReplicas",
        "spec.autoscaling.schedule",
    ),
    (
        with_spec(autoscaling__schedule=[{"name": "peak", "start": "09:00", "end": "11:00"}]),
        "neither minReplicas nor maxReplicas",
        "spec.autoscaling.schedule",
    ),
    (
        with_spec(autoscaling__schedule=[{"name": "peak", "start": "09:00", "end": "09:00", "minReplicas": 2}]),
        "end equals its start",
        "spec.autoscaling.schedule",
    ),
    (
        with_spec(model__source={"pvc": {"claimName": "w"}, "huggingFace": {"cacheClaimName": "c"}}),
        "exactly one",
        "spec.model.source",
    ),
    (with_spec(model__source={}), "exactly one", "spec.model.source"),
    (
        with_spec(
            model__source={"huggingFace": {"cacheClaimName": "c"}},
            model__cacheRef={"name": "m3", "nodeAffinity": "Preferred"},
        ),
        "must then be a pvc",
        "spec.model.cacheRef.nodeAffinity",
    ),
    (with_spec(rollout={"maxSurge": 0, "maxUnavailable": 0}), "at least 1", "spec.rollout.maxUnavailable"),
    (with_spec(rollout={"maxUnavailable": 0}), "at least 1", "spec.rollout.maxUnavailable"),  # maxSurge defaults to 0
    (with_spec(autoscaling__prometheus={"url": "file:///etc/passwd"}), "http:// or https://", PROM_URL),
    (with_spec(autoscaling__prometheus={"url": "gopher://127.0.0.1:70/_x"}), "http:// or https://", PROM_URL),
    (with_spec(autoscaling__prometheus={"url": "http://user:pw@prom:9090"}), "no user name", PROM_URL),
    (with_spec(autoscaling__prometheus={"url": "http://prom:9090/?q=1"}), "no query", PROM_URL),
    (
        with_spec(
            autoscaling__prometheus={"url": "https://p", "caSecretRef": {"name": "ca"}, "insecureSkipVerify": True}
        ),
        "sets both caSecretRef and insecureSkipVerify",
        "spec.autoscaling.prometheus.insecureSkipVerify",
    ),
    (
        with_spec(autoscaling__prometheus={"url": "http://p:9090", "caSecretRef": {"name": "ca"}}),
        "uses no TLS",
        PROM_URL,
    ),
    (
        with_spec(autoscaling__gateway={"matchLabels": {"model-name": "MiniMaxAI/MiniMax-M3"}}),
        "not a Prometheus label name",
        "spec.autoscaling.gateway.matchLabels",
    ),
    (
        with_spec(autoscaling__slo={"ttft": {"seconds": 0, "unloadedPrefillFactor": 0}}),
        "allows no time to first token",
        "spec.autoscaling.slo.ttft.seconds",
    ),
    (
        with_spec(autoscaling__slo={"itl": {"unloadedFactor": 0}}),
        "allows no inter-token latency",
        "spec.autoscaling.slo.itl.seconds",
    ),
    (with_name(LONGEST_NAME + "x"), f"longer than {MAX_NAME_LENGTH}", "metadata.name"),
    (
        with_name(LONGEST_NAME, gateway={"gatewayRef": {"name": "gw"}, "tiers": [{"name": "s", "maxModelLen": 8192}]}),
        "spec.gateway.tiers name",
        "metadata.name",
    ),
    (with_name("Chat"), "lowercase", "metadata.name"),
    (with_name("chat.v2"), "no dots", "metadata.name"),
    (with_name("2chat"), "start with a lowercase letter", "metadata.name"),
    (with_name("chat-"), "end with a letter or digit", "metadata.name"),
    (with_name("chat_v2"), "DNS-1035", "metadata.name"),
    # values a child object carries, checked as the apiserver and the kubelet would check them there
    *CHILD_VALUE_CASES,
]
CEL_IDS = [f"{field}:{fragment}" for _, fragment, field in CEL_CASES]

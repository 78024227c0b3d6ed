"""The objects every fleet is built of, aggregated or disaggregated: metadata, the workload kinds (Deployment,
LeaderWorkerSet), the ComputeDomain, the Service, the PodDisruptionBudget and the NetworkPolicy. Pure."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from m3fleet.engines.base import SERVING_PORT, Container, Context
from m3fleet.render import labels
from m3fleet.render.pod import pod_security_level

LWS_API = "leaderworkerset.x-k8s.io/v1"
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"
PROGRESS_DEADLINE_SECONDS = 2 * 60 * 60  # a rollout includes pulling a large image and loading 427B weights
SERVICE_SUFFIX = "api"
NETWORK_POLICY_SUFFIX = "ingress"
POD_SECURITY_ANNOTATION = "m3fleet.dev/pod-security-level"  # the Pod Security Standard the engine pods meet


def service_name(resource_name: str) -> str:
    """The engine's ClusterIP Service: `<name>-api` (the LeaderWorkerSet controller owns `<name>`)."""
    return f"{resource_name}-{SERVICE_SUFFIX}"


def meta(ctx: Context, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": ctx.namespace, "labels": labels.object_labels(ctx), **extra}


def config_map(ctx: Context, files: Mapping[str, str]) -> dict[str, Any]:
    """The engine-config ConfigMap (`<name>-engine-config`, mounted at CONFIG_MOUNT): launch scripts, engine YAML."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(ctx, ctx.config_map_name),
        "data": dict(sorted(files.items())),
    }


def config_digest(files: Mapping[str, str]) -> str | None:
    """What identifies the engine-config ConfigMap's data (None: the engine needs none)."""
    if not files:
        return None
    data = json.dumps(dict(files), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def compute_domain(ctx: Context) -> dict[str, Any]:
    # One IMEX domain per resource; every group's pods claim its channel (DRA). numNodes 0: the driver
    # follows the pods (recommended with IMEXDaemonsWithDNSNames).
    return {
        "apiVersion": COMPUTE_DOMAIN_API,
        "kind": "ComputeDomain",
        "metadata": meta(ctx, ctx.resource_name("compute-domain")),
        "spec": {
            "numNodes": 0,
            "channel": {"resourceClaimTemplate": {"name": ctx.resource_name("compute-domain-channel")}},
        },
    }


def workload_meta(ctx: Context, name: str, containers: Iterable[Container]) -> dict[str, Any]:
    """A Deployment's or LeaderWorkerSet's metadata: spec.podTemplate's labels and annotations go here too, where
    the integrations read them on the workload object itself. Kueue (kueue.sigs.k8s.io, "Run LeaderWorkerSet")
    admits a LeaderWorkerSet group as one Workload from `kueue.x-k8s.io/queue-name` in the LeaderWorkerSet's
    metadata.labels, and labels the group's pods itself (pod_template leaves the label off them: Kueue skips a pod
    that has it); "Run Deployment" reads it from the pod template (the pod integration), where pod_template puts it
    on a Deployment's pods as well. The annotation says which `pod-security.kubernetes.io/enforce` level the
    namespace may have for these pods to be admitted."""
    passthrough = ctx.spec.pod_template.metadata
    security = {POD_SECURITY_ANNOTATION: pod_security_level(ctx, list(containers)).value}
    result = meta(ctx, name, annotations={**passthrough.annotations, **security})
    result["labels"] = {**passthrough.labels, **result["labels"]}
    return result


def rolling(ctx: Context) -> dict[str, int]:
    # maxSurge 0 by default: replace a replica in place rather than needing a spare GPU node.
    return {"maxSurge": ctx.spec.rollout.max_surge, "maxUnavailable": ctx.spec.rollout.max_unavailable}


def deployment(
    ctx: Context, metadata: dict[str, Any], template: dict[str, Any], replicas: int, selector: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling(ctx)},
            "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
            "template": template,
        },
    }


def leader_worker_set(
    ctx: Context, metadata: dict[str, Any], leader: dict[str, Any], worker: dict[str, Any], replicas: int
) -> dict[str, Any]:
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling(ctx)},
            "leaderWorkerTemplate": {
                "size": ctx.plan.nodes_per_replica,
                # One rank dying breaks the collective: restart the whole group.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def service(ctx: Context, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(ctx, service_name(ctx.name)),
        "spec": {
            "type": "ClusterIP",
            "selector": labels.serving_selector(ctx.name),
            "ports": [{"name": SERVING_PORT, "port": port, "targetPort": SERVING_PORT, "protocol": "TCP"}],
        },
    }


def disruption_budget(ctx: Context) -> dict[str, Any]:
    """Evictions (a node drain, a cluster upgrade) take at most one engine pod at a time, so at most one replica is
    down while it reloads hundreds of GB of weights: in a LeaderWorkerSet the evicted pod's group restarts, and its
    pods then count as unavailable until it is back. One replica's pod can still go (a drain never waits on a fleet
    of one), and an unready pod can always go (a pod that never loads holds no drain)."""
    selector = {labels.NAME: ctx.name, "app.kubernetes.io/component": "engine"}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(ctx, ctx.name),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def network_policy(ctx: Context, api_port: int) -> dict[str, Any]:
    """Ingress to the resource's pods: its own pods on every port (a multi-node group's rendezvous, NCCL, MPI and
    SSH traffic, a disaggregated fleet's KV transfer and discovery), this namespace's pods and
    spec.network.allowFrom on the API port, spec.network.metricsFrom (Prometheus) on the metrics port, which is the
    API port for every engine. Egress is not restricted (weights and the chat template may come from the Hugging
    Face hub)."""
    network = ctx.spec.network

    def port() -> list[dict[str, Any]]:  # a fresh list per rule: YAML output must not share anchors
        return [{"protocol": "TCP", "port": api_port}]

    def own() -> dict[str, Any]:
        return {"podSelector": {"matchLabels": {labels.NAME: ctx.name}}}

    ingress: list[dict[str, Any]] = [
        {"from": [own()]},
        {"from": [{"podSelector": {}}, *copy.deepcopy(network.allow_from)], "ports": port()},
    ]
    if network.metrics_from:
        ingress.append({"from": copy.deepcopy(network.metrics_from), "ports": port()})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(ctx, ctx.resource_name(NETWORK_POLICY_SUFFIX)),
        "spec": {"podSelector": own()["podSelector"], "policyTypes": ["Ingress"], "ingress": ingress},
    }

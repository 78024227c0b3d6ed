"""spec.gateway -> the serving path's objects: the endpoint picker (ServiceAccount, Role, RoleBinding, its
EndpointPickerConfig, Deployment, Service), the InferencePool over the serving pods, and the HTTPRoute from the
user's Gateway to the pool. Pure and deterministic.

Names: the pool and the route are `<name>` (other kinds than the workload's), the picker's objects `<name>-epp`
and its configuration `<name>-epp-config`. The picker's pods carry neither `m3fleet.dev/name` nor the engine
component label, so the engine pods' NetworkPolicy, PodDisruptionBudget and Service never select them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from m3fleet.api.models import GatewayPlan, InferenceGatewaySpec, MiniMaxM3Deployment, Plan
from m3fleet.catalog.gateway import (
    CONFIG_API,
    EPP_GRPC_PORT,
    EPP_HEALTH_PORT,
    EPP_METRICS_PORT,
    FLOW_CONTROL_GATE,
    PICKER_FITS,
    POOL_API,
    ROUTE_API,
    SCORER_WEIGHTS,
)
from m3fleet.render import labels

EPP_SUFFIX = "epp"
EPP_CONFIG_FILE = "config.yaml"
EPP_CONFIG_MOUNT = "/config"
EPP_COMPONENT = "endpoint-picker"
ROUTE_COMPONENT = "gateway"  # the pool and the route
EPP_LABEL = f"{labels.PREFIX}endpoint-picker"  # the picker's pods: `<name>`
EPP_UID = 65532  # the distroless nonroot user the picker image runs as
RBAC_API = "rbac.authorization.k8s.io/v1"
POOL_GROUP = POOL_API.rpartition("/")[0]
# Why the picker may read these (the upstream chart's Role): the pool it serves, the pods it picks from, and the
# objectives and model rewrites it honours when their CRDs are installed.
PICKER_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (POOL_GROUP, ("inferencepools",)),
    ("inference.networking.x-k8s.io", ("inferenceobjectives", "inferencemodelrewrites")),
    ("", ("pods",)),
)


def picker_name(resource_name: str) -> str:
    return f"{resource_name}-{EPP_SUFFIX}"


def _meta(resource: MiniMaxM3Deployment, name: str, component: str = EPP_COMPONENT) -> dict[str, Any]:
    meta = resource.metadata
    object_labels = {**labels.object_labels_for(meta.name), "app.kubernetes.io/component": component}
    return {"name": name, "namespace": meta.namespace, "labels": object_labels}


def _picker_pod_labels(resource_name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "m3fleet-endpoint-picker",
        "app.kubernetes.io/instance": resource_name,
        "app.kubernetes.io/component": EPP_COMPONENT,
        labels.MANAGED_BY: labels.MANAGER,  # the chart's PodMonitor scrapes its held-request gauge
        EPP_LABEL: resource_name,
    }


def picker_config(plan: Plan, gateway: GatewayPlan) -> dict[str, Any]:
    """The EndpointPickerConfig: the context-tier filter (with tiers), the scorers fitted to the engine, and flow
    control (requests held while no endpoint can take them: at zero replicas, until the scale-up is ready)."""
    plugins = [{"type": name} for name in (*gateway.filters, *gateway.scorers)]
    profile = [{"pluginRef": name} for name in gateway.filters] + [
        {"pluginRef": name, "weight": SCORER_WEIGHTS[name]} for name in gateway.scorers
    ]
    return {
        "apiVersion": CONFIG_API,
        "kind": "EndpointPickerConfig",
        "featureGates": [FLOW_CONTROL_GATE],
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": profile}],
    }


def _picker_args(resource: MiniMaxM3Deployment, plan: Plan) -> list[str]:
    """The picker's flags: its pool, its configuration, and where and under which names this engine exports the
    signals it scores (the picker's own defaults are vLLM's; LoRA and cache-info metrics only vLLM has)."""
    fit = PICKER_FITS[plan.engine]
    args = [
        "--pool-name",
        resource.metadata.name,
        "--pool-namespace",
        resource.metadata.namespace,
        "--config-file",
        f"{EPP_CONFIG_MOUNT}/{EPP_CONFIG_FILE}",
        "--grpc-port",
        str(EPP_GRPC_PORT),
        "--grpc-health-port",
        str(EPP_HEALTH_PORT),
        "--metrics-port",
        str(EPP_METRICS_PORT),
        "--model-server-metrics-path",
        fit.metrics_path,
        "--total-queued-requests-metric",
        fit.queued,
        "--total-running-requests-metric",
        fit.running,
        "--kv-cache-usage-percentage-metric",
        fit.kv_usage,
        "--zap-encoder",
        "json",
        "--tracing=false",
        # Prometheus scrapes the picker's metrics (the held requests) without a token: they carry no secrets, and
        # checking tokens would need a ClusterRole for TokenReviews per fleet.
        "--metrics-endpoint-auth=false",
    ]
    if plan.engine != "vllm":
        args += ["--lora-info-metric", "", "--cache-info-metric", ""]
    return args


def _grpc_probe(period: int) -> dict[str, Any]:
    return {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}, "periodSeconds": period}


def _picker_deployment(resource: MiniMaxM3Deployment, plan: Plan, gateway: GatewayPlan, digest: str) -> dict[str, Any]:
    name = picker_name(resource.metadata.name)
    pod_labels = _picker_pod_labels(resource.metadata.name)
    container = {
        "name": "epp",
        "image": gateway.endpoint_picker_image,
        "imagePullPolicy": "IfNotPresent",
        "args": _picker_args(resource, plan),
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "ports": [
            {"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {**_grpc_probe(10), "initialDelaySeconds": 5},
        "readinessProbe": _grpc_probe(2),
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "config", "mountPath": EPP_CONFIG_MOUNT, "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(resource, name),
        "spec": {
            "replicas": 1,
            # One active picker (its prefix index is in memory): the old one goes before the new one starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {EPP_LABEL: resource.metadata.name}},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {
                        "m3fleet.dev/endpoint-picker-config-digest": digest,
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(EPP_METRICS_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "serviceAccountName": name,
                    "terminationGracePeriodSeconds": 130,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": EPP_UID,
                        "runAsGroup": EPP_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}}],
                },
            },
        },
    }


def _picker_rbac(resource: MiniMaxM3Deployment) -> list[dict[str, Any]]:
    name = picker_name(resource.metadata.name)
    subject = {"kind": "ServiceAccount", "name": name, "namespace": resource.metadata.namespace}
    rules = [
        {"apiGroups": [group], "resources": list(resources), "verbs": ["get", "list", "watch"]}
        for group, resources in PICKER_RULES
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(resource, name)},
        {"apiVersion": RBAC_API, "kind": "Role", "metadata": _meta(resource, name), "rules": rules},
        {
            "apiVersion": RBAC_API,
            "kind": "RoleBinding",
            "metadata": _meta(resource, name),
            "roleRef": {"apiGroup": RBAC_API.rpartition("/")[0], "kind": "Role", "name": name},
            "subjects": [subject],
        },
    ]


def _picker_service(resource: MiniMaxM3Deployment) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(resource, picker_name(resource.metadata.name)),
        "spec": {
            "type": "ClusterIP",
            "selector": {EPP_LABEL: resource.metadata.name},
            "ports": [
                {
                    "name": "grpc-ext-proc",
                    "port": EPP_GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "http2",
                },
                {"name": "http-metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def _pool(resource: MiniMaxM3Deployment, port: int) -> dict[str, Any]:
    """Every serving pod of the fleet, every tier (single-node pods and multi-node leaders), on the engine port."""
    name = resource.metadata.name
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": _meta(resource, name, ROUTE_COMPONENT),
        "spec": {
            "selector": {"matchLabels": labels.serving_selector(name)},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": picker_name(name),
                "port": {"number": EPP_GRPC_PORT},
                "failureMode": "FailClose",
            },
        },
    }


def _route(resource: MiniMaxM3Deployment, gateway: InferenceGatewaySpec) -> dict[str, Any]:
    name = resource.metadata.name
    ref = gateway.gateway_ref
    parent: dict[str, Any] = {"group": ROUTE_API.rpartition("/")[0], "kind": "Gateway", "name": ref.name}
    if ref.namespace:
        parent["namespace"] = ref.namespace
    if ref.section_name:
        parent["sectionName"] = ref.section_name
    spec: dict[str, Any] = {
        "parentRefs": [parent],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool", "name": name}],
                "timeouts": {"request": f"{gateway.request_timeout_seconds}s"},
            }
        ],
    }
    if gateway.hostnames:
        spec["hostnames"] = list(gateway.hostnames)
    return {
        "apiVersion": ROUTE_API,
        "kind": "HTTPRoute",
        "metadata": _meta(resource, name, ROUTE_COMPONENT),
        "spec": spec,
    }


def config_digest(config: str) -> str:
    """What identifies the picker's configuration: in its pod template, so a changed configuration restarts it."""
    return hashlib.sha256(config.encode()).hexdigest()[:16]


def gateway_objects(resource: MiniMaxM3Deployment, plan: Plan, port: int) -> list[dict[str, Any]]:
    """The serving path's objects, in apply order (RBAC and configuration before the picker, the picker before the
    pool that names it, the pool before the route to it); none without spec.gateway."""
    gateway = resource.spec.gateway
    if gateway is None or plan.gateway is None:
        return []
    name = picker_name(resource.metadata.name)
    config = yaml.safe_dump(picker_config(plan, plan.gateway), sort_keys=False)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(resource, f"{name}-config"),
        "data": {EPP_CONFIG_FILE: config},
    }
    return [
        *_picker_rbac(resource),
        config_map,
        _picker_deployment(resource, plan, plan.gateway, config_digest(config)),
        _picker_service(resource),
        _pool(resource, port),
        _route(resource, gateway),
    ]

"""A disaggregated resource (spec.disaggregation) as Kubernetes objects: NVIDIA Dynamo's frontend, prefill and
decode workers run by m3fleet itself (renderAs: pods), or one DynamoGraphDeployment for the Dynamo operator
(m3fleet.render.dynamo_graph). Pure and deterministic.

Names (pods): the frontend `<name>-frontend` behind the Service `<name>-api` (the same endpoint as an aggregated
fleet), workers `<name>-prefill` and `<name>-decode` (a Deployment when a worker fits one node, a LeaderWorkerSet
group per worker when it spans nodes), the headless Service `<name>-dynamo` whose EndpointSlices Dynamo's
Kubernetes discovery reads, and the ServiceAccount, Role and RoleBinding `<name>-dynamo` that discovery runs as.
"""

from __future__ import annotations

import copy
from typing import Any

from m3fleet.api.models import DisaggregationPlan, MiniMaxM3Deployment, Plan
from m3fleet.catalog.dynamo import DISCOVERY_LABELS, FRONTEND_PORT, SYSTEM_PORT, WORKER_METADATA_API
from m3fleet.disaggregation import prefill_count
from m3fleet.engines.base import CacheMount, Context, EngineLaunch, Role
from m3fleet.engines.dynamo import frontend_container, worker_launch
from m3fleet.render import labels
from m3fleet.render.pod import pod_template
from m3fleet.render.workloads import (
    compute_domain,
    config_digest,
    config_map,
    deployment,
    disruption_budget,
    leader_worker_set,
    meta,
    network_policy,
    service,
    workload_meta,
)

DYNAMO_ROLE = f"{labels.PREFIX}dynamo-role"  # frontend, prefill or decode: what tells the fleet's workloads apart
DYNAMO_SUFFIX = "dynamo"
FRONTEND_CPU = "2"
FRONTEND_MEMORY = "8Gi"
DOWNWARD_ENV = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid"}
DISCOVERY_RULES = [
    # Each process records itself (its endpoints, its model card) in a DynamoWorkerMetadata and watches the others'.
    {
        "apiGroups": [WORKER_METADATA_API[0]],
        "resources": [WORKER_METADATA_API[1]],
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    },
    # Which of them are ready: the EndpointSlices of the Service in front of the pods.
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},  # its own pod, the metadata's owner
]


def discovery_name(resource_name: str) -> str:
    return f"{resource_name}-{DYNAMO_SUFFIX}"


def render_pods(
    resource: MiniMaxM3Deployment,
    plan: Plan,
    roles: dict[str, Plan],
    decode_replicas: int,
    cache: CacheMount | None = None,
    prefill_replicas: int | None = None,
) -> list[dict[str, Any]]:
    """Every child of a disaggregated resource run as pods; `roles` holds each role's plan (the planner's),
    `decode_replicas` the decode workers in force (spec.replicas or the autoscaler's), `prefill_replicas` the prefill
    workers the autoscaler decided (None: the plan's ratio applied to the decode workers)."""
    d = plan.disaggregation
    if d is None:
        raise ValueError("render_pods needs a disaggregated plan")
    name, namespace = resource.metadata.name, resource.metadata.namespace
    prefill = prefill_count(d, decode_replicas) if prefill_replicas is None else prefill_replicas
    counts = {"prefill": prefill, "decode": decode_replicas}
    contexts = role_contexts(resource, roles, cache)
    launches = {role: worker_launch(ctx, role) for role, ctx in contexts.items()}
    files = {k: v for launch in launches.values() for k, v in launch.config_files.items()}
    digest = config_digest(files)
    top = Context(name, namespace, resource.spec, plan, cache)
    objects: list[dict[str, Any]] = []
    if files:
        objects.append(config_map(top, files))
    if top.accelerator.nvlink_spans_nodes and any(c.multi_node for c in contexts.values()):
        objects.append(compute_domain(top))
    objects += _rbac(top)
    for role in contexts:
        objects.append(_worker(contexts[role], launches[role], role, counts[role], digest))
    objects.append(_frontend(top, d))
    if resource.spec.network.ingress_policy:
        objects.append(network_policy(top, FRONTEND_PORT))
    objects.append(disruption_budget(top))
    objects.append(_discovery_service(top))
    objects.append(service(top, FRONTEND_PORT))
    return objects


def role_contexts(
    resource: MiniMaxM3Deployment, roles: dict[str, Plan], cache: CacheMount | None = None
) -> dict[str, Context]:
    """Decode first: its workload is what status reports (spec.replicas counts decode workers)."""
    meta_ = resource.metadata
    return {
        role: Context(meta_.name, meta_.namespace, resource.spec, roles[role], cache) for role in ("decode", "prefill")
    }


def worker_secrets(resource: MiniMaxM3Deployment, roles: dict[str, Plan]) -> list[str]:
    """The Secrets the workers need generated (the TensorRT-LLM multi-node SSH key), once each."""
    found = {worker_launch(ctx, role).ssh_secret for role, ctx in role_contexts(resource, roles).items()}
    return sorted(s for s in found if s is not None)


def _rbac(ctx: Context) -> list[dict[str, Any]]:
    """What Dynamo's Kubernetes discovery reads and writes, granted to the fleet's own ServiceAccount only."""
    account = discovery_name(ctx.name)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(ctx, account)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(ctx, account),
            "rules": copy.deepcopy(DISCOVERY_RULES),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(ctx, account),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ctx.namespace}],
        },
    ]


def _dynamo_pod(ctx: Context, template: dict[str, Any], role: str) -> dict[str, Any]:
    """A pod of the fleet as Dynamo's discovery needs it: its role, the discovery labels, the ServiceAccount with
    its token, and the pod's identity in the environment."""
    pod = copy.deepcopy(template)
    pod["metadata"]["labels"].update({DYNAMO_ROLE: role, **DISCOVERY_LABELS})
    annotations = pod["metadata"].get("annotations") or {}
    if "prometheus.io/scrape" in annotations and role != "frontend":  # a worker's metrics: its system server
        annotations.update({"prometheus.io/port": str(SYSTEM_PORT), "prometheus.io/path": "/metrics"})
    spec = pod["spec"]
    spec["serviceAccountName"] = discovery_name(ctx.name)
    spec["automountServiceAccountToken"] = True  # discovery talks to the API server
    downward = [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in sorted(DOWNWARD_ENV.items())]
    for container in spec["containers"]:
        if container["name"] == "engine":
            container["env"] = sorted([*container["env"], *downward], key=lambda e: e["name"])
    return pod


def _worker(ctx: Context, launch: EngineLaunch, role: str, replicas: int, digest: str | None) -> dict[str, Any]:
    metadata = workload_meta(ctx, ctx.resource_name(role), launch.containers.values())
    metadata["labels"][DYNAMO_ROLE] = role
    if Role.SINGLE in launch.containers:
        template = pod_template(ctx, Role.SINGLE, launch.containers[Role.SINGLE], digest, None)
        selector = {labels.NAME: ctx.name, DYNAMO_ROLE: role}
        return deployment(ctx, metadata, _dynamo_pod(ctx, template, role), replicas, selector)
    leader = pod_template(ctx, Role.LEADER, launch.containers[Role.LEADER], digest, launch.ssh_secret)
    worker = pod_template(ctx, Role.WORKER, launch.containers[Role.WORKER], digest, launch.ssh_secret)
    return leader_worker_set(ctx, metadata, _dynamo_pod(ctx, leader, role), _dynamo_pod(ctx, worker, role), replicas)


def _frontend(ctx: Context, d: DisaggregationPlan) -> dict[str, Any]:
    """Dynamo's frontend (OpenAI HTTP + KV router): no GPU, Pod Security restricted."""
    container = frontend_container(ctx, d)
    pod_labels = {**labels.pod_labels(ctx, Role.SINGLE, True), "app.kubernetes.io/component": "frontend"}
    probe = {"periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 5}
    engine = {
        "name": "frontend",
        "image": d.image,
        "imagePullPolicy": "IfNotPresent",
        "command": container.command,
        "args": container.args,
        "env": [],
        "ports": [{"name": "http", "containerPort": FRONTEND_PORT, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": FRONTEND_CPU, "memory": FRONTEND_MEMORY},
            "limits": {"memory": FRONTEND_MEMORY},
        },
        "readinessProbe": {"httpGet": {"path": "/health", "port": FRONTEND_PORT}, **probe},
        "livenessProbe": {"httpGet": {"path": "/live", "port": FRONTEND_PORT}, **probe, "periodSeconds": 30},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
            "runAsNonRoot": True,
        },
    }
    template = {
        "metadata": {
            "labels": pod_labels,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(FRONTEND_PORT),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": {
            "containers": [engine],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
            "enableServiceLinks": False,
        },
    }
    pod = _dynamo_pod(ctx, template, "frontend")
    for c in pod["spec"]["containers"]:
        c["env"] = [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in sorted(DOWNWARD_ENV.items())]
    metadata = meta(ctx, ctx.resource_name("frontend"))
    metadata["labels"] = {**metadata["labels"], "app.kubernetes.io/component": "frontend", DYNAMO_ROLE: "frontend"}
    selector = {labels.NAME: ctx.name, DYNAMO_ROLE: "frontend"}
    return deployment(ctx, metadata, pod, d.frontend_replicas, selector)


def _discovery_service(ctx: Context) -> dict[str, Any]:
    """Headless: its EndpointSlices tell Dynamo's discovery which of the fleet's pods are ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            **meta(ctx, discovery_name(ctx.name)),
            "labels": {**labels.object_labels(ctx), **DISCOVERY_LABELS},
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": {labels.NAME: ctx.name, **DISCOVERY_LABELS},
            "ports": [{"name": "system", "port": SYSTEM_PORT, "targetPort": SYSTEM_PORT, "protocol": "TCP"}],
        },
    }

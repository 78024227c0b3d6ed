"""A disaggregated resource as one DynamoGraphDeployment (nvidia.com/v1beta1) for a cluster that runs the Dynamo
operator (spec.disaggregation.renderAs: DynamoGraphDeployment). Pure.

The shape follows Dynamo's published CRD (ai-dynamo/dynamo deploy/operator/config/crd/bases/
nvidia.com_dynamographdeployments.yaml, version v1beta1, the storage version that the Dynamo 1.6.1 planner reads:
dynamo/planner/connectors/clients/kubernetes_api.py): `spec.backendFramework`, and `spec.components[]` with `name`,
`type` (frontend, prefill, decode), `replicas`, `multinode.nodeCount`, `sharedMemorySize` and a `podTemplate` whose
container `main` carries the image and the command. The Dynamo operator adds discovery, the multi-node launch
(mpirun for TensorRT-LLM), probes and ports itself, so the workers' commands leave those out.
"""

from __future__ import annotations

from typing import Any

from m3fleet.api.models import MiniMaxM3Deployment, Plan
from m3fleet.api.spec_pod import CONFIG_MOUNT, MODEL_MOUNT
from m3fleet.catalog.facts import POD_SHM_GIB
from m3fleet.disaggregation import prefill_count
from m3fleet.engines.base import CacheMount, Context
from m3fleet.engines.dynamo import dynamo_command_without_runtime, frontend_command, role_config_files
from m3fleet.render.pod import placement
from m3fleet.render.workloads import config_digest, config_map, meta

DGD_API = "nvidia.com/v1beta1"
MAIN = "main"  # the container the Dynamo operator merges its defaults into


def render_graph(
    resource: MiniMaxM3Deployment,
    plan: Plan,
    roles: dict[str, Plan],
    decode_replicas: int,
    cache: CacheMount | None = None,
    prefill_replicas: int | None = None,
) -> list[dict[str, Any]]:
    """The engine ConfigMap (TensorRT-LLM's per-role YAML) and the DynamoGraphDeployment."""
    d = plan.disaggregation
    if d is None:
        raise ValueError("render_graph needs a disaggregated plan")
    name, namespace = resource.metadata.name, resource.metadata.namespace
    top = Context(name, namespace, resource.spec, plan, cache)
    contexts = {role: Context(name, namespace, resource.spec, roles[role], cache) for role in ("prefill", "decode")}
    files = {k: v for role, ctx in contexts.items() for k, v in role_config_files(ctx, role).items()}
    prefill = prefill_count(d, decode_replicas) if prefill_replicas is None else prefill_replicas
    counts = {"prefill": prefill, "decode": decode_replicas}
    objects: list[dict[str, Any]] = []
    if files:
        objects.append(config_map(top, files))
    frontend = frontend_command(top, d)
    components = [
        {
            "name": "frontend",
            "type": "frontend",
            "replicas": d.frontend_replicas,
            "podTemplate": {"spec": {"containers": [_main(d.image, frontend[:3], frontend[3:])]}},
        }
    ]
    for role, ctx in contexts.items():
        command = dynamo_command_without_runtime(ctx, role)
        component: dict[str, Any] = {
            "name": role,
            "type": role,
            "replicas": counts[role],
            "sharedMemorySize": f"{POD_SHM_GIB}Gi",
            "podTemplate": _worker_pod(ctx, d.image, command, config_digest(files) if files else None),
        }
        if ctx.plan.nodes_per_replica > 1:
            component["multinode"] = {"nodeCount": ctx.plan.nodes_per_replica}
        components.append(component)
    objects.append(
        {
            "apiVersion": DGD_API,
            "kind": "DynamoGraphDeployment",
            "metadata": meta(top, name),
            "spec": {"backendFramework": str(plan.engine), "components": components},
        }
    )
    return objects


def _main(image: str, command: list[str], args: list[str]) -> dict[str, Any]:
    return {"name": MAIN, "image": image, "command": command, "args": args}


def _worker_pod(ctx: Context, image: str, command: list[str], digest: str | None) -> dict[str, Any]:
    plan = ctx.plan
    gpus = str(plan.gpus_per_node)
    resource = ctx.accelerator.resource_name
    main = _main(image, command[:3], command[3:])
    main["resources"] = {"requests": {resource: gpus}, "limits": {resource: gpus}}
    spec: dict[str, Any] = {"containers": [main], **placement(ctx)}
    pvc = ctx.spec.model.source.pvc
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if pvc is not None:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    if digest is not None:
        volumes.append({"name": "engine-config", "configMap": {"name": ctx.resource_name("engine-config")}})
        mounts.append({"name": "engine-config", "mountPath": CONFIG_MOUNT, "readOnly": True})
    if mounts:
        main["volumeMounts"] = mounts
        spec["volumes"] = volumes
    template: dict[str, Any] = {"spec": spec}
    if digest is not None:
        template["metadata"] = {"annotations": {"m3fleet.dev/engine-config-digest": digest}}
    return template

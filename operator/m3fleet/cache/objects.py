"""The objects a cache's plan asks for, built and not applied: a staging or cleanup Job pinned to one node, and the
pre-pull DaemonSet of the engine images."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from m3fleet.api.cache import MiniMaxM3ModelCache
from m3fleet.cache.inputs import (
    ACTION_LABEL,
    ATTEMPT_ANNOTATION,
    BAD_SOURCE_EXIT_CODE,
    CACHE_LABEL,
    CACHE_VOLUME,
    CLEAN,
    CONTENT_LABEL,
    JOB_BACKOFF_LIMIT,
    MANAGED_BY,
    MANAGER,
    NODE_ANNOTATION,
    PAUSE_IMAGE,
    SOURCE_MOUNT,
    STAGE,
    STAGE_MOUNT,
    Inputs,
)
from m3fleet.catalog import ACCELERATORS


def short_hash(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:10]


def job_name(cache: str, action: str, node: str, content: str, attempt: int) -> str:
    """At most 63 characters whatever the node's name (the job-name label on its pods must fit)."""
    return f"{cache[:40]}-{action}-{short_hash(node, content, str(attempt))}"


def _owner(cache: MiniMaxM3ModelCache, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": cache.api_version,
        "kind": cache.kind,
        "name": cache.metadata.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _labels(cache: MiniMaxM3ModelCache) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "minimax-m3",
        "app.kubernetes.io/instance": cache.metadata.name,
        "app.kubernetes.io/component": "model-cache",
        MANAGED_BY: MANAGER,
        CACHE_LABEL: cache.metadata.name,
    }


def _tolerations(cache: MiniMaxM3ModelCache) -> list[dict[str, Any]]:
    accelerator = ACCELERATORS[cache.spec.nodes.accelerator]
    gpu_taint = {"key": accelerator.resource_name, "operator": "Exists", "effect": "NoSchedule"}
    return [gpu_taint, *cache.spec.nodes.tolerations]


# A cordoned node takes no new staging, but a cache's removal must still empty its directory there (as
# DaemonSets tolerate the cordon), or the finalizer would wait for an uncordon that may never come.
CORDONED: Final[list[dict[str, Any]]] = [
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
]


def _on_node(node: str) -> dict[str, Any]:
    """Pinned to one node the way DaemonSets pin their pods: a required affinity on the node's name (the
    scheduler still checks taints and resources, unlike spec.nodeName)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def stage_command(cache: MiniMaxM3ModelCache) -> tuple[list[str], list[dict[str, Any]]]:
    """`m3fleet stage ...` for this cache's source, and the environment it needs."""
    source = cache.spec.source
    if source.hugging_face is not None:
        hf = source.hugging_face
        args = ["m3fleet", "stage", "huggingface", "--repo", hf.repo, "--revision", hf.revision]
        env: list[dict[str, Any]] = [{"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
        if hf.endpoint:
            env.append({"name": "HF_ENDPOINT", "value": hf.endpoint})
        if hf.token_secret_ref is not None:  # referenced, never read by the operator
            ref = {"name": hf.token_secret_ref.name, "key": hf.token_secret_ref.key}
            env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
        return [*args, "--dest", STAGE_MOUNT, "--owner", owner_of(cache)], env
    assert source.pvc is not None
    origin = f"{SOURCE_MOUNT}/{source.pvc.sub_path.strip('/')}".rstrip("/") if source.pvc.sub_path else SOURCE_MOUNT
    return ["m3fleet", "stage", "copy", "--from", origin, "--dest", STAGE_MOUNT, "--owner", owner_of(cache)], []


def owner_of(cache: MiniMaxM3ModelCache) -> str:
    """Who a staging record belongs to: the cache's namespace/name (a re-created cache of the name keeps its copy)."""
    return f"{cache.metadata.namespace}/{cache.metadata.name}"


def job_manifest(
    inputs: Inputs, node: str, action: str, attempt: int, directory: tuple[str, str] | None = None
) -> dict[str, Any]:
    """A Job on `node` for the cache's directory, or for `directory` (path, the content staged there) when
    cleaning one the cache no longer uses."""
    cache = inputs.cache
    path, content = directory or (cache.spec.path, cache.spec.content_digest())
    volumes: list[dict[str, Any]] = [{"name": CACHE_VOLUME, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}]
    mounts: list[dict[str, Any]] = [{"name": CACHE_VOLUME, "mountPath": STAGE_MOUNT}]
    if action == STAGE:
        command, env = stage_command(cache)
        if cache.spec.source.pvc is not None:
            claim = {"claimName": cache.spec.source.pvc.claim_name, "readOnly": True}
            volumes.append({"name": "source", "persistentVolumeClaim": claim})
            mounts.append({"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True})
    else:
        command, env = ["m3fleet", "stage", "clean", "--dest", STAGE_MOUNT, "--owner", owner_of(cache)], []
    env = [*env, {"name": "HF_HOME", "value": f"{STAGE_MOUNT}/.m3fleet-hf-home"}]
    container = {
        "name": action,
        "image": inputs.image(),
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": env,
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        # Writes a root-owned node directory: root, but nothing more (no privilege, every capability dropped
        # but the ones a copy that keeps ownership needs).
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    labels = {**_labels(cache), CONTENT_LABEL: content, ACTION_LABEL: action}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(cache.metadata.name, action, node, content, attempt),
            "namespace": cache.metadata.namespace,
            "labels": labels,
            "annotations": {NODE_ANNOTATION: node, ATTEMPT_ANNOTATION: str(attempt)},
            "ownerReferences": [_owner(cache, inputs.uid)],
        },
        "spec": {
            "backoffLimit": JOB_BACKOFF_LIMIT,
            # A rejected source fails the Job at once: retrying the same request cannot help.
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": action, "operator": "In", "values": [BAD_SOURCE_EXIT_CODE]},
                    }
                ]
            },
            "template": {
                "metadata": {"labels": labels, "annotations": {NODE_ANNOTATION: node}},
                "spec": {
                    "restartPolicy": "Never",
                    "affinity": _on_node(node),
                    "tolerations": _tolerations(cache) + (CORDONED if action == CLEAN else []),
                    "containers": [container],
                    "volumes": volumes,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                },
            },
        },
    }


def written_path(job: Mapping[str, Any]) -> str:
    """The node directory a Job made by `job_manifest` writes ("" when it names none)."""
    volumes = ((job.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes") or []
    for volume in volumes:
        if volume.get("name") == CACHE_VOLUME:
            return str((volume.get("hostPath") or {}).get("path") or "")
    return ""


def prepull_daemonset(inputs: Inputs) -> dict[str, Any]:
    """Pre-pull: one pod per pool node whose init containers are the engine images running `sh -c 'exit 0'`
    (every engine image is a full Linux userland with a shell), then a pause container that holds the pod (and
    so the images: the kubelet's image GC does not remove images in use)."""
    cache = inputs.cache
    accelerator = ACCELERATORS[cache.spec.nodes.accelerator]
    selector = {k: v[0] for k, v in accelerator.node_labels.items() if len(v) == 1}
    selector.update(cache.spec.nodes.node_selector)
    tiny = {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "64Mi"}}
    security = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    init = [
        {
            "name": f"pull-{index}",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "exit 0"],
            "resources": tiny,
            "securityContext": security,
        }
        for index, image in enumerate(sorted(set(inputs.images)))
    ]
    labels = {**_labels(cache), ACTION_LABEL: "pre-pull"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": f"{cache.metadata.name}-prepull",
            "namespace": cache.metadata.namespace,
            "labels": labels,
            "ownerReferences": [_owner(cache, inputs.uid)],
        },
        "spec": {
            "selector": {"matchLabels": {CACHE_LABEL: cache.metadata.name, ACTION_LABEL: "pre-pull"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": dict(sorted(selector.items())),
                    "tolerations": _tolerations(cache),
                    "initContainers": init,
                    "containers": [
                        {
                            "name": "pause",
                            "image": PAUSE_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "resources": tiny,
                            "securityContext": {**security, "runAsNonRoot": True, "runAsUser": 65535},
                        }
                    ],
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 1,
                },
            },
        },
    }

"""One engine pod template: placement, GPUs, volumes, environment, probes, security."""

from __future__ import annotations

import copy
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any

from m3fleet.api.spec_pod import (
    CACHE_MOUNT,
    CONFIG_MOUNT,
    HF_CACHE_MOUNT,
    HOME_MOUNT,
    MODEL_LINK_DIR,
    MODEL_MOUNT,
    SHM_MOUNT,
    SSH_MOUNT,
)
from m3fleet.catalog.facts import POD_SHM_GIB
from m3fleet.engines.base import (
    DRAIN_SECONDS,
    MODEL_LINK,
    TERMINATION_GRACE_SECONDS,
    Container,
    Context,
    KeyGuard,
    Probe,
    Role,
    literal,
)
from m3fleet.engines.environment import check_user_env
from m3fleet.render.labels import NAME, pod_labels

SHM_SIZE = f"{POD_SHM_GIB}Gi"  # the AMD verified run used 32g; vLLM/SGLang pass tensors between ranks through /dev/shm
# The label LeaderWorkerSet puts on every pod of one group (LWS-API GroupUniqueHashLabelKey; the leader gets it from
# the LWS pod webhook, workers from their StatefulSet template, both before the apiserver reads matchLabelKeys).
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
COMPUTE_DOMAIN_CLAIM = "compute-domain-channel"
CONFIG_DIGEST_ANNOTATION = "m3fleet.dev/engine-config-digest"  # on the pod template: which ConfigMap data it runs
# Kueue's LeaderWorkerSet integration reads the queue on the LeaderWorkerSet (workload_meta puts it there) and labels
# each pod of a group itself, with the group's Workload; it leaves alone a pod that already carries the label, which
# then joins no Workload and keeps Kueue's admission gate forever (seen on the real tier, tests/cluster/test_kueue.py).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NON_ROOT_UID = 1000  # engine pods that need no root run as this UID/GID (Pod Security restricted)


def _probe(probe: Probe | None) -> dict[str, Any] | None:
    if probe is None:
        return None
    action: dict[str, Any] = (
        {"httpGet": {"path": probe.path, "port": probe.port}} if probe.path else {"tcpSocket": {"port": probe.port}}
    )
    return {
        **action,
        "periodSeconds": probe.period_seconds,
        "failureThreshold": probe.failure_threshold,
        "timeoutSeconds": probe.timeout_seconds,
    }


def model_env(ctx: Context) -> list[dict[str, Any]]:
    """HF_HOME, and HF_TOKEN from its Secret, when the weights come from the Hugging Face cache."""
    hf = ctx.spec.model.source.hugging_face
    if hf is None or ctx.cache is not None:
        return []
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": HF_CACHE_MOUNT}]
    if hf.token_secret_ref is not None:  # referenced, never copied: the operator never reads the token
        ref = {"name": hf.token_secret_ref.name, "key": hf.token_secret_ref.key}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env


def model_volumes(ctx: Context) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The checkpoint's volume and mount: its claim read-only at MODEL_MOUNT, or the shared Hugging Face cache.
    With a model cache: the node-local copy read-only (hostPath) at MODEL_MOUNT (Required: the pod runs only where
    it is complete, so the directory must exist); Preferred mounts it at CACHE_MOUNT (created if absent) next to
    the pvc, and an init container points MODEL_LINK at whichever holds the checkpoint."""
    source = ctx.spec.model.source
    cache = ctx.cache
    if cache is not None and cache.required:
        host = {"path": cache.path, "type": "Directory"}
        return [{"name": "model-cache", "hostPath": host}], [
            {"name": "model-cache", "mountPath": MODEL_MOUNT, "readOnly": True}
        ]
    if cache is not None and source.pvc is not None:
        claim = {"claimName": source.pvc.claim_name, "readOnly": True}
        volumes = [
            {"name": "model", "persistentVolumeClaim": claim},
            {"name": "model-cache", "hostPath": {"path": cache.path, "type": "DirectoryOrCreate"}},
            {"name": "model-link", "emptyDir": {"sizeLimit": "1Mi"}},
        ]
        return volumes, [
            {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True},
            {"name": "model-cache", "mountPath": CACHE_MOUNT, "readOnly": True},
            {"name": "model-link", "mountPath": MODEL_LINK_DIR},
        ]
    if source.pvc is not None:
        claim = {"claimName": source.pvc.claim_name, "readOnly": True}
        return [{"name": "model", "persistentVolumeClaim": claim}], [
            {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
        ]
    if source.hugging_face is not None:
        claim = {"claimName": source.hugging_face.cache_claim_name}
        return [{"name": "hf-cache", "persistentVolumeClaim": claim}], [
            {"name": "hf-cache", "mountPath": HF_CACHE_MOUNT}
        ]
    return [], []


def home_env() -> dict[str, str]:
    """HOME and the caches on the writable emptyDir: engine images write caches (compiled kernels, torch.compile,
    Triton, FlashInfer JIT) under $HOME/.cache, and a non-root UID has no home in the image."""
    return {"HOME": HOME_MOUNT, "XDG_CACHE_HOME": f"{HOME_MOUNT}/.cache", "USER": "m3fleet"}


def _env(ctx: Context, container: Container) -> list[dict[str, Any]]:
    values: dict[str, dict[str, Any]] = {k: {"name": k, "value": v} for k, v in {**home_env(), **container.env}.items()}
    for name, (secret, key) in container.secret_env.items():  # referenced, never copied
        values[name] = {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
    if ctx.accelerator.nvlink_spans_nodes and ctx.multi_node:
        # Multi-node NVLink through the IMEX channel (third-party GB200 guides; UNVERIFIED as official).
        for name in ("NCCL_MNNVL_ENABLE", "NCCL_CUMEM_ENABLE"):
            values[name] = {"name": name, "value": "1"}
    values.update((entry["name"], entry) for entry in model_env(ctx))
    why = f"m3fleet renders it for this {ctx.plan.engine} plan on {ctx.plan.accelerator}"
    check_user_env(ctx.spec.engine.env, dict.fromkeys(values, why))
    for user in ctx.spec.engine.env:
        entry: dict[str, Any] = {"name": user.name}
        if user.value_from is not None:
            entry["valueFrom"] = user.value_from.model_dump(by_alias=True, exclude_none=True, mode="json")
        else:
            entry["value"] = literal(user.value or "")  # data, not a $(VAR) reference the kubelet would expand
        values[user.name] = entry
    return [values[k] for k in sorted(values)]


def _volumes(ctx: Context, launch_config: bool, ssh_secret: str | None) -> tuple[list[Any], list[Any]]:
    model, model_mounts = model_volumes(ctx)
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
        {"name": "home", "emptyDir": {}},
        *model,
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": SHM_MOUNT},
        {"name": "home", "mountPath": HOME_MOUNT},
        *model_mounts,
    ]
    if launch_config:
        volumes.append({"name": "engine-config", "configMap": {"name": ctx.config_map_name}})
        mounts.append({"name": "engine-config", "mountPath": CONFIG_MOUNT, "readOnly": True})
    if ssh_secret is not None:
        volumes.append({"name": "mpi-ssh", "secret": {"secretName": ssh_secret, "defaultMode": 0o400}})
        mounts.append({"name": "mpi-ssh", "mountPath": SSH_MOUNT, "readOnly": True})
    return volumes, mounts


class PodSecurityLevel(StrEnum):
    """The Pod Security Standard an engine pod meets (the namespace label pod-security.kubernetes.io/enforce)."""

    RESTRICTED = "restricted"
    BASELINE = "baseline"
    PRIVILEGED = "privileged"


def runs_as_root(ctx: Context, container: Container) -> bool:
    """Root only where the image needs it: sshd for TensorRT-LLM multi-node; ROCm, whose /dev/kfd and /dev/dri are
    root:video/render (group IDs differ per node, so a fixed supplemental group cannot be rendered); RDMA
    (nodePool.extraResources), whose IPC_LOCK a non-root process does not get (Kubernetes sets no ambient caps)."""
    return container.runs_as_root or ctx.accelerator.vendor == "amd" or bool(ctx.spec.node_pool.extra_resources)


def pod_security_level(ctx: Context, containers: list[Container]) -> PodSecurityLevel:
    """Restricted for non-root pods with no added capability; baseline for root with baseline's capabilities
    (sshd's); privileged for SYS_PTRACE/Unconfined (AMD), IPC_LOCK (RDMA) or a model cache's hostPath volume,
    which baseline forbids (and restricted with it)."""
    volumes = _user_volume_level(ctx)  # spec.podTemplate.volumes: a hostPath is privileged, a nfs baseline
    if ctx.accelerator.vendor == "amd" or ctx.spec.node_pool.extra_resources or ctx.cache is not None:
        return PodSecurityLevel.PRIVILEGED
    if volumes == PodSecurityLevel.PRIVILEGED:
        return volumes
    if volumes == PodSecurityLevel.BASELINE or any(runs_as_root(ctx, c) or c.capabilities for c in containers):
        return PodSecurityLevel.BASELINE
    return PodSecurityLevel.RESTRICTED


def _pod_security(ctx: Context, container: Container) -> dict[str, Any]:
    """A non-root pod: restricted's pod-level fields (root pods keep the image's user)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,  # the shared Hugging Face cache claim is written by this group
        "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown of a cache of hundreds of GiB on every start
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _security(ctx: Context, container: Container) -> dict[str, Any]:
    add: list[str] = list(container.capabilities)
    seccomp = "RuntimeDefault"
    if ctx.spec.node_pool.extra_resources:
        add.append("IPC_LOCK")  # RDMA registers (pins) memory (VLLM-PAR)
    if ctx.accelerator.vendor == "amd":
        # The ROCm recipe runs with --cap-add SYS_PTRACE --security-opt seccomp=unconfined (VLLM-RCP-AMD).
        add.append("SYS_PTRACE")
        seccomp = "Unconfined"
    caps: dict[str, Any] = {"drop": ["ALL"]}
    if add:
        caps["add"] = sorted(add)
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": caps,
        "seccompProfile": {"type": seccomp},
    }
    if not runs_as_root(ctx, container):
        context["runAsNonRoot"] = True
    return context


def _resources(ctx: Context) -> dict[str, Any]:
    """GPUs and extra devices; CPU and memory sized for the pool (plan.cpuPerPod, plan.memoryGiBPerPod), so the pod is
    never BestEffort. Memory limit = request: the engine never runs above its request, so under node memory
    pressure the kubelet evicts other pods first (it ranks pods by usage above request); the limit also bounds the
    memory-backed /dev/shm. No CPU limit: a CFS quota would throttle the tokenizer and scheduler threads."""
    # Quantities as strings, the form the API server stores: a LeaderWorkerSet (a custom resource) keeps what it is
    # sent, so a number here read back as "8" and every restart saw drift and re-applied the group.
    devices = {ctx.accelerator.resource_name: str(ctx.plan.gpus_per_node)}
    devices.update({name: str(count) for name, count in ctx.spec.node_pool.extra_resources.items()})
    memory = f"{ctx.plan.memory_gib_per_pod}Gi"
    requests = {"cpu": str(ctx.plan.cpu_per_pod), "memory": memory, **devices}
    limits = {"memory": memory, **devices}
    resources: dict[str, Any] = {"limits": dict(sorted(limits.items())), "requests": dict(sorted(requests.items()))}
    if ctx.accelerator.nvlink_spans_nodes and ctx.multi_node:
        resources["claims"] = [{"name": COMPUTE_DOMAIN_CLAIM}]
    return resources


def placement(ctx: Context) -> dict[str, Any]:
    """Where the accelerator pool is (the engine image is pulled there). Its labels: one known value as a
    nodeSelector, several (spellings differ between device plugin versions) as a required node affinity
    `In` term. A key the user selects on is theirs alone. Any pod may use it (m3fleet bench's Job does);
    engine pods add their group's NVLink-domain affinity (`_placement`)."""
    user = ctx.spec.node_pool.node_selector
    selector = {k: v[0] for k, v in ctx.accelerator.node_labels.items() if len(v) == 1 and k not in user}
    selector.update(user)  # the user's labels win (the catalog's may be wrong)
    choices = [
        {"key": k, "operator": "In", "values": list(v)}
        for k, v in sorted(ctx.accelerator.node_labels.items())
        if len(v) > 1 and k not in user
    ]
    gpu_taint = {"key": ctx.accelerator.resource_name, "operator": "Exists", "effect": "NoSchedule"}
    tolerations = [gpu_taint, *ctx.spec.node_pool.tolerations]
    where: dict[str, Any] = {"nodeSelector": dict(sorted(selector.items())), "tolerations": tolerations}
    if choices:
        terms = [{"matchExpressions": choices}]
        where["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    return where


COMPLETE_MARKER = ".m3fleet-complete.json"  # written by `m3fleet stage` after the whole copy verified


def model_link_init(ctx: Context, mounts: list[dict[str, Any]], security: dict[str, Any]) -> list[dict[str, Any]]:
    """Preferred model cache: an init container (the engine image, its shell) that points MODEL_LINK at the
    node-local copy when it is complete and verified (its marker file), else at the pvc's checkpoint."""
    cache, pvc = ctx.cache, ctx.spec.model.source.pvc
    if cache is None or cache.required or pvc is None:
        return []
    fallback = f"{MODEL_MOUNT}/{pvc.sub_path.strip('/')}".rstrip("/") if pvc.sub_path else MODEL_MOUNT
    script = (
        f"if [ -f {CACHE_MOUNT}/{COMPLETE_MARKER} ]; then target={CACHE_MOUNT}; else target={fallback}; fi; "
        f'ln -sfn "$target" {MODEL_LINK} && echo "model: $target"'
    )
    return [
        {
            "name": "model-link",
            "image": ctx.plan.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", script],
            "volumeMounts": mounts,
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
            "securityContext": security,
        }
    ]


def cache_affinity(ctx: Context) -> dict[str, Any] | None:
    """Nodes whose copy is complete and verified carry `<cache label>=ready`: required or preferred."""
    if ctx.cache is None:
        return None
    expression = {"key": ctx.cache.node_label, "operator": "In", "values": ["ready"]}
    if ctx.cache.required:
        return {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expression]}]
            }
        }
    return {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [expression]}}
        ]
    }


def _with_cache_affinity(ctx: Context, where: dict[str, Any]) -> dict[str, Any]:
    extra = cache_affinity(ctx)
    if extra is None:
        return where
    node = dict(where.get("affinity", {}).get("nodeAffinity", {}))
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if "requiredDuringSchedulingIgnoredDuringExecution" in extra:
        ours = extra["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
        if required:  # terms are ORed: our expression goes into every one of them
            terms = [
                {**t, "matchExpressions": [*t.get("matchExpressions", []), *ours]}
                for t in required["nodeSelectorTerms"]
            ]
        else:
            terms = [{"matchExpressions": ours}]
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    else:
        node.update(extra)
    return {**where, "affinity": {**where.get("affinity", {}), "nodeAffinity": node}}


def _placement(ctx: Context) -> dict[str, Any]:
    """An engine pod's placement: the pool's, the model cache's nodes, and for a multi-node group one NVLink
    domain."""
    where = _with_cache_affinity(ctx, placement(ctx))
    domain = ctx.accelerator.nvlink_domain_label
    if ctx.multi_node and domain is not None:
        where["affinity"] = {**where.get("affinity", {}), "podAffinity": _same_nvlink_domain(ctx, domain)}
    return where


def _same_nvlink_domain(ctx: Context, domain_label: str) -> dict[str, Any]:
    """Every pod of one LWS group in one NVLink domain (GB200: one nvidia.com/gpu.clique), or multi-node NVLink
    cannot join them. A required pod affinity to the pods of this resource, narrowed by matchLabelKeys to the
    pod's own group: the apiserver adds `group-key In (<this pod's value>)` at creation (MatchLabelKeysInPodAffinity,
    beta and on by default since Kubernetes 1.31). The group's first pod matches itself, so it may start any
    clique; the others follow it. Not LWS's exclusive-topology annotation: its anti-affinity keeps every other
    group out of the clique, reserving a whole NVL72 rack per replica."""
    term = {
        "labelSelector": {"matchLabels": {NAME: ctx.name}},
        "matchLabelKeys": [LWS_GROUP_KEY],
        "topologyKey": domain_label,
    }
    return {"requiredDuringSchedulingIgnoredDuringExecution": [term]}


KEY_GUARD_SOURCE = "keyguard.py"


@cache
def key_guard_command() -> list[str]:
    """`python3 -c <m3fleet/keyguard.py>`: the engine image's Python runs it (it needs aiohttp only)."""
    source = resources.files("m3fleet").joinpath(KEY_GUARD_SOURCE).read_text(encoding="utf-8")
    return ["python3", "-c", literal(source)]


def key_guard_container(ctx: Context, guard: KeyGuard, engine: dict[str, Any]) -> dict[str, Any]:
    """The key guard beside the engine: the engine's image and port, the keys, and restricted's security context
    whatever the engine needs (it only proxies HTTP)."""
    env = [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for name, (secret, key) in sorted(guard.secret_env.items())
    ]
    return {
        "name": "key-guard",
        "image": ctx.plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": key_guard_command(),
        "args": [guard.config],
        **({"env": env} if env else {}),
        "ports": engine["ports"],
        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
            "runAsNonRoot": True,
            "runAsUser": NON_ROOT_UID,
            "runAsGroup": NON_ROOT_UID,
            "readOnlyRootFilesystem": True,
        },
    }


def user_mounts(ctx: Context) -> list[dict[str, Any]]:
    """spec.podTemplate.volumeMounts as the engine container carries them (empty fields left out)."""
    return [m.model_dump(by_alias=True, exclude_defaults=True) for m in ctx.spec.pod_template.volume_mounts]


def scheduling(ctx: Context) -> dict[str, str]:
    """spec.podTemplate's priorityClassName and schedulerName, on every engine pod (Volcano and the scheduler read
    them there); nothing when unset, so the cluster's defaults apply."""
    template = ctx.spec.pod_template
    fields = {"priorityClassName": template.priority_class_name, "schedulerName": template.scheduler_name}
    return {k: v for k, v in fields.items() if v}


# Volume sources Pod Security's restricted level admits (the others are baseline; hostPath is privileged).
RESTRICTED_VOLUME_SOURCES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)


def _user_volume_level(ctx: Context) -> PodSecurityLevel:
    sources = {k for volume in ctx.spec.pod_template.volumes for k in volume if k != "name"}
    if "hostPath" in sources:
        return PodSecurityLevel.PRIVILEGED
    return PodSecurityLevel.BASELINE if sources - RESTRICTED_VOLUME_SOURCES else PodSecurityLevel.RESTRICTED


def pod_template(
    ctx: Context, role: Role, container: Container, config: str | None, ssh_secret: str | None
) -> dict[str, Any]:
    """`config`: the digest of the engine-config ConfigMap's data when the pods mount it (None: no ConfigMap)."""
    volumes, mounts = _volumes(ctx, config is not None, ssh_secret)
    spec_container: dict[str, Any] = {
        "name": "engine",
        "image": ctx.plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": container.command,
        "args": container.args,
        "env": _env(ctx, container),
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in sorted(container.ports.items())],
        "resources": _resources(ctx),
        "volumeMounts": [*mounts, *user_mounts(ctx)],
        "securityContext": _security(ctx, container),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(DRAIN_SECONDS)]}}},
    }
    for kind in ("startup", "readiness", "liveness"):
        probe = _probe(getattr(container.probes, kind))
        if probe is not None:
            spec_container[f"{kind}Probe"] = probe
    init = model_link_init(ctx, mounts, spec_container["securityContext"])
    containers = [spec_container]
    if container.key_guard is not None:
        containers.append(key_guard_container(ctx, container.key_guard, spec_container))
        spec_container["ports"] = []  # the engine listens on 127.0.0.1 only: the port is the guard's
    pod_spec: dict[str, Any] = {
        **({"initContainers": init} if init else {}),
        "containers": containers,
        "volumes": [*volumes, *copy.deepcopy(ctx.spec.pod_template.volumes)],
        **_placement(ctx),
        **scheduling(ctx),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        **({"securityContext": _pod_security(ctx, container)} if not runs_as_root(ctx, container) else {}),
        "automountServiceAccountToken": False,  # engines never talk to the API server
        "enableServiceLinks": False,  # a Service named e.g. "vllm" would inject VLLM_PORT and confuse vLLM
    }
    if ctx.accelerator.nvlink_spans_nodes and ctx.multi_node:
        template = ctx.resource_name("compute-domain-channel")
        pod_spec["resourceClaims"] = [{"name": COMPUTE_DOMAIN_CLAIM, "resourceClaimTemplateName": template}]
    passthrough = ctx.spec.pod_template.metadata
    labels = {k: v for k, v in passthrough.labels.items() if role == Role.SINGLE or k != KUEUE_QUEUE_LABEL}
    metadata: dict[str, Any] = {"labels": {**labels, **pod_labels(ctx, role, container.serves_http)}}
    annotations: dict[str, str] = dict(passthrough.annotations)
    if config is not None:
        # A changed ConfigMap alone changes no pod (the kubelet only swaps the mounted files under running engines,
        # which read them at start): its digest in the template rolls the pods, as a changed flag would.
        annotations[CONFIG_DIGEST_ANNOTATION] = config
    if container.serves_http or container.exports_metrics:
        annotations.update(
            {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(ctx.engine.port),
                "prometheus.io/path": ctx.engine.metrics_path,
            }
        )
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}

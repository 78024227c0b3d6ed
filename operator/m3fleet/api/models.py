"""The `MiniMaxM3Deployment` custom resource (`m3fleet.dev/v1alpha1`) as pydantic models.

These models are the single source of truth: the CRD in `crds/` is generated from them
(`m3fleet crd`), the CLI and the operator parse user input through them, and every field's
description becomes the CRD's (and `kubectl explain`'s) documentation. Field names are a public
contract (see the architecture page): renaming one needs a new API version.

Rules that span several fields and belong at admission are CEL rules (`x-kubernetes-validations`)
declared next to the model they constrain, so the apiserver rejects them before the operator
ever sees them; the planner re-checks everything with a fuller explanation.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from m3fleet.api import children
from m3fleet.api.conditions import DEPLOYMENT, conditions_description
from m3fleet.api.rules import cel as cel  # also imported from here by api/cache.py

GROUP = "m3fleet.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MiniMaxM3Deployment"
PLURAL = "minimaxm3deployments"
SINGULAR = "minimaxm3deployment"
SHORT_NAMES = ("m3d",)
CATEGORIES = ("m3fleet",)

MAX_CONTEXT = 1_048_576
PARALLEL_SIZES = (0, 1, 2, 4, 8, 16, 32)
MAX_REPLICAS = 1024  # spec.replicas and autoscaling.maxReplicas
MAX_SURGE = 64


def invalid(problem: str, fix: str, field: str | None = None) -> PydanticCustomError:
    """A rejection by one of the model's own rules (the CRD's CEL rules, checked again for the CLI and the
    operator), carrying its fix; `field` names the camelCase field a model-level rule is about.
    m3fleet.api.parse turns it into `<field>: <problem>; fix: <fix>`."""
    ctx = {"problem": problem, "fix": fix, **({"field": field} if field else {})}
    return PydanticCustomError("m3fleet", "{problem}", ctx)


# --- metadata.name -------------------------------------------------------------------------
#
# Children are named after the resource: the workload `<name>` (Deployment or LeaderWorkerSet), the
# Service `<name>-api`, `<name>-engine-config`, `<name>-compute-domain(-channel)`, `<name>-mpi-ssh`, and
# the label value `<name>`. The LeaderWorkerSet controller then names its headless Service `<name>`
# (a DNS-1035 label, which its webhook enforces), the leader StatefulSet `<name>`, one worker
# StatefulSet per group `<name>-<group>` and pods `<name>-<group>-<worker>`. A StatefulSet's pods carry
# `controller-revision-hash: <statefulset>-<hash of up to 10 characters>`, a label value (<= 63), so a
# StatefulSet name must fit 52: `<name>-<group>` with groups up to MAX_REPLICAS + MAX_SURGE - 1 (4
# digits) leaves 47 for the name. 45 keeps 2 characters of margin (groups up to 999,999).
STATEFULSET_NAME_MAX = 63 - len("-") - 10
MAX_NAME_LENGTH = 45
NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"  # DNS-1035 label: the Services <name> and <name>-api
NAME_LENGTH_PROBLEM = (
    f"is longer than {MAX_NAME_LENGTH} characters: the LeaderWorkerSet controller names a StatefulSet "
    "<name>-<replica index> for each multi-node replica, and its controller-revision-hash label "
    f"(<statefulset>-<10-character hash>) must fit in 63 characters"
)
NAME_LENGTH_FIX = f"use a name of at most {MAX_NAME_LENGTH} characters"
NAME_FORMAT_PROBLEM = (
    "must start with a lowercase letter, end with a letter or digit and contain only lowercase letters, "
    "digits and '-' (no dots): the engine's Service <name>-api and the LeaderWorkerSet's headless "
    "Service <name> must be DNS-1035 labels"
)
NAME_FORMAT_FIX = "rename it, e.g. m3-chat"
# Rules on the whole resource, at the CRD's root (m3fleet.api.crd builds it), where CEL may read
# metadata.name; ObjectMeta below checks the same for the CLI and the operator.
RESOURCE_VALIDATIONS: list[dict[str, Any]] = [
    cel(
        f"self.metadata.name.matches('{NAME_PATTERN}')",
        f"metadata.name {NAME_FORMAT_PROBLEM}; fix: {NAME_FORMAT_FIX}",
        ".metadata.name",
    ),
    cel(
        f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        f"metadata.name {NAME_LENGTH_PROBLEM}; fix: {NAME_LENGTH_FIX}",
        ".metadata.name",
    ),
]


class CamelModel(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )


class Variant(StrEnum):
    BF16 = "bf16"
    MXFP8 = "mxfp8"
    MXFP4 = "mxfp4"


class EngineName(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


class Accelerator(StrEnum):
    H200 = "h200"
    GB200 = "gb200"
    MI355X = "mi355x"


class MoeBackend(StrEnum):
    AUTO = "auto"
    AITER = "aiter"
    EMULATION = "emulation"


class Strategy(StrEnum):
    AUTO = "auto"
    TP = "tp"
    TP_EP = "tp-ep"
    DP_EP = "dp-ep"


class KvCacheDtype(StrEnum):
    AUTO = "auto"
    BF16 = "bf16"
    FP8 = "fp8"


class AutoscalingMode(StrEnum):
    ACT = "act"
    ADVISORY = "advisory"


# --- spec.model ---------------------------------------------------------------------------


class PvcSource(CamelModel):
    claim_name: str = Field(
        min_length=1,
        max_length=253,
        description="PersistentVolumeClaim holding the checkpoint.",
        json_schema_extra=children.name_rules("claimName"),
    )
    sub_path: str = Field(
        default="",
        max_length=1024,
        description="Directory inside the claim that holds the checkpoint (relative, no '..').",
        json_schema_extra=children.sub_path_rules(),
    )


class SecretKeyRef(CamelModel):
    name: str = Field(
        min_length=1,
        max_length=253,
        description="Secret in the resource's namespace.",
        json_schema_extra=children.name_rules("name"),
    )
    key: str = Field(
        default="token",
        min_length=1,
        max_length=253,
        description="Key inside the Secret.",
        json_schema_extra=children.key_rules("key"),
    )


class HuggingFaceSource(CamelModel):
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret with a Hugging Face token, passed to the engine as HF_TOKEN via secretKeyRef "
        "(the operator never reads it).",
    )
    cache_claim_name: str = Field(
        min_length=1,
        max_length=253,
        description="PersistentVolumeClaim mounted as the Hugging Face cache (HF_HOME), so the weights are "
        "downloaded once and shared; ReadWriteMany when more than one pod mounts it. Never deleted by "
        "the operator.",
        json_schema_extra=children.name_rules("cacheClaimName"),
    )


class ModelSource(CamelModel):
    """Where the weights are: exactly one of `pvc` or `huggingFace`."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.pvc) != has(self.huggingFace)",
                    "model.source needs exactly one of pvc and huggingFace; fix: set one of them: pvc (weights on a "
                    "volume) or huggingFace (downloaded at start)",
                )
            ]
        }
    )
    pvc: PvcSource | None = Field(default=None, description="Serve the checkpoint from a volume claim.")
    hugging_face: HuggingFaceSource | None = Field(
        default=None, description="Download the checkpoint from Hugging Face into a cache claim."
    )


class NodeAffinityMode(StrEnum):
    REQUIRED = "Required"
    PREFERRED = "Preferred"


class ModelCacheRef(CamelModel):
    """A MiniMaxM3ModelCache in the resource's namespace whose node-local copy the engine pods mount."""

    name: str = Field(
        min_length=1,
        max_length=63,
        description="The MiniMaxM3ModelCache (same namespace).",
        json_schema_extra=children.name_rules("name"),
    )
    node_affinity: NodeAffinityMode = Field(
        default=NodeAffinityMode.REQUIRED,
        description="Required: pods run only on nodes holding a verified copy and mount it. Preferred: pods "
        "prefer those nodes and mount the copy there, else load from spec.model.source (a pvc).",
    )


CACHE_PREFERRED_PROBLEM = (
    "is Preferred, but a pod on a node without the copy falls back to spec.model.source, which must then be a pvc "
    "(a Hugging Face source has no directory to fall back to)"
)
CACHE_PREFERRED_FIX = "use nodeAffinity Required, or a pvc source"


class ModelSpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.cacheRef) || self.cacheRef.nodeAffinity != 'Preferred' || has(self.source.pvc)",
                    f"cacheRef.nodeAffinity {CACHE_PREFERRED_PROBLEM}; fix: {CACHE_PREFERRED_FIX}",
                    ".cacheRef.nodeAffinity",
                )
            ]
        }
    )
    variant: Variant = Field(default=Variant.BF16, description="Checkpoint precision: bf16, mxfp8 or mxfp4.")
    checkpoint: str = Field(
        default="",
        max_length=512,
        description="Checkpoint id or path; empty means the variant's default (MiniMaxAI/MiniMax-M3, "
        "MiniMaxAI/MiniMax-M3-MXFP8, amd/MiniMax-M3-MXFP4).",
        json_schema_extra=children.no_dot_dot_rules("checkpoint"),
    )
    source: ModelSource = Field(description="Where the weights are.")
    language_model_only: bool = Field(
        default=False, description="Skip the vision encoder (text-only serving; frees GPU memory)."
    )
    cache_ref: ModelCacheRef | None = Field(
        default=None,
        description="Serve from the node-local copy a MiniMaxM3ModelCache staged (mounted read-only) instead of "
        "reading spec.model.source at start.",
    )


# --- spec.engine ----------------------------------------------------------------------------


class ObjectKeySelector(CamelModel):
    """corev1 SecretKeySelector / ConfigMapKeySelector."""

    name: str = Field(
        max_length=253,
        description="Secret or ConfigMap in the resource's namespace.",
        json_schema_extra=children.name_rules("name"),
    )
    key: str = Field(max_length=253, description="Key inside it.", json_schema_extra=children.key_rules("key"))
    optional: bool | None = Field(default=None, description="Start the pod even when the key is missing.")


FIELD_PATH_PATTERN = (  # backslashes doubled: the pattern sits in a CEL string literal
    r"^(metadata[.](name|namespace|uid)|metadata[.](labels|annotations)\\[.+\\]"
    r"|spec[.](nodeName|serviceAccountName)|status[.](hostIP|hostIPs|podIP|podIPs))$"
)
RESOURCE_FIELD_PATTERN = "^(limits|requests)[.](cpu|memory|ephemeral-storage|hugepages-[-a-zA-Z0-9]+)$"


class ObjectFieldSelector(CamelModel):
    api_version: str | None = Field(default=None, max_length=64, description="v1.")
    field_path: str = Field(
        max_length=256,
        description="A pod field the kubelet can expose (metadata.name, metadata.labels['k'], status.podIP, ...).",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.matches('{FIELD_PATH_PATTERN}')",
                    "fieldPath is not a pod field the kubelet exposes to env; fix: use metadata.name, "
                    "metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'], "
                    "spec.nodeName, spec.serviceAccountName, status.hostIP(s) or status.podIP(s)",
                )
            ]
        },
    )


class ResourceFieldSelector(CamelModel):
    container_name: str | None = Field(default=None, max_length=63, description="The engine container (default).")
    resource: str = Field(
        max_length=128,
        pattern=RESOURCE_FIELD_PATTERN,
        description="limits.cpu, limits.memory, limits.ephemeral-storage, requests.* or *.hugepages-<size>.",
    )
    divisor: str | None = Field(default=None, max_length=64, description='A quantity, quoted (e.g. "1Mi").')


class EnvVarSource(CamelModel):
    """corev1 EnvVarSource, exactly one of its fields (typed here so a broken reference is refused at admission)."""

    model_config = ConfigDict(
        json_schema_extra={
            "minProperties": 1,
            "x-kubernetes-validations": [
                cel(
                    "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), "
                    "has(self.resourceFieldRef)].filter(x, x).size() == 1",
                    "valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef and resourceFieldRef; "
                    "fix: keep one of them",
                )
            ],
        }
    )
    secret_key_ref: ObjectKeySelector | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: ObjectKeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(default=None, description="A resource of the container.")


class EnvVar(CamelModel):
    """A corev1 EnvVar."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.valueFrom) || !has(self.value) || self.value == ''",
                    "value and valueFrom are both set; fix: keep one of them",
                )
            ]
        }
    )
    name: str = Field(
        min_length=1,
        max_length=256,
        description="Environment variable name.",
        json_schema_extra=children.env_name_rules(),
    )
    value: str | None = Field(default=None, max_length=32768, description="Literal value.")
    value_from: EnvVarSource | None = Field(
        default=None, description="corev1 EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef)."
    )


class EngineSpec(CamelModel):
    name: EngineName = Field(default=EngineName.VLLM, description="Serving engine: vllm, sglang or trtllm.")
    image: str = Field(
        default="",
        max_length=512,
        description="Engine image; empty means the catalog's versioned default for this engine and "
        "accelerator. Pin by digest in production.",
        json_schema_extra=children.image_rules("image"),
    )
    moe_backend: MoeBackend = Field(
        default=MoeBackend.AUTO,
        description="MoE kernel backend for MXFP4 on AMD: aiter (fast, needs an image with the AITER MXFP4 "
        "MoE path), emulation (works on current images), or auto (what the pinned image supports).",
    )
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=64,
        description="Arguments appended after the rendered ones. Flags the plan owns (parallel sizes, "
        "block size, max model length, parsers, memory fraction) are rejected.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment variables for the engine container. Variables that change how the "
        "engine is executed (BASH_ENV, ENV, PATH, LD_*, PYTHONPATH, OMPI_*, "
        "VLLM_LOGGING_CONFIG_PATH, VLLM_PLUGINS, ...) and those m3fleet sets "
        "(HOME, HF_HOME, HF_TOKEN, LWS_*, the engine's rendered variables) are rejected.",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the API key the OpenAI-compatible endpoint requires (Authorization: "
        "Bearer <key>). vLLM reads it from VLLM_API_KEY; SGLang never holds it: the key-guard container in front "
        "of it enforces it. Only env from the Secret, never a command line or a ConfigMap. Not supported by trtllm.",
    )
    admin_api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="SGLang only: Secret key holding the key of SGLang's admin endpoints (flush_cache, "
        "update_weights_*, profiling, ...), enforced by the key-guard container (SGLang never holds it). Without it "
        "the admin endpoints answer no one.",
    )


TRTLLM_API_KEY_PROBLEM = "is not supported by engine trtllm: the pinned trtllm-serve has no API key option"
TRTLLM_API_KEY_FIX = "use engine vllm or sglang, or remove it and put an authenticating gateway in front"
ADMIN_KEY_PROBLEM = "applies to engine sglang only (its admin endpoints)"
ADMIN_KEY_FIX = "remove it"


# --- placement, parallelism, context ---------------------------------------------------------


class PodResourcesSpec(CamelModel):
    cpu: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="CPU cores each engine pod requests; 0 means the catalog's size for the accelerator "
        "(per GPU the pod holds). No CPU limit is set: a CFS quota would throttle the engine's host threads.",
    )
    memory_gib: int = Field(
        default=0,
        ge=0,
        le=16384,
        alias="memoryGiB",
        description="Memory (GiB) each engine pod requests and is limited to; 0 means the catalog's size for the "
        "accelerator. It also holds the memory-backed /dev/shm (32Gi), so at least 64.",
    )


class NodePoolSpec(CamelModel):
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Extra node labels, merged with the accelerator's own.",
        json_schema_extra=children.label_map_rules("nodeSelector"),
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=32,
        description="corev1 Tolerations for the engine pods.",
        json_schema_extra={"items": children.toleration_schema()},
    )
    extra_resources: dict[str, int] = Field(
        default_factory=dict,
        description='Extra per-pod resources, e.g. {"rdma/ib": 1}; adds the IPC_LOCK capability RDMA needs.',
    )
    resources: PodResourcesSpec = Field(
        default_factory=PodResourcesSpec,
        description="CPU and memory of each engine pod; zeros take the catalog's size for the accelerator.",
    )


class ParallelismSpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.tensorParallelSize in {list(PARALLEL_SIZES)}",
                    "tensorParallelSize must be one of 0 (planner decides), 1, 2, 4, 8, 16, 32; fix: leave it 0 and "
                    "let the planner choose, or pick one of those",
                    ".tensorParallelSize",
                ),
                cel(
                    f"self.dataParallelSize in {list(PARALLEL_SIZES)}",
                    "dataParallelSize must be one of 0 (planner decides), 1, 2, 4, 8, 16, 32; fix: leave it 0 and let "
                    "the planner choose, or pick one of those",
                    ".dataParallelSize",
                ),
            ]
        }
    )
    strategy: Strategy = Field(
        default=Strategy.AUTO,
        description="auto (= tp), tp (tensor parallel), tp-ep (TP with expert parallel MoE), "
        "dp-ep (attention data parallel with expert parallel MoE).",
    )
    tensor_parallel_size: int = Field(default=0, ge=0, le=32, description="TP size; 0 lets the planner decide.")
    data_parallel_size: int = Field(
        default=0, ge=0, le=32, description="DP size (dp-ep only); 0 lets the planner decide."
    )


class ContextSpec(CamelModel):
    max_model_len: int = Field(
        default=131072,
        ge=1,
        le=MAX_CONTEXT,
        description="Longest prompt + output served, in tokens (up to 1048576).",
    )
    kv_cache_dtype: KvCacheDtype = Field(
        default=KvCacheDtype.AUTO,
        description="KV-cache dtype: bf16, fp8 (~1.5x the KV pool), or auto (bf16 unless fp8 fits the "
        "context on fewer GPUs).",
    )
    min_sequences_at_max_len: int = Field(
        default=1, ge=1, le=4096, description="The plan must hold at least this many full-length sequences."
    )


ROLLOUT_STUCK_PROBLEM = (
    "must be at least 1 when rollout.maxSurge is 0: otherwise a rollout can neither add a replica nor take "
    "one down (the apiserver rejects such a Deployment or LeaderWorkerSet)"
)
ROLLOUT_STUCK_FIX = "set maxUnavailable to 1 (replace replicas in place) or maxSurge to 1 (needs a spare GPU node)"


class NetworkSpec(CamelModel):
    """Who may reach the engine pods: a NetworkPolicy rendered per resource (ingress only)."""

    ingress_policy: bool = Field(
        default=True,
        description="Render a NetworkPolicy that admits only this namespace's pods to the API port, the "
        "metricsFrom peers to the API/metrics port, and the resource's own pods on every port (multi-node "
        "groups). false: render none (the namespace's own policies apply).",
    )
    allow_from: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=32,
        description="Extra NetworkPolicyPeers (podSelector, namespaceSelector, ipBlock) admitted to the API port, "
        "e.g. an ingress gateway's namespace.",
        json_schema_extra={"items": children.network_peer_schema()},
    )
    metrics_from: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        max_length=32,
        description="NetworkPolicyPeers admitted to the metrics port (the engine serves metrics on its API port): "
        "Prometheus. Default: every pod of the namespace named monitoring.",
        json_schema_extra={"items": children.network_peer_schema()},
    )


class RolloutSpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.maxSurge > 0 || self.maxUnavailable > 0",
                    f"rollout.maxUnavailable {ROLLOUT_STUCK_PROBLEM}; fix: {ROLLOUT_STUCK_FIX}",
                    ".maxUnavailable",
                )
            ]
        }
    )
    max_surge: int = Field(
        default=0,
        ge=0,
        le=MAX_SURGE,
        description="Extra replicas during a rollout; 0 needs no spare GPU nodes (a replica is replaced in place).",
    )
    max_unavailable: int = Field(
        default=1,
        ge=0,
        le=64,
        description="Replicas that may be unavailable during a rollout; at least 1 when maxSurge is 0.",
    )


# --- autoscaling -----------------------------------------------------------------------------


# Only an http(s) base URL with a host: no file:, gopher: or other schemes, no spaces (RE2 and Python agree).
PROMETHEUS_URL_PATTERN = r"^https?://[^\t\n\v\f\r /?#@]+(/[^\t\n\v\f\r ?#]*)?$"
PROMETHEUS_URL_PROBLEM = (
    "must be an http:// or https:// base URL with a host and an optional path (no other scheme, no user "
    "name, no query or fragment)"
)
PROMETHEUS_URL_FIX = "give Prometheus's base URL, e.g. https://prometheus-operated.monitoring:9090"
CA_AND_INSECURE_PROBLEM = "sets both caSecretRef and insecureSkipVerify: a CA is pointless when nothing is verified"
CA_AND_INSECURE_FIX = "keep caSecretRef (verify against that CA) and drop insecureSkipVerify"
CA_WITHOUT_TLS_PROBLEM = "sets caSecretRef or insecureSkipVerify for an http:// URL, which uses no TLS"
CA_WITHOUT_TLS_FIX = "use an https:// URL, or drop caSecretRef/insecureSkipVerify"


class CaSecretKeyRef(SecretKeyRef):
    key: str = Field(
        default="ca.crt",
        min_length=1,
        max_length=253,
        description="Key holding the PEM CA bundle (ca.crt).",
        json_schema_extra=children.key_rules("key"),
    )


class PrometheusSpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.url == '' || self.url.matches('{PROMETHEUS_URL_PATTERN.replace(chr(92), chr(92) * 2)}')",
                    f"url {PROMETHEUS_URL_PROBLEM}; fix: {PROMETHEUS_URL_FIX}",
                    ".url",
                ),
                cel(
                    "!has(self.caSecretRef) || !has(self.insecureSkipVerify) || !self.insecureSkipVerify",
                    f"prometheus {CA_AND_INSECURE_PROBLEM}; fix: {CA_AND_INSECURE_FIX}",
                    ".insecureSkipVerify",
                ),
                cel(
                    "!(has(self.caSecretRef) || (has(self.insecureSkipVerify) && self.insecureSkipVerify)) "
                    "|| !has(self.url) || !self.url.startsWith('http://')",
                    f"prometheus {CA_WITHOUT_TLS_PROBLEM}; fix: {CA_WITHOUT_TLS_FIX}",
                    ".url",
                ),
            ]
        }
    )
    url: str = Field(
        default="",
        max_length=1024,
        description="Prometheus base URL, http:// or https://, e.g. https://prometheus-operated.monitoring:9090. "
        "https is verified against the system CAs, or caSecretRef. Only the status code of a failed answer is "
        "reported, never its body.",
    )
    ca_secret_ref: CaSecretKeyRef | None = Field(
        default=None,
        description="Secret (and key, default ca.crt) holding the PEM CA that signed Prometheus's certificate; "
        "read by the operator when it queries Prometheus.",
    )
    insecure_skip_verify: bool = Field(
        default=False,
        description="Do not verify Prometheus's TLS certificate (testing only: anyone on the path can answer). "
        "The operator posts an InsecureSkipVerify warning Event.",
    )
    rate_window_seconds: int = Field(
        default=60,
        ge=10,
        le=900,
        description="Window of the rates read from Prometheus (rate(...[w])). It must hold at least two scrapes of "
        "each engine pod: keep it at 4x the scrape interval or more (60 for the chart's 15 s PodMonitor, 240 for "
        "Prometheus's default 1-minute interval). Longer windows see a burst later.",
    )
    query_overrides: dict[str, str] = Field(
        default_factory=dict, description="PromQL per signal name, replacing the engine adapter's query."
    )


class AutoscalingTarget(CamelModel):
    kv_cache_utilization: float = Field(
        default=0.8,
        gt=0.0,
        le=1.0,
        description="Share of each replica's KV-cache tokens the policy plans to use.",
    )


class ScaleUpBehavior(CamelModel):
    stabilization_window_seconds: int = Field(
        default=0, ge=0, le=3600, description="Lowest recommendation over this window wins when scaling up."
    )


class ScaleDownBehavior(CamelModel):
    stabilization_window_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="Highest recommendation over this window wins when scaling down.",
    )
    max_replicas_per_step: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "Most replicas removed in one step. Unset: one, and every replica the need no longer wants at once "
            "when a burst's long prompts stopped arriving and no request waits."
        ),
    )


class AutoscalingBehavior(CamelModel):
    scale_up: ScaleUpBehavior = Field(default_factory=ScaleUpBehavior, description="Scale-up behaviour.")
    scale_down: ScaleDownBehavior = Field(default_factory=ScaleDownBehavior, description="Scale-down behaviour.")


MIN_REPLICAS_PROBLEM = (
    "must be at least 1: at zero replicas no engine exports the metrics a scale-up needs (m3fleet reads no "
    "gateway queue), so an idle fleet would stay at zero and its requests would wait forever"
)
MIN_REPLICAS_FIX = "set minReplicas to 1 or more (scale to zero is not supported)"
WINDOW_BOUNDS_PROBLEM = "has a window whose minReplicas exceeds its maxReplicas"
WINDOW_BOUNDS_FIX = "lower that window's minReplicas or raise its maxReplicas"
WINDOW_EMPTY_PROBLEM = "has a window with neither minReplicas nor maxReplicas: it would change nothing"
WINDOW_EMPTY_FIX = "give the window a minReplicas and/or a maxReplicas"
WINDOW_LENGTH_PROBLEM = "has a window whose end equals its start: it would be empty"
WINDOW_LENGTH_FIX = "give an end other than the start (an end before the start runs past midnight)"
HHMM_PATTERN = "^([01][0-9]|2[0-3]):[0-5][0-9]$"


class Weekday(StrEnum):
    MON = "mon"
    TUE = "tue"
    WED = "wed"
    THU = "thu"
    FRI = "fri"
    SAT = "sat"
    SUN = "sun"


class ScheduleWindowSpec(CamelModel):
    name: str = Field(max_length=63, description="A name for the window, shown in status.autoscaling when it applies.")
    start: str = Field(pattern=HHMM_PATTERN, max_length=5, description="Start time of day, HH:MM in UTC.")
    end: str = Field(
        pattern=HHMM_PATTERN,
        max_length=5,
        description="End time of day, HH:MM in UTC (exclusive); before start = past midnight.",
    )
    days: list[Weekday] = Field(
        default_factory=list, max_length=7, description="Days the window starts on (mon..sun); empty = every day."
    )
    min_replicas: int = Field(
        default=0, ge=0, le=MAX_REPLICAS, description="Fewest replicas while the window is active; 0 = the spec's."
    )
    max_replicas: int = Field(
        default=0, ge=0, le=MAX_REPLICAS, description="Most replicas while the window is active; 0 = the spec's."
    )


class ForecastSpec(CamelModel):
    enabled: bool = Field(
        default=True,
        description="Hold a floor of the replicas this resource needed at the same time in each of the last "
        "two periods (its own recorded history); never the only input.",
    )
    period_seconds: int = Field(
        default=86400, ge=3600, le=604800, description="The period traffic repeats with (86400 = daily)."
    )
    margin_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="How much earlier than one time-to-ready the floor rises: a peak does not come back at the "
        "same second every period.",
    )


PROMETHEUS_METRIC_PATTERN = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
PROMETHEUS_LABEL_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
GATEWAY_LABEL_PROBLEM = "has a label name that is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"
GATEWAY_LABEL_FIX = "use the label names the gateway's series carry, e.g. model_name"


class GatewaySpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.matchLabels.all(k, k.matches('{PROMETHEUS_LABEL_PATTERN}'))",
                    f"gateway.matchLabels {GATEWAY_LABEL_PROBLEM}; fix: {GATEWAY_LABEL_FIX}",
                    ".matchLabels",
                )
            ]
        }
    )
    request_sizes_metric: str = Field(
        default="inference_objective_request_sizes",
        max_length=200,
        pattern=PROMETHEUS_METRIC_PATTERN,
        description="Histogram of request sizes in bytes that the gateway records when a request arrives: the "
        "Gateway API Inference Extension's (llm-d's) endpoint picker exports inference_objective_request_sizes "
        "(inference_model_request_sizes before v1.0).",
    )
    match_labels: dict[str, str] = Field(
        min_length=1,
        max_length=8,
        description="Label values selecting this fleet's requests among the gateway's series, e.g. "
        "{model_name: MiniMaxAI/MiniMax-M3} (the model name clients send).",
    )


class AutoscalingSpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.minReplicas <= self.maxReplicas",
                    "autoscaling.minReplicas must not exceed autoscaling.maxReplicas; fix: lower minReplicas or raise "
                    "maxReplicas",
                    ".minReplicas",
                ),
                cel(
                    "self.minReplicas >= 1",
                    f"minReplicas {MIN_REPLICAS_PROBLEM}; fix: {MIN_REPLICAS_FIX}",
                    ".minReplicas",
                ),
                cel(
                    "!has(self.schedule) || self.schedule.all(w, "
                    "w.minReplicas == 0 || w.maxReplicas == 0 || w.minReplicas <= w.maxReplicas)",
                    f"schedule {WINDOW_BOUNDS_PROBLEM}; fix: {WINDOW_BOUNDS_FIX}",
                    ".schedule",
                ),
                cel(
                    "!has(self.schedule) || self.schedule.all(w, w.minReplicas > 0 || w.maxReplicas > 0)",
                    f"schedule {WINDOW_EMPTY_PROBLEM}; fix: {WINDOW_EMPTY_FIX}",
                    ".schedule",
                ),
                cel(
                    "!has(self.schedule) || self.schedule.all(w, w.end != w.start)",
                    f"schedule {WINDOW_LENGTH_PROBLEM}; fix: {WINDOW_LENGTH_FIX}",
                    ".schedule",
                ),
            ]
        }
    )
    enabled: bool = Field(default=False, description="Scale replicas on token and KV-cache demand.")
    mode: AutoscalingMode = Field(
        default=AutoscalingMode.ACT, description="act (apply decisions) or advisory (decide and report only)."
    )
    min_replicas: int = Field(
        default=1, ge=0, le=MAX_REPLICAS, description="Fewest replicas; at least 1 (no scale to zero)."
    )
    max_replicas: int = Field(default=4, ge=1, le=MAX_REPLICAS, description="Most replicas.")
    interval_seconds: int = Field(default=15, ge=5, le=3600, description="Seconds between decisions.")
    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec, description="Where engine metrics are read.")
    target: AutoscalingTarget = Field(default_factory=AutoscalingTarget, description="Utilisation targets.")
    tolerance: float = Field(
        default=0.1, ge=0.0, le=1.0, description="No change while demand/capacity is within this share of 1."
    )
    behavior: AutoscalingBehavior = Field(
        default_factory=AutoscalingBehavior, description="Stabilization and step limits (HPA vocabulary)."
    )
    panic_threshold: float = Field(
        default=2.0,
        ge=1.0,
        le=10.0,
        description="Demand at this multiple of ready capacity scales up at once and holds scale-down.",
    )
    cold_start_seconds: int = Field(
        default=600,
        ge=0,
        le=7200,
        description="Expected pod-create-to-ready time; measured values take over.",
    )
    schedule: list[ScheduleWindowSpec] = Field(
        default_factory=list,
        max_length=16,
        description="Known peaks: daily UTC windows that raise minReplicas and/or set maxReplicas while active.",
    )
    forecast: ForecastSpec = Field(
        default_factory=ForecastSpec, description="A floor from this resource's own need in earlier periods."
    )
    gateway: GatewaySpec | None = Field(
        default=None,
        description="An inference gateway in front of the fleet whose request sizes, read from the same Prometheus "
        "when requests arrive, size a burst of long prompts before any engine has prefilled one.",
    )


# --- the resource ----------------------------------------------------------------------------


class MiniMaxM3DeploymentSpec(CamelModel):
    # Combinations the engines do not serve: Forbidden (kubectl prints "spec.<field>: Forbidden: <message>").
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.model.variant != 'mxfp4' || self.accelerator == 'mi355x'",
                    "model.variant mxfp4 (amd/MiniMax-M3-MXFP4) runs only on accelerator mi355x; fix: use variant "
                    "mxfp8 or bf16 here, or accelerator mi355x",
                    ".model.variant",
                    "FieldValueForbidden",
                ),
                cel(
                    "self.engine.name != 'trtllm' || self.accelerator in ['h200', 'gb200']",
                    "engine trtllm runs only on NVIDIA accelerators (h200, gb200); fix: use engine vllm or sglang on "
                    "mi355x, or accelerator h200 or gb200",
                    ".engine.name",
                    "FieldValueForbidden",
                ),
                cel(
                    "self.engine.name != 'trtllm' || !has(self.engine.apiKeySecretRef)",
                    f"engine.apiKeySecretRef {TRTLLM_API_KEY_PROBLEM}; fix: {TRTLLM_API_KEY_FIX}",
                    ".engine.apiKeySecretRef",
                    "FieldValueForbidden",
                ),
                cel(
                    "self.engine.name == 'sglang' || !has(self.engine.adminApiKeySecretRef)",
                    f"engine.adminApiKeySecretRef {ADMIN_KEY_PROBLEM}; fix: {ADMIN_KEY_FIX}",
                    ".engine.adminApiKeySecretRef",
                    "FieldValueForbidden",
                ),
                cel(
                    "self.engine.name != 'trtllm' || self.model.variant == 'bf16'",
                    "the pinned TensorRT-LLM release serves MiniMax-M3 in bf16 only; fix: use variant bf16, or engine "
                    "vllm or sglang for the other variants",
                    ".model.variant",
                    "FieldValueForbidden",
                ),
            ]
        }
    )
    model: ModelSpec = Field(description="Which MiniMax-M3 checkpoint to serve and where its weights are.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="Serving engine and its overrides.")
    accelerator: Accelerator = Field(default=Accelerator.H200, description="GPU pool: h200, gb200 or mi355x.")
    node_pool: NodePoolSpec = Field(default_factory=NodePoolSpec, description="Extra placement for the pool.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Parallel layout; zeros let the planner decide."
    )
    context: ContextSpec = Field(default_factory=ContextSpec, description="Context length and KV cache.")
    replicas: int = Field(
        default=1, ge=0, le=MAX_REPLICAS, description="Engine replicas (each may span nodes); the scale subresource."
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="How replicas are replaced on change.")
    network: NetworkSpec = Field(
        default_factory=NetworkSpec, description="Who may reach the engine pods (a NetworkPolicy)."
    )
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="Context-length-aware autoscaling from Prometheus."
    )


class Plan(CamelModel):
    """The planner's answer, as `status.plan` and `m3fleet plan -o json` show it."""

    engine: EngineName = Field(description="Engine.")
    accelerator: Accelerator = Field(description="Accelerator.")
    variant: Variant = Field(description="Checkpoint variant.")
    checkpoint: str = Field(description="Checkpoint id served.")
    image: str = Field(description="Engine image.")
    strategy: Strategy = Field(description="Resolved strategy (never auto).")
    tensor_parallel_size: int = Field(description="Engine TP size.")
    data_parallel_size: int = Field(description="Engine DP size; world size = TP x DP x PP.")
    pipeline_parallel_size: int = Field(
        default=1, description="Pipeline stages (one per node when a replica spans nodes without NVLink between them)."
    )
    expert_parallel_size: int = Field(
        description="Ranks the routed experts of one stage are sharded over (TP x DP with EP, 1 without)."
    )
    gpus_per_node: int = Field(description="GPUs each pod requests.")
    gpus_per_replica: int = Field(description="GPUs in one replica.")
    nodes_per_replica: int = Field(description="Pods (one per node) in one replica.")
    cpu_per_pod: int = Field(default=0, description="CPU cores each engine pod requests.")
    memory_gib_per_pod: int = Field(
        default=0, alias="memoryGiBPerPod", description="Memory (GiB) each engine pod requests and is limited to."
    )
    gpu_memory_utilization: float = Field(description="Share of GPU memory the engine may use.")
    max_model_len: int = Field(description="Context served.")
    native_max_model_len: int = Field(description="The checkpoint's native context.")
    kv_cache_dtype: KvCacheDtype = Field(description="KV dtype chosen.")
    rope_scaling_factor: float = Field(description="YaRN factor (1 when none).")
    weights_gib_per_gpu: float = Field(alias="weightsGiBPerGPU", description="Weights resident on each GPU.")
    kv_cache_gib_per_gpu: float = Field(alias="kvCacheGiBPerGPU", description="KV-cache budget on each GPU.")
    kv_bytes_per_token_per_gpu: int = Field(
        alias="kvBytesPerTokenPerGPU", description="KV bytes one token costs on each GPU that holds it."
    )
    kv_cache_tokens_per_rank: int = Field(description="KV tokens one rank (DP rank or TP group) holds.")
    kv_cache_tokens_per_replica: int = Field(description="KV tokens one replica holds.")
    max_sequences_at_max_len: int = Field(description="Full-length sequences the replica holds at once.")
    validated: bool = Field(description="The shape equals a published recipe's.")
    notes: list[str] = Field(default_factory=list, max_length=32, description="Assumptions and warnings.")
    model_cache: str | None = Field(
        default=None, description="MiniMaxM3ModelCache the weights come from (absent: spec.model.source)."
    )
    model_cache_node_affinity: NodeAffinityMode | None = Field(
        default=None, description="Required or Preferred: how pods are placed on nodes holding the cache."
    )


class Condition(CamelModel):
    """metav1.Condition."""

    type: str = Field(max_length=316, description="Condition type (the list's description names each).")
    status: str = Field(description="True, False or Unknown.", json_schema_extra={"enum": ["True", "False", "Unknown"]})
    observed_generation: int = Field(default=0, ge=0, description="Generation the condition was set for.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    reason: str = Field(max_length=1024, description="One-word CamelCase category.")
    message: str = Field(default="", max_length=32768, description="Human-readable detail.")


class PhaseSummary(CamelModel):
    """One phase over the measured window."""

    p50_seconds: float | None = Field(default=None, description="Median seconds.")
    p90_seconds: float | None = Field(default=None, description="90th percentile seconds.")
    last_seconds: float | None = Field(default=None, description="Seconds for the last replica measured.")
    samples: int = Field(default=0, description="Replicas in the window this phase is known for.")


class StartupPhases(CamelModel):
    """Where a new replica's time goes (see autoscaling/readiness.py for what each phase is read from)."""

    schedule: PhaseSummary | None = Field(default=None, description="Pod created -> PodScheduled.")
    image: PhaseSummary | None = Field(
        default=None, description="Scheduled -> the kubelet's Pulled event (image pulled or already present)."
    )
    start: PhaseSummary | None = Field(default=None, description="Image ready (or scheduled) -> containers started.")
    load: PhaseSummary | None = Field(default=None, description="Containers started -> Ready (weights, engine init).")


class StartupSample(CamelModel):
    """One measured replica."""

    replica: str = Field(max_length=253, description="The replica's pod (a multi-node group's leader).")
    id: str = Field(max_length=64, description="The leader pod's uid: a replica is measured once.")
    uids: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list, max_length=64, description="Every pod of the replica."
    )
    ready_at: str = Field(description="When the replica became ready (RFC 3339).")
    seconds: float = Field(description="Created -> ready.")
    phases: dict[str, float | None] = Field(default_factory=dict, description="Seconds per phase (null: not known).")
    restarts: int = Field(default=0, description="Container restarts before ready.")
    image_present: bool | None = Field(default=None, description="The image was already on the node.")
    pull_seconds: float | None = Field(default=None, description="The image pull itself, as the kubelet reported it.")


class TimeToReadyStatus(CamelModel):
    """Time-to-ready measured from the pods' own conditions and events: the autoscaler's horizon."""

    replicas_measured: int = Field(default=0, description="Replicas measured since the resource was created.")
    samples: int = Field(default=0, description="Replicas in the window the statistics are over (the last 10).")
    last_seconds: float | None = Field(default=None, description="Created -> ready of the last replica.")
    p50_seconds: float | None = Field(default=None, description="Median created -> ready over the window.")
    p90_seconds: float | None = Field(
        default=None, description="90th percentile over the window: the autoscaler's time-to-ready."
    )
    last_replica: str | None = Field(default=None, max_length=253, description="The last replica measured.")
    phases: StartupPhases | None = Field(default=None, description="Each phase over the window.")
    recent: list[StartupSample] = Field(
        default_factory=list, max_length=10, description="The last replicas measured, oldest first."
    )


class MiniMaxM3DeploymentStatus(CamelModel):
    observed_generation: int = Field(default=0, description="Generation the status reflects.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description=conditions_description(DEPLOYMENT, "docs/reference/minimaxm3deployment.md"),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    plan: Plan | None = Field(default=None, description="The GPU layout in force.")
    replicas: int = Field(default=0, description="Replicas that exist (scale subresource).")
    ready_replicas: int = Field(default=0, description="Replicas whose every pod is ready.")
    selector: str = Field(default="", description="Label selector of the serving pods (scale subresource / HPA).")
    generated_secrets: list[Annotated[str, Field(max_length=253)]] = Field(
        default_factory=list,
        max_length=8,
        description="Secrets the operator generated for this resource (the TensorRT-LLM SSH key), so it can "
        "delete them when no longer needed without listing Secrets.",
    )
    time_to_ready: TimeToReadyStatus | None = Field(
        default=None, description="How long new replicas took to become ready, by phase (measured from the pods)."
    )
    model_cache: dict[str, Any] | None = Field(
        default=None,
        description="The MiniMaxM3ModelCache the pods mount: name, nodeAffinity, node label, nodes ready.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    autoscaling: dict[str, Any] | None = Field(
        default=None,
        description="The autoscaler's last decision: desired replicas, every term, the reason, the time.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ObjectMeta(BaseModel):
    """The part of metadata m3fleet reads; everything else is kept as given."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(default="", description="Name; children are named after it (RESOURCE_VALIDATIONS).")
    namespace: str = Field(default="default", description="Namespace.")


class MiniMaxM3Deployment(CamelModel):
    api_version: str = Field(default=API_VERSION, description="m3fleet.dev/v1alpha1.")
    kind: str = Field(default=KIND, description="MiniMaxM3Deployment.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: MiniMaxM3DeploymentSpec = Field(description="What to serve and how.")
    status: MiniMaxM3DeploymentStatus | None = Field(default=None, description="What the operator observed.")

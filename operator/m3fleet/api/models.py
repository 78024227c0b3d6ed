"""The `MiniMaxM3Deployment` custom resource (`m3fleet.dev/v1alpha1`) as pydantic models.

These models are the single source of truth: the CRD in `crds/` is generated from them
(`m3fleet crd`), the CLI and the operator parse user input through them, and every field's
description becomes the CRD's (and `kubectl explain`'s) documentation. Field names are a public
contract (see the architecture page): renaming one needs a new API version.

About 700 lines: the root spec, status and Plan with their enums; the sub-specs live in api/spec_*.py. The next seam is
the Plan and its parts (into api/plan.py beside api/plan_disaggregation.py), left for a change of its own.

Rules that span several fields and belong at admission are CEL rules (`x-kubernetes-validations`)
declared next to the model they constrain, so the apiserver rejects them before the operator
ever sees them; the planner re-checks everything with a fuller explanation.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from m3fleet.api.base import (
    API_VERSION,
    CATEGORIES,
    GROUP,
    KIND,
    MAX_CONTEXT,
    MAX_REPLICAS,
    MAX_SURGE,
    PARALLEL_SIZES,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    Accelerator,
    AutoscalingMode,
    CamelModel,
    EngineName,
    KvCacheDtype,
    MoeBackend,
    SpeculativeMethod,
    Strategy,
    Variant,
    invalid,
)
from m3fleet.api.children import KEEP_ABSENT
from m3fleet.api.conditions import DEPLOYMENT, conditions_description
from m3fleet.api.plan_disaggregation import DisaggregationPlan, RolePlan
from m3fleet.api.rules import cel as cel  # also imported from here by api/cache.py
from m3fleet.api.spec_autoscaling import (
    CA_AND_INSECURE_FIX,
    CA_AND_INSECURE_PROBLEM,
    CA_WITHOUT_TLS_FIX,
    CA_WITHOUT_TLS_PROBLEM,
    GATEWAY_LABEL_FIX,
    GATEWAY_LABEL_PROBLEM,
    HHMM_PATTERN,
    MIN_REPLICAS_FIX,
    MIN_REPLICAS_PROBLEM,
    PROMETHEUS_LABEL_PATTERN,
    PROMETHEUS_METRIC_PATTERN,
    PROMETHEUS_URL_FIX,
    PROMETHEUS_URL_PATTERN,
    PROMETHEUS_URL_PROBLEM,
    WINDOW_BOUNDS_FIX,
    WINDOW_BOUNDS_PROBLEM,
    WINDOW_EMPTY_FIX,
    WINDOW_EMPTY_PROBLEM,
    WINDOW_LENGTH_FIX,
    WINDOW_LENGTH_PROBLEM,
    AutoscalingBehavior,
    AutoscalingSpec,
    AutoscalingTarget,
    CaSecretKeyRef,
    ForecastSpec,
    GatewaySpec,
    PrometheusSpec,
    ScaleDownBehavior,
    ScaleUpBehavior,
    ScheduleWindowSpec,
    SloSpec,
    Weekday,
)
from m3fleet.api.spec_disaggregation import (
    DecodeRoleSpec,
    DisaggregationSpec,
    FrontendSpec,
    KvTransfer,
    PrefillRoleSpec,
    RenderAs,
)
from m3fleet.api.spec_engine import (
    ADMIN_KEY_FIX,
    ADMIN_KEY_PROBLEM,
    FIELD_PATH_PATTERN,
    RESOURCE_FIELD_PATTERN,
    TRTLLM_API_KEY_FIX,
    TRTLLM_API_KEY_PROBLEM,
    EngineSpec,
    EnvVar,
    EnvVarSource,
    ObjectFieldSelector,
    ObjectKeySelector,
    ResourceFieldSelector,
)
from m3fleet.api.spec_gateway import (
    TIER_BOUNDS_FIX,
    TIER_BOUNDS_PROBLEM,
    TIER_CONTEXT_FIX,
    TIER_CONTEXT_PROBLEM,
    ContextTier,
    EndpointPickerSpec,
    GatewayRef,
    InferenceGatewaySpec,
)
from m3fleet.api.spec_model import (
    CACHE_PREFERRED_FIX,
    CACHE_PREFERRED_PROBLEM,
    HuggingFaceSource,
    ModelCacheRef,
    ModelSource,
    ModelSpec,
    NodeAffinityMode,
    PvcSource,
    SecretKeyRef,
)
from m3fleet.api.spec_placement import (
    ROLLOUT_STUCK_FIX,
    ROLLOUT_STUCK_PROBLEM,
    ContextSpec,
    NetworkSpec,
    NodePoolSpec,
    ParallelismSpec,
    PodResourcesSpec,
    RolloutSpec,
)
from m3fleet.api.spec_pod import PodTemplateMetadata, PodTemplateSpec, VolumeMount
from m3fleet.api.spec_speculative import (
    SGLANG_MTP_FIX,
    SGLANG_MTP_PROBLEM,
    TRTLLM_SPECULATIVE_FIX,
    TRTLLM_SPECULATIVE_PROBLEM,
    SpeculativeDecodingSpec,
)

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
# A context tier's workload is <name>-<tier>: the same StatefulSet limit holds for it.
TIER_NAME_LENGTH_PROBLEM = (
    f"plus '-' and a spec.gateway.tiers name is longer than {MAX_NAME_LENGTH} characters: a tier's workload is "
    "<name>-<tier>, and the LeaderWorkerSet controller names its StatefulSets after it"
)
TIER_NAME_LENGTH_FIX = "shorten the resource's name or the tier's"
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
# Rules on the MiniMaxM3Deployment's root only (the model cache has no spec.gateway).
DEPLOYMENT_VALIDATIONS: list[dict[str, Any]] = [
    cel(
        "!has(self.spec.gateway) || !has(self.spec.gateway.tiers) || "
        f"self.spec.gateway.tiers.all(t, size(self.metadata.name) + 1 + size(t.name) <= {MAX_NAME_LENGTH})",
        f"metadata.name {TIER_NAME_LENGTH_PROBLEM}; fix: {TIER_NAME_LENGTH_FIX}",
        ".metadata.name",
    ),
]


# --- spec.model ---------------------------------------------------------------------------


# --- spec.engine ----------------------------------------------------------------------------


# --- placement, parallelism, context ---------------------------------------------------------


# --- autoscaling -----------------------------------------------------------------------------


# --- the resource ----------------------------------------------------------------------------


class MiniMaxM3DeploymentSpec(CamelModel):
    # Combinations the engines do not serve: Forbidden (kubectl prints "spec.<field>: Forbidden: <message>").
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.model.variant != 'mxfp4' || self.accelerator in ['mi350x', 'mi355x']",
                    "model.variant mxfp4 (amd/MiniMax-M3-MXFP4) runs only on accelerator mi350x or mi355x (gfx950); "
                    "fix: use variant mxfp8 or bf16 here, or accelerator mi350x or mi355x",
                    ".model.variant",
                    "FieldValueForbidden",
                ),
                cel(
                    "self.engine.name != 'trtllm' || self.accelerator in ['h200', 'gb200']",
                    "engine trtllm runs only on the NVIDIA pools its MiniMax-M3 guide documents (h200, gb200); fix: "
                    "use engine vllm or sglang on the other pools, or accelerator h200 or gb200",
                    ".engine.name",
                    "FieldValueForbidden",
                ),
                cel(
                    "self.engine.name != 'trtllm' || !has(self.speculativeDecoding)",
                    f"speculativeDecoding {TRTLLM_SPECULATIVE_PROBLEM}; fix: {TRTLLM_SPECULATIVE_FIX}",
                    ".speculativeDecoding",
                    "FieldValueForbidden",
                ),
                cel(
                    "self.engine.name != 'sglang' || !has(self.speculativeDecoding) || "
                    "self.speculativeDecoding.method != 'mtp'",
                    f"speculativeDecoding.method mtp {SGLANG_MTP_PROBLEM}; fix: {SGLANG_MTP_FIX}",
                    ".speculativeDecoding.method",
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
                    "!has(self.disaggregation) || self.accelerator in ['h200', 'gb200']",
                    "disaggregation runs on NVIDIA Dynamo, whose release images are built for NVIDIA GPUs only; fix: "
                    "use accelerator h200 or gb200, or remove disaggregation",
                    ".disaggregation",
                    "FieldValueForbidden",
                ),
                cel(
                    "!has(self.disaggregation) || "
                    "self.disaggregation.inputTokens + self.disaggregation.outputTokens <= self.context.maxModelLen",
                    "disaggregation.inputTokens together with outputTokens is longer than context.maxModelLen, so no "
                    "request of the shape the ratio is planned for could be served; fix: raise context.maxModelLen or "
                    "lower the expected lengths",
                    ".disaggregation.inputTokens",
                ),
                cel(
                    "self.engine.name != 'trtllm' || self.model.variant == 'bf16'",
                    "the pinned TensorRT-LLM release serves MiniMax-M3 in bf16 only; fix: use variant bf16, or engine "
                    "vllm for the other variants (sglang serves bf16 and mxfp8)",
                    ".model.variant",
                    "FieldValueForbidden",
                ),
                cel(
                    "!has(self.gateway) || !has(self.disaggregation)",
                    "gateway and disaggregation are two routers for one fleet: the endpoint picker cannot route to "
                    "Dynamo's prefill and decode workers; fix: drop spec.gateway (Dynamo's frontend routes a "
                    "disaggregated fleet) or spec.disaggregation",
                    ".gateway",
                    "FieldValueForbidden",
                ),
                cel(
                    "self.autoscaling.minReplicas >= 1 || has(self.gateway)",
                    f"autoscaling.minReplicas {MIN_REPLICAS_PROBLEM}; fix: {MIN_REPLICAS_FIX}",
                    ".autoscaling.minReplicas",
                ),
                cel(
                    "!has(self.gateway) || !has(self.gateway.tiers) || self.gateway.tiers.all(t, "
                    "(has(t.minReplicas) ? t.minReplicas : self.autoscaling.minReplicas) <= "
                    "(has(t.maxReplicas) ? t.maxReplicas : self.autoscaling.maxReplicas))",
                    f"gateway.tiers[].minReplicas {TIER_BOUNDS_PROBLEM}; fix: {TIER_BOUNDS_FIX}",
                    ".gateway.tiers",
                ),
                cel(
                    "!has(self.gateway) || !has(self.gateway.tiers) || "
                    "self.gateway.tiers.all(t, t.maxModelLen < self.context.maxModelLen)",
                    f"gateway.tiers[].maxModelLen {TIER_CONTEXT_PROBLEM}; fix: {TIER_CONTEXT_FIX}",
                    ".gateway.tiers",
                ),
            ]
        }
    )
    model: ModelSpec = Field(description="Which MiniMax-M3 checkpoint to serve and where its weights are.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="Serving engine and its overrides.")
    accelerator: Accelerator = Field(
        default=Accelerator.H200,
        description="GPU pool: h200, h100, h20, gb200, gb300, b200, b300, mi300x, mi325x, mi350x or mi355x.",
    )
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
    gateway: InferenceGatewaySpec | None = Field(
        default=None,
        description="Serve through the user's Gateway (Gateway API Inference Extension): an InferencePool over the "
        "serving pods, its endpoint picker (prefix-cache, KV-cache and queue aware) and an HTTPRoute from the named "
        "Gateway; optional context tiers behind the same pool; scale from zero (docs/gateway.md).",
        json_schema_extra={KEEP_ABSENT: True},  # its presence turns the serving path on: never defaulted to {}
    )
    speculative_decoding: SpeculativeDecodingSpec | None = Field(
        default=None,
        description="Speculative decoding: M3's own MTP modules or an EAGLE3 draft. The plan counts the draft's "
        "weights and KV cache; absent, none.",
    )
    disaggregation: DisaggregationSpec | None = Field(
        default=None,
        description="Serve with prefill and decode on separate workers behind NVIDIA Dynamo's frontend and KV "
        "router (absent: aggregated replicas). spec.replicas then counts decode workers.",
        json_schema_extra={KEEP_ABSENT: True},  # its presence turns disaggregation on: never defaulted to {}
    )
    pod_template: PodTemplateSpec = Field(
        default_factory=PodTemplateSpec,
        description="What a platform adds to the engine pods and their workload: labels, annotations, "
        "priorityClassName, schedulerName, extra volumes and mounts (Kueue, Volcano, site policy). Never changes "
        "the plan or the engine's flags.",
    )


class TierPlan(CamelModel):
    """One context tier of a gatewayed fleet, as planned (the fleet's own context is the tier `main`)."""

    name: str = Field(max_length=8, description="The tier (main: the spec's own context).")
    max_model_len: int = Field(description="Context this tier serves; the picker sends it prompts that fit.")
    gpus_per_replica: int = Field(description="GPUs in one replica (its TP x DP x PP).")
    nodes_per_replica: int = Field(description="Pods (one per node) in one replica.")
    kv_cache_tokens_per_replica: int = Field(description="KV tokens one replica holds.")
    max_sequences_at_max_len: int = Field(description="Full-length sequences one replica holds at once.")


class GatewayPlan(CamelModel):
    """The serving path spec.gateway renders: the pool, its endpoint picker and the route."""

    gateway: str = Field(
        max_length=400, description="The Gateway the HTTPRoute attaches to: name, or namespace/name elsewhere."
    )
    endpoint_picker_image: str = Field(max_length=512, description="The endpoint picker image.")
    scorers: list[str] = Field(
        default_factory=list, max_length=8, description="The picker's scorers, fitted to the engine."
    )
    filters: list[str] = Field(default_factory=list, max_length=8, description="The picker's filters.")
    tiers: list[TierPlan] = Field(
        default_factory=list, max_length=8, description="Context tiers, shortest first; the last is the spec's own."
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
    speculative_decoding: SpeculativePlan | None = Field(
        default=None, description="The draft, its memory and the acceptance length assumed (absent: none)."
    )
    model_cache: str | None = Field(
        default=None, description="MiniMaxM3ModelCache the weights come from (absent: spec.model.source)."
    )
    model_cache_node_affinity: NodeAffinityMode | None = Field(
        default=None, description="Required or Preferred: how pods are placed on nodes holding the cache."
    )
    gateway: GatewayPlan | None = Field(
        default=None, description="The serving path spec.gateway renders (absent: no gateway)."
    )
    disaggregation: DisaggregationPlan | None = Field(
        default=None,
        description="Prefill and decode workers on NVIDIA Dynamo (spec.disaggregation); the fields above then "
        "describe one decode worker.",
    )


class SpeculativePlan(CamelModel):
    """Speculative decoding as planned: the draft, what it costs on each GPU, and the acceptance length assumed."""

    method: SpeculativeMethod = Field(description="mtp or eagle3.")
    draft_model: str = Field(description="The draft served (the checkpoint itself for mtp).")
    num_speculative_tokens: int = Field(description="Tokens drafted per step.")
    draft_weights_gib_per_gpu: float = Field(alias="draftWeightsGiBPerGPU", description="Draft weights on each GPU.")
    draft_kv_bytes_per_token_per_gpu: int = Field(
        alias="draftKvBytesPerTokenPerGPU", description="KV bytes the draft adds per token on each GPU."
    )
    acceptance_length_prior: float = Field(
        description="Tokens emitted per target forward pass the autoscaler assumes until the engine's counters "
        "measure it (1: no gain assumed)."
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


class TimeToReadyPhases(CamelModel):
    """Where a new replica's time goes (see autoscaling/time_to_ready.py for what each phase is read from)."""

    schedule: PhaseSummary | None = Field(default=None, description="Pod created -> PodScheduled.")
    image: PhaseSummary | None = Field(
        default=None, description="Scheduled -> the kubelet's Pulled event (image pulled or already present)."
    )
    start: PhaseSummary | None = Field(default=None, description="Image ready (or scheduled) -> containers started.")
    load: PhaseSummary | None = Field(default=None, description="Containers started -> Ready (weights, engine init).")


class TimeToReadySample(CamelModel):
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
    phases: TimeToReadyPhases | None = Field(default=None, description="Each phase over the window.")
    recent: list[TimeToReadySample] = Field(
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
    gateway: dict[str, Any] | None = Field(
        default=None,
        description="With spec.gateway: the Gateway, the pool's ready endpoints and each context tier's replicas.",
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


# The spec's parts live in their own modules (base, spec_*); every name stays importable from here.
__all__ = [
    "ADMIN_KEY_FIX",
    "ADMIN_KEY_PROBLEM",
    "API_VERSION",
    "CACHE_PREFERRED_FIX",
    "CACHE_PREFERRED_PROBLEM",
    "CATEGORIES",
    "CA_AND_INSECURE_FIX",
    "CA_AND_INSECURE_PROBLEM",
    "CA_WITHOUT_TLS_FIX",
    "CA_WITHOUT_TLS_PROBLEM",
    "DEPLOYMENT_VALIDATIONS",
    "FIELD_PATH_PATTERN",
    "GATEWAY_LABEL_FIX",
    "GATEWAY_LABEL_PROBLEM",
    "GROUP",
    "HHMM_PATTERN",
    "KIND",
    "MAX_CONTEXT",
    "MAX_NAME_LENGTH",
    "MAX_REPLICAS",
    "MAX_SURGE",
    "MIN_REPLICAS_FIX",
    "MIN_REPLICAS_PROBLEM",
    "NAME_FORMAT_FIX",
    "NAME_FORMAT_PROBLEM",
    "NAME_LENGTH_FIX",
    "NAME_LENGTH_PROBLEM",
    "NAME_PATTERN",
    "PARALLEL_SIZES",
    "PLURAL",
    "PROMETHEUS_LABEL_PATTERN",
    "PROMETHEUS_METRIC_PATTERN",
    "PROMETHEUS_URL_FIX",
    "PROMETHEUS_URL_PATTERN",
    "PROMETHEUS_URL_PROBLEM",
    "RESOURCE_FIELD_PATTERN",
    "RESOURCE_VALIDATIONS",
    "ROLLOUT_STUCK_FIX",
    "ROLLOUT_STUCK_PROBLEM",
    "SHORT_NAMES",
    "SINGULAR",
    "STATEFULSET_NAME_MAX",
    "TIER_NAME_LENGTH_FIX",
    "TIER_NAME_LENGTH_PROBLEM",
    "TRTLLM_API_KEY_FIX",
    "TRTLLM_API_KEY_PROBLEM",
    "VERSION",
    "WINDOW_BOUNDS_FIX",
    "WINDOW_BOUNDS_PROBLEM",
    "WINDOW_EMPTY_FIX",
    "WINDOW_EMPTY_PROBLEM",
    "WINDOW_LENGTH_FIX",
    "WINDOW_LENGTH_PROBLEM",
    "Accelerator",
    "AutoscalingBehavior",
    "AutoscalingMode",
    "AutoscalingSpec",
    "AutoscalingTarget",
    "CaSecretKeyRef",
    "CamelModel",
    "Condition",
    "ContextSpec",
    "ContextTier",
    "DecodeRoleSpec",
    "DisaggregationPlan",
    "DisaggregationSpec",
    "EndpointPickerSpec",
    "EngineName",
    "EngineSpec",
    "EnvVar",
    "EnvVarSource",
    "ForecastSpec",
    "FrontendSpec",
    "GatewayPlan",
    "GatewayRef",
    "GatewaySpec",
    "HuggingFaceSource",
    "InferenceGatewaySpec",
    "KvCacheDtype",
    "KvTransfer",
    "MiniMaxM3Deployment",
    "MiniMaxM3DeploymentSpec",
    "MiniMaxM3DeploymentStatus",
    "ModelCacheRef",
    "ModelSource",
    "ModelSpec",
    "MoeBackend",
    "NetworkSpec",
    "NodeAffinityMode",
    "NodePoolSpec",
    "ObjectFieldSelector",
    "ObjectKeySelector",
    "ObjectMeta",
    "ParallelismSpec",
    "PhaseSummary",
    "Plan",
    "PodResourcesSpec",
    "PodTemplateMetadata",
    "PodTemplateSpec",
    "PrefillRoleSpec",
    "PrometheusSpec",
    "PvcSource",
    "RenderAs",
    "ResourceFieldSelector",
    "RolePlan",
    "RolloutSpec",
    "ScaleDownBehavior",
    "ScaleUpBehavior",
    "ScheduleWindowSpec",
    "SecretKeyRef",
    "SloSpec",
    "SpeculativeDecodingSpec",
    "SpeculativeMethod",
    "SpeculativePlan",
    "Strategy",
    "TierPlan",
    "TimeToReadyPhases",
    "TimeToReadySample",
    "TimeToReadyStatus",
    "Variant",
    "VolumeMount",
    "Weekday",
    "cel",
    "invalid",
]

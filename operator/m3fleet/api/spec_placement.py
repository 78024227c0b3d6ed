"""Where and how replicas run: `spec.nodePool` (placement and pod resources), `spec.parallelism`, `spec.context`,
`spec.network` and `spec.rollout`."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from m3fleet.api import children
from m3fleet.api.base import MAX_CONTEXT, MAX_SURGE, PARALLEL_SIZES, CamelModel, KvCacheDtype, Strategy
from m3fleet.api.rules import cel


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

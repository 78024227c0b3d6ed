"""The planner's answer for `spec.disaggregation`: each role's layout and count, the ratio and how it was reached
(`status.plan.disaggregation`, `m3fleet plan -o json`)."""

from __future__ import annotations

from pydantic import Field

from m3fleet.api.base import CamelModel, Strategy


class RolePlan(CamelModel):
    """One role's workers, as the planner sized them."""

    replicas: int = Field(description="Workers of this role.")
    strategy: Strategy = Field(description="Resolved strategy (tp-ep: TEP, dp-ep: DEP).")
    tensor_parallel_size: int = Field(description="TP size of one worker.")
    data_parallel_size: int = Field(description="DP size of one worker.")
    expert_parallel_size: int = Field(description="EP size of one worker.")
    gpus_per_node: int = Field(description="GPUs each pod of the role requests.")
    gpus_per_worker: int = Field(description="GPUs in one worker.")
    nodes_per_worker: int = Field(description="Pods (one per node) in one worker.")
    kv_cache_tokens_per_rank: int = Field(description="KV tokens one rank holds.")
    kv_cache_tokens_per_worker: int = Field(description="KV tokens one worker holds.")
    holds: str = Field(description="What the KV pool holds for this role's job.")
    tokens_per_second: float = Field(
        description="The time model's throughput of one worker: prompt tokens/s (prefill), output tokens/s (decode)."
    )
    requests_per_second: float = Field(description="Requests of the expected shape one worker completes per second.")
    validated: bool = Field(description="The role's shape equals a published aggregated recipe's.")


class DisaggregationPlan(CamelModel):
    """Prefill and decode workers behind Dynamo's frontend, and why this many of each."""

    render_as: str = Field(description="pods or DynamoGraphDeployment.")
    transfer: str = Field(description="KV transfer between the roles (nixl).")
    dynamo_version: str = Field(description="The NVIDIA Dynamo release whose frontend and workers are rendered.")
    image: str = Field(description="Dynamo's runtime image for this engine (frontend and workers).")
    input_tokens: int = Field(description="Expected prompt length the ratio is planned for.")
    output_tokens: int = Field(description="Expected output length the ratio is planned for.")
    ratio: str = Field(description="Prefill:decode workers in force.")
    derived_ratio: float = Field(description="Prefill workers per decode worker the time model asks for.")
    prefill_utilization: float = Field(
        description="Share of the prefill workers' throughput the decode side keeps busy."
    )
    frontend_replicas: int = Field(description="Dynamo frontends.")
    prefill: RolePlan = Field(description="Prefill workers.")
    decode: RolePlan = Field(description="Decode workers.")
    reasoning: list[str] = Field(default_factory=list, max_length=16, description="How the ratio was reached.")

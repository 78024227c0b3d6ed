"""`spec.disaggregation`: prefill and decode on separate workers behind NVIDIA Dynamo's frontend and KV router.

Setting the field turns it on. The planner sizes each role (its parallelism, its nodes, the KV tokens its job needs:
a prefill worker holds the prompts it is prefilling and handing over, a decode worker whole sequences) and derives
how many prefill workers each decode worker needs from the expected input and output lengths and the engine's time
model; `ratio` or the roles' `replicas` pin it instead. docs/disaggregation.md says what is rendered.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from m3fleet.api.base import MAX_CONTEXT, MAX_REPLICAS, CamelModel
from m3fleet.api.rules import cel
from m3fleet.api.spec_placement import ParallelismSpec

RATIO_PATTERN = "^[1-9][0-9]{0,2}:[1-9][0-9]{0,2}$"  # prefill:decode workers, e.g. 1:2


class RenderAs(StrEnum):
    PODS = "pods"  # m3fleet's own Deployments/LeaderWorkerSets running Dynamo's frontend and workers
    DYNAMO_GRAPH_DEPLOYMENT = "DynamoGraphDeployment"  # one nvidia.com/v1beta1 object for the Dynamo operator


class KvTransfer(StrEnum):
    NIXL = "nixl"  # NVIDIA's transfer library (UCX/libfabric underneath): what every backend's Dynamo recipe uses


class DecodeRoleSpec(CamelModel):
    """The decode workers' layout; how many there are is spec.replicas (the scale subresource's field)."""

    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec,
        description="This role's layout (unset: spec.parallelism's); strategy auto takes the engine's default for "
        "the role (TensorRT-LLM: TEP for prefill, DEP for decode when a sequence fits one rank; vLLM and SGLang: "
        "tp-ep for both).",
    )


class PrefillRoleSpec(DecodeRoleSpec):
    """The prefill workers: how many, and how each is laid out."""

    replicas: int = Field(
        default=0,
        ge=0,
        le=MAX_REPLICAS,
        description="Prefill workers; 0 lets the planner decide (decode workers x the ratio, rounded up). A count "
        "set here is kept, also by the autoscaler (which then scales the decode workers only).",
    )


class FrontendSpec(CamelModel):
    replicas: int = Field(
        default=1, ge=1, le=64, description="Dynamo frontends (OpenAI HTTP + KV router); they hold no GPU."
    )


class DisaggregationSpec(CamelModel):
    """Disaggregated prefill/decode on NVIDIA Dynamo (its frontend with the KV router, prefill and decode workers)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.ratio == '' || self.prefill.replicas == 0",
                    "disaggregation.ratio cannot be pinned together with prefill.replicas (the count already fixes "
                    "the prefill workers); fix: clear ratio, or set prefill.replicas to 0",
                    ".ratio",
                    "FieldValueForbidden",
                ),
            ]
        }
    )
    render_as: RenderAs = Field(
        default=RenderAs.PODS,
        description="pods: m3fleet runs Dynamo's frontend and workers itself (Deployments, LeaderWorkerSets, "
        "Kubernetes discovery); DynamoGraphDeployment: the same plan as one nvidia.com/v1beta1 "
        "DynamoGraphDeployment for a cluster running the Dynamo operator.",
    )
    transfer: KvTransfer = Field(default=KvTransfer.NIXL, description="How KV moves from prefill to decode: nixl.")
    input_tokens: int = Field(
        default=8192,
        ge=1,
        le=MAX_CONTEXT,
        description="Expected prompt length (tokens) the prefill:decode ratio is planned for.",
    )
    output_tokens: int = Field(
        default=1024,
        ge=1,
        le=MAX_CONTEXT,
        description="Expected output length (tokens) the prefill:decode ratio is planned for.",
    )
    ratio: str = Field(
        default="",
        max_length=7,
        pattern=f"({RATIO_PATTERN})|^$",
        description='Prefill:decode workers, e.g. "1:2"; empty lets the planner derive it from inputTokens, '
        "outputTokens and the engine's time model (m3fleet plan shows the arithmetic).",
    )
    prefill: PrefillRoleSpec = Field(
        default_factory=PrefillRoleSpec, description="Prefill workers: compute-bound, hold prompts in flight."
    )
    decode: DecodeRoleSpec = Field(
        default_factory=DecodeRoleSpec,
        description="Decode workers: bandwidth-bound, hold whole sequences; spec.replicas counts them (kubectl scale, "
        "the scale subresource), or the autoscaler.",
    )
    frontend: FrontendSpec = Field(default_factory=FrontendSpec, description="Dynamo's HTTP frontend and KV router.")

"""`spec.gateway`: the serving path through the user's Gateway (Gateway API Inference Extension).

When set, m3fleet renders an InferencePool over the fleet's serving pods, the endpoint picker (EPP) that scores
them (prefix cache, KV-cache utilisation, queue depth, each engine's own metric names), and an HTTPRoute from the
named Gateway to the pool. `tiers` adds shorter-context pools behind the same pool: the spec itself is the longest
tier, and the picker sends each request to the smallest tier whose context fits it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field

from m3fleet.api import children
from m3fleet.api.base import MAX_CONTEXT, MAX_REPLICAS, CamelModel
from m3fleet.api.rules import cel
from m3fleet.api.spec_placement import ParallelismSpec

MAX_TIERS = 4  # extra tiers besides the spec's own context; each is its own workload
TIER_NAME_MAX = 8  # the workload is <name>-<tier>; the resource name's limit keeps room for it (see models)
MAIN_TIER = "main"  # the spec's own context, the longest tier (its workload is <name>)
TIER_NAME_PATTERN = "^[a-z]([a-z0-9]*[a-z0-9])?$"
HOSTNAME_PATTERN = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECTION_NAME_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
TIER_NAME_PROBLEM = "must be a lowercase word (letters and digits, starting with a letter), at most 8 characters"
TIER_NAME_FIX = "name it after its context, e.g. short or c32k"
TIER_CONTEXT_PROBLEM = (
    "must be shorter than spec.context.maxModelLen: the spec itself is the longest tier, and every other tier "
    "serves the prompts too short for the next one"
)
TIER_BOUNDS_PROBLEM = (
    "exceeds its maxReplicas (an absent one is spec.autoscaling's): the autoscaler could never satisfy both"
)
TIER_BOUNDS_FIX = "lower the tier's minReplicas, or raise its maxReplicas"
TIER_CONTEXT_FIX = "lower the tier's maxModelLen, or raise spec.context.maxModelLen to the longest context served"


class GatewayRef(CamelModel):
    """The Gateway (gateway.networking.k8s.io/v1) the route attaches to: the HTTPRoute's parentRef."""

    name: str = Field(
        min_length=1,
        max_length=253,
        description="The Gateway's name.",
        json_schema_extra=children.name_rules(
            "gatewayRef.name", "give the Gateway's name as `kubectl get gateway` shows it, e.g. inference-gateway"
        ),
    )
    namespace: str = Field(
        default="",
        max_length=63,
        description="The Gateway's namespace; empty means the resource's. A Gateway elsewhere must allow routes "
        "from this namespace (its listeners' allowedRoutes).",
        json_schema_extra=children.name_rules("gatewayRef.namespace", optional=True),
    )
    section_name: str = Field(
        default="",
        max_length=253,
        pattern=SECTION_NAME_PATTERN + "|^$",
        description="The Gateway listener to attach to; empty means every listener that admits the route.",
    )


def _tier_bound(least: int, description: str) -> Any:
    """A tier's autoscaling bound: optional, the spec's own when absent."""
    return Field(default=None, ge=least, le=MAX_REPLICAS, description=description)


class ContextTier(CamelModel):
    """A pool of replicas planned for a shorter context, behind the same InferencePool: short prompts land here, with
    many more sequences per replica than the long-context plan holds."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.name != '{MAIN_TIER}'",
                    f"tier name {MAIN_TIER} is the spec's own context; fix: {TIER_NAME_FIX}",
                    ".name",
                ),
            ]
        }
    )
    name: str = Field(
        min_length=1,
        max_length=TIER_NAME_MAX,
        pattern=TIER_NAME_PATTERN,
        description="The tier's name: its workload is <name>-<tier>.",
    )
    max_model_len: int = Field(
        ge=1024, le=MAX_CONTEXT, description="Longest prompt + output this tier serves, in tokens."
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="The tier's replicas while spec.autoscaling is off (as spec.replicas is the spec's own tier's).",
    )
    min_replicas: int | None = _tier_bound(
        0,
        "With spec.autoscaling on: the tier's fewest replicas; 0 scales the tier to zero after "
        "spec.autoscaling.scaleToZeroAfterSeconds idle. Absent: spec.autoscaling.minReplicas.",
    )
    max_replicas: int | None = _tier_bound(
        1,
        "With spec.autoscaling on: the tier's most replicas, scaled on the tier's own demand. "
        "Absent: spec.autoscaling.maxReplicas.",
    )
    parallelism: ParallelismSpec | None = Field(
        default=None, description="The tier's parallel layout; absent: spec.parallelism's, planned for the tier."
    )


class EndpointPickerSpec(CamelModel):
    image: str = Field(
        default="",
        max_length=512,
        description="The endpoint picker image; empty means the pinned m3fleet build of the Gateway API Inference "
        "Extension's EPP (v1.3.0 with the m3fleet-context-tier filter), or the chart's gateway.eppImage.",
        json_schema_extra=children.image_rules("endpointPicker.image"),
    )


def _unique_per_tier(field: str) -> dict[str, Any]:
    """No two tiers share `field` (their name, or their context: the picker could not tell them apart)."""
    return cel(
        f"!has(self.tiers) || self.tiers.all(t, self.tiers.exists_one(u, u.{field} == t.{field}))",
        f"gateway.tiers has two tiers with the same {field}; fix: give every tier its own {field}, or merge them",
        ".tiers",
    )


class InferenceGatewaySpec(CamelModel):
    """The serving path: InferencePool + endpoint picker + HTTPRoute from `gatewayRef`."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [_unique_per_tier("name"), _unique_per_tier("maxModelLen")]}
    )
    gateway_ref: GatewayRef = Field(description="The Gateway that routes to this fleet (its parentRef).")
    tiers: list[ContextTier] = Field(
        default_factory=list,
        max_length=MAX_TIERS,
        description="Extra pools planned for shorter contexts, each its own workload behind the same InferencePool; "
        "the spec itself is the longest tier. The picker sends a request to the smallest tier whose context fits.",
    )
    hostnames: list[Annotated[str, Field(max_length=253, pattern=HOSTNAME_PATTERN)]] = Field(
        default_factory=list,
        max_length=16,
        description="The HTTPRoute's hostnames (empty: every hostname the Gateway's listener admits); set them when "
        "several fleets share one listener.",
    )
    request_timeout_seconds: int = Field(
        default=900,
        ge=10,
        le=86400,
        description="The route's request timeout: the longest a request may be held by the picker (while the fleet "
        "scales from zero, or every replica is saturated) plus served; the Gateway then answers 504.",
    )
    endpoint_picker: EndpointPickerSpec = Field(
        default_factory=EndpointPickerSpec, description="The endpoint picker (EPP) m3fleet runs for the pool."
    )

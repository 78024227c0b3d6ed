"""Labels on every child, and the selectors built from them."""

from __future__ import annotations

from m3fleet.api.spec_pod import LABEL_PREFIX
from m3fleet.catalog.gateway import MAX_CONTEXT_LABEL
from m3fleet.engines.base import Context, Role

PREFIX = LABEL_PREFIX
NAME = f"{PREFIX}name"
ENGINE = f"{PREFIX}engine"
ACCELERATOR = f"{PREFIX}accelerator"
ROLE = f"{PREFIX}role"
SERVING = f"{PREFIX}serving"  # "true" on pods that serve HTTP: single-node pods and LWS leaders
TIER = f"{PREFIX}tier"  # a context tier's pods (spec.gateway.tiers); the spec's own tier has none
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "m3fleet"


def object_labels(ctx: Context) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "minimax-m3",
        "app.kubernetes.io/instance": ctx.name,
        "app.kubernetes.io/component": "engine",
        MANAGED_BY: MANAGER,
        NAME: ctx.name,
        ENGINE: ctx.plan.engine,
        ACCELERATOR: ctx.plan.accelerator,
    }


def object_labels_for(name: str) -> dict[str, str]:
    """The labels pruning selects on, for objects the controller creates outside `render`."""
    return {"app.kubernetes.io/instance": name, MANAGED_BY: MANAGER, NAME: name}


def pod_labels(ctx: Context, role: Role, serves_http: bool) -> dict[str, str]:
    labels = {**object_labels(ctx), ROLE: role.value, **tier_labels(ctx)}
    if serves_http:
        labels[SERVING] = "true"
        if ctx.spec.gateway is not None:  # the endpoint picker's context-tier filter reads it
            labels[MAX_CONTEXT_LABEL] = str(ctx.plan.max_model_len)
    return labels


def tier_labels(ctx: Context) -> dict[str, str]:
    return {TIER: ctx.tier} if ctx.tier else {}


def workload_selector(ctx: Context) -> dict[str, str]:
    """What a Deployment's selector holds besides the role: the resource, and a context tier's own label."""
    return {NAME: ctx.name, **tier_labels(ctx)}


def owned_selector(name: str) -> str:
    """Every child of one resource (what pruning lists)."""
    return f"{NAME}={name},{MANAGED_BY}={MANAGER}"


def serving_selector(name: str) -> dict[str, str]:
    return {NAME: name, SERVING: "true"}


def serving_selector_string(name: str) -> str:
    """status.selector for the scale subresource: the pods that serve (one per replica)."""
    return ",".join(f"{k}={v}" for k, v in serving_selector(name).items())

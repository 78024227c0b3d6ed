"""Plans and policy configs the autoscaling tests share (built from the vLLM 8xH200 TP8 sample)."""

from __future__ import annotations

import copy
from functools import cache

from m3fleet.api.models import Plan
from m3fleet.api.parse import parse_resource
from m3fleet.autoscaling.policy import PolicyConfig
from m3fleet.autoscaling.simulate import DEFAULT_RESOURCE
from m3fleet.planner import plan


@cache
def sample_plan(max_model_len: int = 131072) -> Plan:
    """The sample's plan: TP8 at 131072 (511,616 KV tokens/replica); at 1048576 it becomes TP16 over 2 nodes."""
    body = copy.deepcopy(DEFAULT_RESOURCE)
    body["spec"]["context"]["maxModelLen"] = max_model_len
    return plan(parse_resource(body).spec)


def config(max_model_len: int = 131072, **overrides: object) -> PolicyConfig:
    """The policy config from the sample's default autoscaling spec, with min 1 / max 8 unless overridden."""
    resource = parse_resource(DEFAULT_RESOURCE)
    values: dict[str, object] = {"min_replicas": 1, "max_replicas": 8, **overrides}
    return PolicyConfig.from_spec(resource.spec.autoscaling, sample_plan(max_model_len), **values)

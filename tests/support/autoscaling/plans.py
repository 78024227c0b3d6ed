"""Plans and policy configs the autoscaling tests share (built from the vLLM 8xH200 TP8 sample)."""

from __future__ import annotations

import copy
from functools import cache

from m3fleet.api.models import Plan
from m3fleet.api.parse import parse_resource
from m3fleet.autoscaling.policy import PolicyConfig
from m3fleet.planner import plan
from m3fleet_simulator.whatif import DEFAULT_RESOURCE


@cache
def sample_plan(max_model_len: int = 131072) -> Plan:
    """The sample's plan: TP8 at 131072 (542,464 KV tokens/replica). Past the BF16 checkpoint's native 512K it
    serves the MXFP8 checkpoint (native 1M; vLLM's NVIDIA M3 model applies no YaRN), as the benchmark does."""
    body = copy.deepcopy(DEFAULT_RESOURCE)
    body["spec"]["context"]["maxModelLen"] = max_model_len
    if max_model_len > 524_288:
        body["spec"]["model"]["variant"] = "mxfp8"
    return plan(parse_resource(body).spec)


def config(max_model_len: int = 131072, **overrides: object) -> PolicyConfig:
    """The policy config from the sample's default autoscaling spec, with min 1 / max 8 unless overridden."""
    resource = parse_resource(DEFAULT_RESOURCE)
    values: dict[str, object] = {"min_replicas": 1, "max_replicas": 8, **overrides}
    return PolicyConfig.from_spec(resource.spec.autoscaling, sample_plan(max_model_len), **values)

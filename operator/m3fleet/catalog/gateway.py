"""What the serving path (spec.gateway) is built of: the endpoint picker release, and which of its scorers fit each
engine. Sources: GIE v1.3.0 (sigs.k8s.io/gateway-api-inference-extension: `pkg/epp/server/options.go` for the
metric flags, `pkg/epp/scheduling/framework/plugins` for the plugin types, `pkg/epp/flowcontrol` for the
`flowControl` feature gate, `config/charts/inferencepool` for the RBAC and probes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from m3fleet.api.base import EngineName
from m3fleet.catalog.engine_metrics import ENGINE_METRICS
from m3fleet.catalog.facts import ENGINES

EPP_VERSION: Final = "v1.3.0"
# m3fleet's build of the upstream picker with the m3fleet-context-tier filter compiled in (epp/ in this repository).
EPP_IMAGE: Final = f"ghcr.io/m3fleet/epp:{EPP_VERSION}-m3fleet.1"
EPP_GRPC_PORT: Final = 9002  # ext-proc: what the Gateway calls
EPP_HEALTH_PORT: Final = 9003  # gRPC health (the probes)
EPP_METRICS_PORT: Final = 9090  # the picker's own Prometheus metrics (flow control's queue)
POOL_API: Final = "inference.networking.k8s.io/v1"
ROUTE_API: Final = "gateway.networking.k8s.io/v1"
CONFIG_API: Final = "inference.networking.x-k8s.io/v1alpha1"  # EndpointPickerConfig
PREFIX_SCORER: Final = "prefix-cache-scorer"
KV_SCORER: Final = "kv-cache-utilization-scorer"
QUEUE_SCORER: Final = "queue-scorer"
CONTEXT_TIER_FILTER: Final = "m3fleet-context-tier"  # m3fleet's filter: the smallest tier whose context fits
FLOW_CONTROL_GATE: Final = "flowControl"  # holds requests (bounded queue, bounded time) while no endpoint can take them
# The label every serving pod of a gatewayed fleet carries: its tier's context, read by the context-tier filter.
MAX_CONTEXT_LABEL: Final = "m3fleet.dev/max-context-tokens"
# The picker's gauge of requests its flow control holds (inference_extension subsystem), by pool.
HELD_REQUESTS_METRIC: Final = "inference_extension_flow_control_queue_size"
SCORER_WEIGHTS: Final[Mapping[str, int]] = {PREFIX_SCORER: 3, KV_SCORER: 2, QUEUE_SCORER: 2}  # the chart's defaults


@dataclass(frozen=True)
class PickerFit:
    """How the picker reads one engine: whether prefix-cache scoring pays (the engine reuses cached prefixes), where
    its metrics are, and the metric names its flags must carry (the picker's defaults are vLLM's)."""

    prefix_reuse: bool
    metrics_path: str
    queued: str
    running: str
    kv_usage: str
    reason: str  # why prefix scoring is or is not on, for the plan's notes


def _fit(engine: EngineName, prefix_reuse: bool, reason: str) -> PickerFit:
    names = ENGINE_METRICS[engine]
    path = ENGINES[engine].metrics_path
    return PickerFit(prefix_reuse, path, names.waiting[0], names.running[0], names.kv_usage[0], reason)


PICKER_FITS: Final[Mapping[str, PickerFit]] = {
    EngineName.VLLM: _fit(EngineName.VLLM, True, "vLLM reuses cached prefixes (automatic prefix caching)"),
    EngineName.SGLANG: _fit(EngineName.SGLANG, True, "SGLang reuses cached prefixes (RadixAttention)"),
    EngineName.TRTLLM: _fit(
        EngineName.TRTLLM,
        False,
        "TensorRT-LLM's MiniMax-M3 path has no KV block reuse, so a repeated prefix is prefilled again wherever it "
        "lands: no prefix-cache scorer",
    ),
}

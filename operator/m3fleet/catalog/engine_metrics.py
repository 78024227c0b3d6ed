"""Where each pinned engine exports each serving signal on Prometheus: the one home of engine metric
names. The autoscaler's Prometheus adapter (`m3fleet.autoscaling.prometheus`) queries them and the chart
generator builds the Grafana dashboard from them.

Sources: VLLM-MET (vllm 0.33.0 `vllm/v1/metrics/loggers.py`), SGL-MET (sglang 0.5.23
`srt/observability/metrics_collector.py`), TRT-MET (TensorRT-LLM `tensorrt_llm/metrics/collector.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

Names = tuple[str, ...]


@dataclass(frozen=True)
class EngineMetrics:
    """Where one engine keeps each signal. Each tuple: the current name, then older spellings (if any
    the pinned release still exports; names it no longer exports are dropped, not kept as fallbacks)."""

    engine: str
    running: Names
    waiting: Names
    kv_usage: Names
    prompt_tokens: Names  # counters
    generation_tokens: Names
    finished: Names  # a counter, or a histogram's _count
    e2e_latency: Names  # histogram base names: seconds from arrival to the last token
    ttft: Names  # histogram base names
    queue_time: Names  # histogram: seconds a request waited before it was scheduled
    # histogram, one observation per request: its mean seconds per output token after the first
    # ((finished - first token) / (output tokens - 1)): the request's inter-token latency
    time_per_output_token: Names = ()
    prompt_histogram: Names = ()
    # histogram, one observation per request: seconds from its first scheduling to its first token, the engine's own
    # clock (no queue wait, no API-server time); observed at finish as the prompt histogram is (vLLM), or when the
    # prefill ends (SGLang's per-stage histogram, whose series `prefill_time_labels` select)
    prefill_time: Names = ()
    prefill_time_labels: tuple[tuple[str, str], ...] = ()
    prefill_time_at_first_token: bool = False  # observed when the prefill ends (SGLang), not at finish (vLLM)
    preemptions: Names = ()
    kv_used: Names = ()  # resident KV per rank, in tokens (or blocks, see block_size)
    capacity: Names = ()  # KV capacity per rank, in tokens (or blocks)
    capacity_info: str | None = None  # vLLM's info metric (labels kv_cache_size_tokens, num_gpu_blocks, block_size)
    block_size: Names = ()  # tokens per KV block when kv_used / capacity count blocks (TRT-LLM)
    rank_label: str | None = None  # the label that tells a replica's DP ranks (KV pools) apart
    # Speculative decoding: counters of accepted draft tokens and of drafts (one per target forward pass of a
    # request), whose ratio + 1 is the mean acceptance length; or a gauge of that length itself.
    spec_accepted_tokens: Names = ()
    spec_drafts: Names = ()
    spec_acceptance_length: Names = ()


VLLM: Final = EngineMetrics(
    engine="vllm",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc",),  # gpu_cache_usage_perc was removed in 0.12
    prompt_tokens=("vllm:prompt_tokens_total",),
    generation_tokens=("vllm:generation_tokens_total",),
    finished=("vllm:request_success_total",),
    e2e_latency=("vllm:e2e_request_latency_seconds",),
    ttft=("vllm:time_to_first_token_seconds",),
    queue_time=("vllm:request_queue_time_seconds",),
    time_per_output_token=("vllm:request_time_per_output_token_seconds",),
    prompt_histogram=("vllm:request_prompt_tokens",),
    # vllm/v1/metrics/stats.py: prefill_time = first_token_ts - scheduled_ts (engine-core timestamps, at finish)
    prefill_time=("vllm:request_prefill_time_seconds",),
    preemptions=("vllm:num_preemptions_total",),
    capacity_info="vllm:cache_config_info",
    rank_label="engine",
    # vllm/v1/spec_decode/metrics.py (counters vllm:spec_decode_num_accepted_tokens and _num_drafts; vLLM's own log
    # line reports the mean acceptance length as 1 + accepted / drafts)
    spec_accepted_tokens=("vllm:spec_decode_num_accepted_tokens_total",),
    spec_drafts=("vllm:spec_decode_num_drafts_total",),
)
SGLANG: Final = EngineMetrics(
    engine="sglang",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
    finished=("sglang:e2e_request_latency_seconds_count",),
    e2e_latency=("sglang:e2e_request_latency_seconds",),
    ttft=("sglang:time_to_first_token_seconds",),
    queue_time=("sglang:queue_time_seconds",),
    time_per_output_token=("sglang:request_time_per_output_token_seconds",),
    prompt_histogram=("sglang:prompt_tokens_histogram",),
    # srt/observability/req_time_stats.py: stage "prefill_forward" = prefill finished - first forward entry (kept
    # across chunks: the whole prefill), observed once per request when its prefill ends
    prefill_time=("sglang:per_stage_req_latency_seconds",),
    prefill_time_labels=(("stage", "prefill_forward"),),
    prefill_time_at_first_token=True,
    preemptions=("sglang:num_retracted_requests_total",),
    kv_used=("sglang:num_used_tokens",),
    capacity=("sglang:max_total_num_tokens",),
    rank_label="dp_rank",
    # SGL-MET: "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward)"
    spec_acceptance_length=("sglang:spec_accept_length",),
)
# TRT-LLM's Prometheus endpoint is /prometheus/metrics (its /metrics is a JSON queue), names with the
# trtllm_ prefix; KV gauges need `enable_iter_perf_stats`. It counts KV in blocks of its own size.
TRTLLM: Final = EngineMetrics(
    engine="trtllm",
    running=("trtllm_num_requests_running",),
    waiting=("trtllm_num_requests_waiting",),
    kv_usage=("trtllm_kv_cache_utilization",),
    prompt_tokens=("trtllm_prompt_tokens_total",),
    generation_tokens=("trtllm_generation_tokens_total",),
    finished=("trtllm_request_success_total",),
    e2e_latency=("trtllm_e2e_request_latency_seconds",),
    ttft=("trtllm_time_to_first_token_seconds",),
    queue_time=("trtllm_request_queue_time_seconds",),
    kv_used=("trtllm_kv_cache_used_blocks",),
    capacity=("trtllm_kv_cache_max_blocks",),
    block_size=("trtllm_kv_cache_tokens_per_block",),
)
ENGINE_METRICS: Final[Mapping[str, EngineMetrics]] = {m.engine: m for m in (VLLM, SGLANG, TRTLLM)}

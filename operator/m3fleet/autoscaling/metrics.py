"""Prometheus adapters: one per engine, each reads one `MetricsSnapshot`. The only I/O in autoscaling.

`PrometheusAdapter.for_engine("vllm", url, selector={...}).read()` runs a fixed set of instant
queries (all at one evaluation time) and folds the results into a `ReplicaSignals` per replica,
grouped by `replica_label` (default `pod`; for a multi-node replica that is its leader, the only
pod that serves metrics). Engine data-parallel ranks (vLLM's `engine` label, SGLang's `dp_rank`)
are summed per replica; KV usage is capacity-weighted.

Names move between engine releases, so every signal lists its current name first and older
spellings after it, queried as `new or old` (PromQL drops the right side wherever the left has the
same labels): vLLM's `kv_cache_usage_perc` falls back to `gpu_cache_usage_perc` (renamed in 0.9.2,
removed in 0.12). `queryOverrides` replaces a signal's query with the user's PromQL; `$selector`,
`$window` and `$by` are substituted and the result must carry the replica label.

Errors never raise: an unreachable Prometheus gives a snapshot with `error` set; a failing or
empty optional query leaves that signal `None`; a target whose last scrape failed is `up=False`.
The policy holds on all of these.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from string import Template
from typing import Any, Final, TypeVar

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from m3fleet.autoscaling.signals import (
    HISTOGRAM_WINDOW_SECONDS,
    RATE_WINDOW_SECONDS,
    Histogram,
    MetricsSnapshot,
    ReplicaSignals,
)

Names = tuple[str, ...]
Q = TypeVar("Q")
V = TypeVar("V")


@dataclass(frozen=True)
class EngineMetrics:
    """Where one engine keeps each signal. Each tuple: the current name, then older spellings."""

    engine: str
    running: Names
    waiting: Names
    kv_usage: Names
    prompt_tokens: Names  # counters
    generation_tokens: Names
    finished: Names  # a counter, or a histogram's _count
    ttft: Names  # histogram base names
    prompt_histogram: Names = ()
    preemptions: Names = ()
    kv_used: Names = ()  # resident KV, in `kv_unit_tokens` units
    capacity: Names = ()  # KV capacity, in `kv_unit_tokens` units
    capacity_info: str | None = None  # an info metric carrying num_gpu_blocks and block_size labels
    kv_unit_tokens: float = 1.0  # tokens per unit of kv_used / capacity (TRT-LLM counts blocks)


VLLM: Final = EngineMetrics(
    engine="vllm",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    prompt_tokens=("vllm:prompt_tokens_total",),
    generation_tokens=("vllm:generation_tokens_total",),
    finished=("vllm:request_success_total",),
    ttft=("vllm:time_to_first_token_seconds",),
    prompt_histogram=("vllm:request_prompt_tokens",),
    preemptions=("vllm:num_preemptions_total",),
    capacity_info="vllm:cache_config_info",
)
SGLANG: Final = EngineMetrics(
    engine="sglang",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
    finished=("sglang:e2e_request_latency_seconds_count",),
    ttft=("sglang:time_to_first_token_seconds",),
    prompt_histogram=("sglang:prompt_tokens_histogram",),  # newer builds only
    kv_used=("sglang:num_used_tokens",),
    capacity=("sglang:max_total_num_tokens",),
)
# TRT-LLM's Prometheus endpoint is /prometheus/metrics (its /metrics is a JSON queue), names with the
# trtllm_ prefix; KV gauges need `enable_iter_perf_stats`. It counts KV in blocks of tokens_per_block.
TRTLLM_TOKENS_PER_BLOCK: Final = 32.0
TRTLLM: Final = EngineMetrics(
    engine="trtllm",
    running=("trtllm_num_requests_running",),
    waiting=("trtllm_num_requests_waiting",),
    kv_usage=("trtllm_kv_cache_utilization",),
    prompt_tokens=("trtllm_prompt_tokens_total",),
    generation_tokens=("trtllm_generation_tokens_total",),
    finished=("trtllm_request_success_total",),
    ttft=("trtllm_time_to_first_token_seconds",),
    kv_used=("trtllm_kv_cache_used_blocks",),
    capacity=("trtllm_kv_cache_max_blocks",),
    kv_unit_tokens=TRTLLM_TOKENS_PER_BLOCK,
)
ENGINES: Final[Mapping[str, EngineMetrics]] = {m.engine: m for m in (VLLM, SGLANG, TRTLLM)}

# Signals `queryOverrides` may replace (each must return one series per replica).
OVERRIDABLE: Final = (
    "up",
    "sampleTime",
    "running",
    "waiting",
    "kvUsage",
    "kvUsedTokens",
    "kvCapacityTokens",
    "promptTokensRate",
    "generationTokensRate",
    "firstTokenRate",
    "finishedRate",
    "preemptionRate",
)


def selector_string(selector: Mapping[str, str]) -> str:
    """`{k="v",...}` with PromQL string escaping; `{}` when empty."""
    parts = []
    for key, value in sorted(selector.items()):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{key}="{escaped}"')
    return "{" + ",".join(parts) + "}"


@dataclass(frozen=True)
class Queries:
    """The PromQL one adapter runs, built once from the engine's names."""

    scalars: dict[str, str]  # signal -> query returning one value per replica
    histograms: dict[str, tuple[str, str, str]]  # signal -> (buckets by le, sum, count)
    capacity_info: str | None


def build_queries(
    metrics: EngineMetrics,
    selector: Mapping[str, str],
    by: str,
    rate_window: float,
    histogram_window: float,
    overrides: Mapping[str, str] | None = None,
) -> Queries:
    sel = selector_string(selector)
    rw, hw = f"{int(rate_window)}s", f"{int(histogram_window)}s"

    def either(names: Names, wrap: Callable[[str], str] = lambda s: s) -> str:
        return " or ".join(wrap(f"{n}{sel}") for n in names)

    def gauge(names: Names, agg: str = "sum") -> str:
        return f"{agg} by ({by}) ({either(names)})"

    def rate(names: Names) -> str:
        return f"sum by ({by}) ({either(names, lambda s: f'rate({s}[{rw}])')})"

    scalars = {
        "up": f"max by ({by}) (up{sel})",
        "sampleTime": f"max by ({by}) (timestamp({either(metrics.running)}))",
        "running": gauge(metrics.running),
        "waiting": gauge(metrics.waiting),
        "kvUsage": gauge(metrics.kv_usage, "avg"),
        "promptTokensRate": rate(metrics.prompt_tokens),
        "generationTokensRate": rate(metrics.generation_tokens),
        "firstTokenRate": rate(tuple(f"{n}_count" for n in metrics.ttft)),
        "finishedRate": rate(metrics.finished),
    }
    if metrics.preemptions:
        scalars["preemptionRate"] = rate(metrics.preemptions)
    if metrics.kv_used:
        scalars["kvUsedTokens"] = gauge(metrics.kv_used)
    if metrics.capacity:
        scalars["kvCapacityTokens"] = gauge(metrics.capacity)

    def histogram(names: Names) -> tuple[str, str, str]:
        def part(suffix: str, extra: str = "") -> str:
            inner = either(tuple(f"{n}_{suffix}" for n in names), lambda s: f"increase({s}[{hw}])")
            return f"sum by ({by}{extra}) ({inner})"

        return part("bucket", ", le"), part("sum"), part("count")

    histograms = {"ttftSeconds": histogram(metrics.ttft)}
    if metrics.prompt_histogram:
        histograms["promptTokens"] = histogram(metrics.prompt_histogram)

    for name, template in (overrides or {}).items():
        if name in OVERRIDABLE:
            scalars[name] = Template(template).safe_substitute(selector=sel, window=rw, by=by)
    info = f"{metrics.capacity_info}{sel}" if metrics.capacity_info else None
    return Queries(scalars=scalars, histograms=histograms, capacity_info=info)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@dataclass
class PrometheusAdapter:
    """Reads one deployment's engine metrics from Prometheus."""

    url: str
    metrics: EngineMetrics
    selector: Mapping[str, str] = field(default_factory=dict)
    replica_label: str = "pod"
    rate_window: float = RATE_WINDOW_SECONDS
    histogram_window: float = HISTOGRAM_WINDOW_SECONDS
    overrides: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: float = 5.0
    client: Any = None  # a PrometheusConnect; built from `url` when None

    @classmethod
    def for_engine(cls, engine: str, url: str, **kwargs: Any) -> PrometheusAdapter:
        """`engine` is the spec's engine name (vllm, sglang, trtllm)."""
        if engine not in ENGINES:
            raise ValueError(f"no metrics adapter for engine {engine!r}; known: {', '.join(ENGINES)}")
        return cls(url=url, metrics=ENGINES[engine], **kwargs)

    def queries(self) -> Queries:
        return build_queries(
            self.metrics, self.selector, self.replica_label, self.rate_window, self.histogram_window, self.overrides
        )

    def _client(self) -> Any:
        if self.client is None:
            # One quick retry: a tick that cannot read metrics holds, and the next tick tries again.
            retry = Retry(total=1, backoff_factor=0.1, status_forcelist=(502, 503, 504))
            self.client = PrometheusConnect(url=self.url, disable_ssl=True, retry=retry, timeout=self.timeout_seconds)
        return self.client

    def _query(self, query: str, at: float) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._client().custom_query(
            query, params={"time": at, "timeout": f"{self.timeout_seconds:g}s"}
        )
        return result

    def _by_replica(self, query: str, at: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for series in self._query(query, at):
            replica = series.get("metric", {}).get(self.replica_label)
            value = _number(series.get("value", [None, None])[1])
            if replica is not None and value is not None:
                out[replica] = value
        return out

    def _histograms(self, queries: tuple[str, str, str], at: float) -> dict[str, Histogram]:
        buckets_q, sum_q, count_q = queries
        buckets: dict[str, dict[float, float]] = {}
        for series in self._query(buckets_q, at):
            labels = series.get("metric", {})
            replica, le = labels.get(self.replica_label), _number(labels.get("le"))
            if le is None and labels.get("le") == "+Inf":
                le = math.inf
            value = _number(series.get("value", [None, None])[1])
            if replica is not None and le is not None and value is not None:
                buckets.setdefault(replica, {})[le] = value
        sums, counts = self._by_replica(sum_q, at), self._by_replica(count_q, at)
        out = {}
        for replica, by_le in buckets.items():
            bounds = tuple(sorted(by_le))
            out[replica] = Histogram(
                bounds=bounds,
                cumulative=tuple(by_le[b] for b in bounds),
                total=sums.get(replica, 0.0),
                count=counts.get(replica, by_le.get(math.inf, 0.0)),
            )
        return out

    def _capacity_from_info(self, query: str, at: float) -> dict[str, float]:
        """vLLM's cache_config_info: KV tokens = num_gpu_blocks x block_size, summed over engines."""
        out: dict[str, float] = {}
        for series in self._query(query, at):
            labels = series.get("metric", {})
            replica = labels.get(self.replica_label)
            blocks, size = _number(labels.get("num_gpu_blocks")), _number(labels.get("block_size"))
            if replica is not None and blocks and size:
                out[replica] = out.get(replica, 0.0) + blocks * size
        return out

    def read(self, at: float | None = None) -> MetricsSnapshot:
        """One snapshot at `at` (Unix seconds; now when None). Never raises."""
        at = time.time() if at is None else at
        base = MetricsSnapshot(engine=self.metrics.engine, time=at, window_seconds=self.rate_window)
        queries = self.queries()
        try:
            up = self._by_replica(queries.scalars["up"], at)
        except Exception as exc:  # connection refused, timeout, HTTP 5xx, bad PromQL in an override
            return replace(base, error=f"prometheus at {self.url}: {type(exc).__name__}: {_short(exc)}")
        values: dict[str, dict[str, float]] = {
            name: _safe(self._by_replica, query, at) for name, query in queries.scalars.items() if name != "up"
        }
        histograms = {name: _safe(self._histograms, qs, at) for name, qs in queries.histograms.items()}
        if queries.capacity_info:
            info = _safe(self._capacity_from_info, queries.capacity_info, at)
            values.setdefault("kvCapacityTokens", {}).update(info)

        unit = self.metrics.kv_unit_tokens
        replicas = sorted(set(up) | set(values.get("running", {})) | set(values.get("kvUsage", {})))
        signals = []
        for name in replicas:

            def get(signal: str, replica: str = name) -> float | None:
                return values.get(signal, {}).get(replica)

            capacity, used = get("kvCapacityTokens"), get("kvUsedTokens")
            signals.append(
                ReplicaSignals(
                    replica=name,
                    up=up.get(name, 1.0) >= 1.0,
                    sample_time=get("sampleTime"),
                    kv_usage=get("kvUsage"),
                    kv_capacity_tokens=None if capacity is None else capacity * unit,
                    kv_used_tokens=None if used is None else used * unit,
                    running=get("running"),
                    waiting=get("waiting"),
                    prompt_tokens_rate=get("promptTokensRate"),
                    generation_tokens_rate=get("generationTokensRate"),
                    first_token_rate=get("firstTokenRate"),
                    finished_rate=get("finishedRate"),
                    preemption_rate=get("preemptionRate"),
                    prompt_tokens=histograms.get("promptTokens", {}).get(name),
                    ttft_seconds=histograms.get("ttftSeconds", {}).get(name),
                )
            )
        return replace(base, replicas=tuple(signals))


def _safe(read: Callable[[Q, float], dict[str, V]], query: Q, at: float) -> dict[str, V]:
    """Optional signals: a failing query leaves the signal unknown instead of failing the read."""
    try:
        return read(query, at)
    except Exception:
        return {}


def _short(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""Prometheus adapters: one per engine, each reads one `MetricsSnapshot`. The only I/O in autoscaling.

`PrometheusAdapter.for_engine("vllm", url, selector={...}).read()` runs a fixed set of instant
queries (all at one evaluation time) and folds the results into a `ReplicaSignals` per replica,
grouped by `replica_label` (default `pod`; for a multi-node replica, its leader: the series of its
worker pods, which export metrics on SGLang, are renamed to the leader's, `workers_of`).

Per-rank series are combined the way each pinned engine means them (read from its metrics code):

* **vLLM 0.33.0** (`vllm/v1/metrics/loggers.py`): every gauge carries `engine` (the DP rank); one
  engine is one KV pool. `vllm:cache_config_info` is one series per engine whose labels are the
  CacheConfig: `kv_cache_size_tokens` is that engine's capacity in tokens (group-aware), while
  `num_gpu_blocks` is already the sum over the DP engines the frontend talks to
  (`v1/engine/core_client.py`), so it is taken once per pod, never summed again.
* **SGLang 0.5.23** (`srt/observability/metrics_collector.py`): scheduler gauges carry `tp_rank`,
  `pp_rank`, `moe_ep_rank` and, with data-parallel attention, `dp_rank`. Every scheduler of one
  attention-TP group reports the same pool (with `--enable-metrics-for-all-schedulers` each TP rank
  repeats it), so a DP rank's value is one series (the max over its repeats) and a replica's is the
  sum over `dp_rank`. `max_total_num_tokens` and `num_used_tokens` are tokens; preemption is
  `num_retracted_requests_total`.
* **TensorRT-LLM** (`/prometheus/metrics`, `trtllm_` prefix): KV in blocks, converted with the
  exported `trtllm_kv_cache_tokens_per_block`; without it the capacity is unknown (never assumed).

Errors never raise: an unreachable Prometheus gives a snapshot with `error` set (a fixed message and at most
the HTTP status code: never anything the answer contained, which could be anything the URL serves); a failing or
empty optional query leaves that signal `None`; a target whose last scrape failed is `up=False`.
The policy holds on all of these. `queryOverrides` replaces a signal's query with the user's
PromQL; `$selector`, `$window` and `$by` are substituted and the result must carry the replica label.
"""

from __future__ import annotations

import json
import math
import re
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from m3fleet.autoscaling.promql import RANK_GAUGES, Gateway, Queries, build_queries, worker_pod_pattern
from m3fleet.autoscaling.signals import (
    HISTOGRAM_WINDOW_SECONDS,
    RATE_WINDOW_SECONDS,
    GatewaySignals,
    Histogram,
    MetricsSnapshot,
    ReplicaSignals,
)
from m3fleet.catalog.engine_metrics import ENGINE_METRICS, EngineMetrics

Q = TypeVar("Q")
V = TypeVar("V")


class PrometheusError(Exception):
    """A failed query, in words that contain nothing the server sent (status code at most)."""


# Prometheus's own `errorType` values: a fixed vocabulary, safe to repeat (its `error` text is not).
ERROR_TYPES: Final = frozenset({"bad_data", "timeout", "canceled", "execution", "internal", "unavailable", "not_found"})


@dataclass(frozen=True)
class Tls:
    """How https is verified: against `ca_pem` (a PEM bundle) when given, else the system CAs; not at all with
    `insecure_skip_verify` (the operator warns)."""

    ca_pem: str | None = None
    insecure_skip_verify: bool = False


class _ContextAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections verify with one SSLContext (a CA held in memory, never on disk)."""

    def __init__(self, context: ssl.SSLContext, **kwargs: Any) -> None:
        self._context = context
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ssl_context"] = self._context
        super().init_poolmanager(*args, **kwargs)

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        super().cert_verify(conn, url, verify, cert)
        conn.ca_certs = conn.ca_cert_dir = None  # only the context's CA: not also the system bundle


# One instant query's answer for one fleet is a few KiB; a cap keeps a wrong URL or selector from filling memory.
MAX_ANSWER_BYTES: Final = 16 * 2**20
ANSWER_CHUNK_BYTES: Final = 64 * 1024


class PrometheusHttp:
    """The one Prometheus call the adapter makes (an instant query), over http or verified https.

    Redirects are not followed (the URL is the user's, and a redirect could point anywhere), and no failure
    carries the answer's body: `PrometheusError` says what went wrong in fixed words and the status code.
    """

    def __init__(self, url: str, tls: Tls = Tls(), timeout: float = 5.0, retry: Retry | None = None) -> None:
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme not in ("http", "https"):
            raise PrometheusError("the URL must start with http:// or https://")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.trust_env = False  # no proxies or CA bundles from the environment: the spec says where
        adapter: HTTPAdapter
        if tls.ca_pem is not None:
            try:
                context = ssl.create_default_context(cadata=tls.ca_pem)
            except (ssl.SSLError, ValueError):
                raise PrometheusError("the CA in caSecretRef is not a PEM certificate") from None
            adapter = _ContextAdapter(context, max_retries=retry or 0)
        else:
            adapter = HTTPAdapter(max_retries=retry or 0)
        self.session.verify = not tls.insecure_skip_verify
        if tls.insecure_skip_verify:  # the operator warns once (an Event and its log), not on every request
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self.session.mount("https://", adapter)
        self.session.mount("http://", HTTPAdapter(max_retries=retry or 0))

    def custom_query(self, query: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        try:
            response = self.session.get(
                f"{self.url}/api/v1/query",
                params={"query": query, **(params or {})},
                timeout=self.timeout,
                allow_redirects=False,
                stream=True,  # read below within a size and time budget; `timeout` bounds each socket read only
            )
            content = self._body(response)
        except requests.exceptions.SSLError:
            raise PrometheusError(
                "TLS verification failed (certificate not signed by a trusted CA, or not for this host name): "
                "set caSecretRef to the CA that signed Prometheus's certificate"
            ) from None
        except requests.exceptions.Timeout:
            raise PrometheusError(f"no answer within {self.timeout:g}s") from None
        except requests.exceptions.RequestException:
            raise PrometheusError("cannot connect") from None
        status = response.status_code
        if 300 <= status < 400:
            raise PrometheusError(f"HTTP {status}: redirects are not followed; set url to Prometheus itself")
        try:
            answer = json.loads(content)
        except (ValueError, UnicodeDecodeError):
            answer = None
        if not isinstance(answer, dict) or answer.get("status") not in ("success", "error"):
            raise PrometheusError(
                f"HTTP {status}: the answer is not from the Prometheus query API (is url its base URL?)"
            )
        if status != 200 or answer["status"] != "success":
            kind = answer.get("errorType")
            detail = f" ({kind})" if kind in ERROR_TYPES else ""
            raise PrometheusError(f"HTTP {status}: Prometheus refused the query{detail}")
        data = answer.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list):
            raise PrometheusError(f"HTTP {status}: the answer has no query result")
        return [r for r in result if isinstance(r, dict)]

    def _body(self, response: requests.Response) -> bytes:
        """The whole answer, or PrometheusError when it is larger than MAX_ANSWER_BYTES or takes more than twice the
        timeout to arrive (a server that trickles bytes would otherwise hold the tick for ever)."""
        deadline = time.monotonic() + 2 * self.timeout
        chunks: list[bytes] = []
        size = 0
        with response:
            while chunk := response.raw.read1(ANSWER_CHUNK_BYTES, decode_content=True):  # what has arrived
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise PrometheusError(
                        f"the answer is larger than {MAX_ANSWER_BYTES // 2**20} MiB: narrow the queries "
                        "(spec.autoscaling.prometheus.queryOverrides) or the fleet's label selector"
                    )
                if time.monotonic() > deadline:
                    raise PrometheusError(f"no whole answer within {2 * self.timeout:g}s")
                chunks.append(chunk)
        return b"".join(chunks)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


RankValues = dict[str, dict[str, float]]  # replica -> rank label value ("" when none) -> value


@dataclass(frozen=True)
class RankCapacity:
    """KV capacity a replica's engines report: per rank (DP engine) where known, else the replica's total."""

    per_rank: dict[str, float] = field(default_factory=dict)
    total: float | None = None  # a replica-wide figure (vLLM's num_gpu_blocks x block_size, already summed)


def combine_replica(
    replica: str,
    ranks: Mapping[str, RankValues],
    capacity: RankCapacity | None,
    block_tokens: float | None,
    in_tokens: frozenset[str] = frozenset(),
) -> dict[str, float | int | None]:
    """One replica's pool signals from its per-rank values (pure; see the module docstring).

    `block_tokens`: None when the engine counts tokens; tokens per block when it counts blocks (NaN
    when it does not say how large a block is: then no token count is derived). `in_tokens`: the KV
    signals given in tokens whatever the engine counts (queryOverrides say tokens).

    Returns running, waiting (sums over ranks), kvCapacityTokens (sum over ranks), kvCapacityPerRank
    (the largest rank), kvUsedTokens (sum over ranks: the engine's own count, else usage x capacity),
    kvUsage (used / capacity, else the mean of the ranks' usage) and ranks (how many KV pools).
    """

    def values(signal: str) -> dict[str, float]:
        return dict(ranks.get(signal, {}).get(replica, {}))

    running, waiting, usage = values("running"), values("waiting"), values("kvUsage")
    used_raw, cap_raw = values("kvUsedTokens"), values("kvCapacityTokens")
    unit = 1.0 if block_tokens is None else block_tokens  # NaN: blocks of a size the engine did not export
    cap_unit = 1.0 if "kvCapacityTokens" in in_tokens else unit
    used_unit = 1.0 if "kvUsedTokens" in in_tokens else unit
    caps = {r: v * cap_unit for r, v in cap_raw.items() if v > 0 and math.isfinite(v * cap_unit)}
    if capacity is not None:
        caps = {**capacity.per_rank, **caps} if capacity.per_rank else caps
    rank_names = sorted(set(running) | set(waiting) | set(usage) | set(caps) | set(used_raw))
    total_cap: float | None = sum(caps.values()) if caps else None
    if total_cap is None and capacity is not None and capacity.total:
        total_cap = capacity.total
    per_rank: float | None = max(caps.values()) if caps else None
    if per_rank is None and total_cap is not None:
        per_rank = total_cap / max(1, len(rank_names))
    used: float | None = None
    if used_raw and math.isfinite(used_unit):
        used = sum(v * used_unit for v in used_raw.values())
    elif usage and caps and set(usage) <= set(caps):
        used = sum(u * caps[r] for r, u in usage.items())
    elif usage and total_cap is not None:
        used = sum(usage.values()) / len(usage) * total_cap
    kv_usage: float | None = None
    if used is not None and total_cap:
        kv_usage = used / total_cap
    elif usage:
        kv_usage = sum(usage.values()) / len(usage)
    return {
        "running": sum(running.values()) if running else None,
        "waiting": sum(waiting.values()) if waiting else None,
        "kvUsage": kv_usage,
        "kvUsedTokens": used,
        "kvCapacityTokens": total_cap,
        "kvCapacityPerRank": per_rank,
        "ranks": len(rank_names) or None,
    }


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
    gateway: Gateway | None = None
    # A multi-node fleet's LeaderWorkerSet: its worker pods' series count for their leader (SGLang's worker nodes
    # export their own DP ranks). A `queryOverrides` answer is taken for the leaders only.
    workers_of: str | None = None
    timeout_seconds: float = 5.0
    tls: Tls = field(default_factory=Tls)
    client: Any = (
        None  # anything with custom_query(query, params) (e.g. a PrometheusConnect); built from `url` when None
    )

    @classmethod
    def for_engine(cls, engine: str, url: str, **kwargs: Any) -> PrometheusAdapter:
        """`engine` is the spec's engine name (vllm, sglang, trtllm)."""
        if engine not in ENGINE_METRICS:
            raise ValueError(f"no metrics adapter for engine {engine!r}; known: {', '.join(ENGINE_METRICS)}")
        return cls(url=url, metrics=ENGINE_METRICS[engine], **kwargs)

    def queries(self) -> Queries:
        return build_queries(
            self.metrics,
            self.selector,
            self.replica_label,
            self.rate_window,
            self.histogram_window,
            self.overrides,
            self.workers_of,
        )

    def _client(self) -> Any:
        if self.client is None:
            # One quick retry: a tick that cannot read metrics holds, and the next tick tries again.
            # Never Retry-After: urllib3 would sleep as long as the answer asks (up to 6 h), holding the tick.
            retry = Retry(
                total=1,
                backoff_factor=0.1,
                status_forcelist=(502, 503, 504),
                raise_on_status=False,
                respect_retry_after_header=False,
            )
            self.client = PrometheusHttp(self.url, self.tls, self.timeout_seconds, retry)
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

    def _by_rank(self, query: str, at: float) -> dict[str, dict[str, float]]:
        rank = self.metrics.rank_label
        out: dict[str, dict[str, float]] = {}
        for series in self._query(query, at):
            labels = series.get("metric", {})
            replica = labels.get(self.replica_label)
            value = _number(series.get("value", [None, None])[1])
            if replica is not None and value is not None:
                out.setdefault(replica, {})[str(labels.get(rank, "")) if rank else ""] = value
        return out

    def _value(self, query: str, at: float) -> float | None:
        """A query answering one series without labels (an aggregate); None when it answers nothing."""
        series = self._query(query, at)
        return _number(series[0].get("value", [None, None])[1]) if len(series) == 1 else None

    def _gateway(self, at: float) -> GatewaySignals | None:
        if self.gateway is None:
            return None
        values = {}
        for name, query in self.gateway.queries(self.rate_window).items():
            try:
                values[name] = self._value(query, at)
            except Exception:
                values[name] = None  # optional, like every signal but `up`: unknown, not zero
        return GatewaySignals(**values)

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

    def _capacity_from_info(self, query: str, at: float) -> dict[str, RankCapacity]:
        """vLLM's cache_config_info, one series per engine: `kv_cache_size_tokens` is that engine's
        capacity; `num_gpu_blocks` x `block_size` is the frontend's total over its engines (taken once)."""
        per_rank: dict[str, dict[str, float]] = {}
        totals: dict[str, float] = {}
        for series in self._query(query, at):
            labels = series.get("metric", {})
            replica = labels.get(self.replica_label)
            if replica is None:
                continue
            engine = str(labels.get(self.metrics.rank_label or "", ""))
            tokens = _number(labels.get("kv_cache_size_tokens"))
            if tokens:
                per_rank.setdefault(replica, {})[engine] = tokens
            blocks, size = _number(labels.get("num_gpu_blocks")), _number(labels.get("block_size"))
            if blocks and size:
                totals[replica] = max(totals.get(replica, 0.0), blocks * size)
        return {
            replica: RankCapacity(per_rank=per_rank.get(replica, {}), total=totals.get(replica))
            for replica in set(per_rank) | set(totals)
        }

    def read(self, at: float | None = None) -> MetricsSnapshot:
        """One snapshot at `at` (Unix seconds; now when None). Never raises."""
        at = time.time() if at is None else at
        base = MetricsSnapshot(engine=self.metrics.engine, time=at, window_seconds=self.rate_window)
        queries = self.queries()
        try:
            up = self._by_replica(queries.scalars["up"], at)
        except PrometheusError as exc:  # connection refused, timeout, TLS, HTTP 5xx, bad PromQL in an override
            return replace(base, error=f"prometheus at {self.url}: {exc}")
        except Exception as exc:  # anything else: its name only (its text could quote the answer)
            return replace(base, error=f"prometheus at {self.url}: {type(exc).__name__}")
        ranks: dict[str, RankValues] = {}
        values: dict[str, dict[str, float]] = {}
        for name, query in queries.scalars.items():
            if name == "up":
                continue
            if name in RANK_GAUGES and name not in queries.overridden:
                ranks[name] = _safe(self._by_rank, query, at)
            else:
                values[name] = _safe(self._by_replica, query, at)
        for name, by_replica in values.items():  # an override gives one value per replica: one "rank"
            if name in RANK_GAUGES:
                ranks[name] = {replica: {"": v} for replica, v in by_replica.items()}
        histograms = {name: _safe(self._histograms, qs, at) for name, qs in queries.histograms.items()}
        info = _safe(self._capacity_from_info, queries.capacity_info, at) if queries.capacity_info else {}

        replicas = sorted(set(up) | set(ranks.get("running", {})) | set(ranks.get("kvUsage", {})))
        if self.workers_of is not None:  # only in an override's answer: the built-in queries name the leader
            worker = re.compile(worker_pod_pattern(self.workers_of))
            replicas = [name for name in replicas if not worker.fullmatch(name)]
        signals = []
        for name in replicas:

            def get(signal: str, replica: str = name) -> float | None:
                return values.get(signal, {}).get(replica)

            sizes = ranks.get("blockSize", {}).get(name, {})
            block_tokens = max(sizes.values()) if sizes else None
            if self.metrics.block_size and block_tokens is None:
                block_tokens = math.nan  # blocks of unknown size: no token counts (but from an override)
            pool = combine_replica(name, ranks, info.get(name), block_tokens, queries.overridden)
            signals.append(
                ReplicaSignals(
                    replica=name,
                    up=up.get(name, 1.0) >= 1.0,
                    sample_time=get("sampleTime"),
                    scrapes_in_window=get("scrapesInWindow"),
                    kv_usage=_opt(pool["kvUsage"]),
                    kv_capacity_tokens=_opt(pool["kvCapacityTokens"]),
                    kv_capacity_tokens_per_rank=_opt(pool["kvCapacityPerRank"]),
                    kv_ranks=None if pool["ranks"] is None else int(pool["ranks"]),
                    kv_used_tokens=_opt(pool["kvUsedTokens"]),
                    running=_opt(pool["running"]),
                    waiting=_opt(pool["waiting"]),
                    prompt_tokens_rate=get("promptTokensRate"),
                    generation_tokens_rate=get("generationTokensRate"),
                    first_token_rate=get("firstTokenRate"),
                    finished_rate=get("finishedRate"),
                    preemption_rate=get("preemptionRate"),
                    prompt_tokens=histograms.get("promptTokens", {}).get(name),
                    ttft_seconds=histograms.get("ttftSeconds", {}).get(name),
                    queue_seconds=histograms.get("queueSeconds", {}).get(name),
                    prefill_seconds=histograms.get("prefillSeconds", {}).get(name),
                    itl_seconds=histograms.get("itlSeconds", {}).get(name),
                    acceptance_length=acceptance_length(
                        get("specAcceptedRate"), get("specDraftRate"), get("specAcceptanceLength")
                    ),
                )
            )
        return replace(base, replicas=tuple(signals), gateway=self._gateway(at))


def acceptance_length(accepted_rate: float | None, draft_rate: float | None, gauge: float | None) -> float | None:
    """Tokens a target forward pass emits: 1 + accepted draft tokens per draft (vLLM's counters), else the engine's
    own gauge (SGLang); None without drafts in the window."""
    if accepted_rate is not None and draft_rate:
        return 1.0 + accepted_rate / draft_rate
    return gauge if gauge and math.isfinite(gauge) else None


def _opt(value: float | int | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _safe(read: Callable[[Q, float], dict[str, V]], query: Q, at: float) -> dict[str, V]:
    """Optional signals: a failing query leaves the signal unknown instead of failing the read."""
    try:
        return read(query, at)
    except Exception:
        return {}

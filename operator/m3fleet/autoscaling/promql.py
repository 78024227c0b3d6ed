"""The PromQL an engine's adapter runs, built from the engine's metric names (`build_queries`), the user's
`queryOverrides` and a gateway's request sizes (`Gateway`). Pure: strings in, strings out; the adapter that runs
them is `m3fleet.autoscaling.prometheus`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from string import Template
from typing import Final

from m3fleet.catalog.engine_metrics import EngineMetrics, Names

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
# Per-rank gauges: queried by replica and rank, then combined per replica (see the module docstring).
RANK_GAUGES: Final = ("running", "waiting", "kvUsage", "kvUsedTokens", "kvCapacityTokens", "blockSize")


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

    scalars: dict[str, str]  # signal -> query returning one value per replica (or per replica and rank)
    histograms: dict[str, tuple[str, str, str]]  # signal -> (buckets by le, sum, count)
    capacity_info: str | None
    rank_label: str | None = None  # set when the RANK_GAUGES in `scalars` are grouped by replica and rank
    overridden: frozenset[str] = frozenset()  # signals replaced by queryOverrides (one series per replica)


def build_queries(
    metrics: EngineMetrics,
    selector: Mapping[str, str],
    by: str,
    rate_window: float,
    histogram_window: float,
    overrides: Mapping[str, str] | None = None,
    workers_of: str | None = None,
) -> Queries:
    """`workers_of` names a LeaderWorkerSet whose worker pods export metrics too: their series count for their
    group's leader (see `worker_pod_pattern`)."""
    sel = selector_string(selector)
    rw, hw = f"{int(rate_window)}s", f"{int(histogram_window)}s"
    rank_by = f"{by}, {metrics.rank_label}" if metrics.rank_label else by

    def either(names: Names, wrap: Callable[[str], str] = lambda s: s, series: str = sel) -> str:
        # Each pod's series first (the wrap: a rate, a timestamp), then renamed to their replica: a function of a
        # renamed vector would no longer see the samples' own timestamps.
        return replica_of(" or ".join(wrap(f"{n}{series}") for n in names))

    def replica_of(vector: str) -> str:
        if workers_of is None:
            return vector
        # The pod's own name kept aside first: a leader's and its worker's series must stay two series.
        pod = f'label_replace({vector}, "{POD_KEPT_AS}", "$1", "{by}", "(.+)")'
        return f'label_replace({pod}, "{by}", "$1", "{by}", "{worker_pod_pattern(workers_of)}")'

    def rank_gauge(names: Names) -> str:
        # One value per (replica, rank): TP ranks of one pool repeat it, so the max is that value.
        return f"max by ({rank_by}) ({either(names)})"

    # Counters: the max per (replica, rank) first, then the sum over ranks. A pod scraped by two jobs (the chart's
    # PodMonitor and annotation-based discovery) has two copies of each series, which a plain sum would double.
    def rate(names: Names) -> str:
        return f"sum by ({by}) (max by ({rank_by}) ({either(names, lambda s: f'rate({s}[{rw}])')}))"

    scrapes = " or ".join(f"count_over_time({n}{sel}[{rw}])" for n in metrics.running)
    scalars = {
        # A replica is up when each of its pods is (a pod scraped by two jobs: when either scrape works).
        "up": f"min by ({by}) ({replica_of(f'max by ({by}) (up{sel})')})",
        "sampleTime": f"max by ({by}) ({either(metrics.running, lambda s: f'timestamp({s})')})",
        # Scrapes per rate window: with fewer than two, every rate() is empty (a 1-minute scrape interval). The
        # fewest of a replica's pods (each pod's most: two jobs scraping it), since any pod short of two lacks rates.
        "scrapesInWindow": f"min by ({by}) ({replica_of(f'max by ({by}) ({scrapes})')})",
        "running": rank_gauge(metrics.running),
        "waiting": rank_gauge(metrics.waiting),
        "kvUsage": rank_gauge(metrics.kv_usage),
        "promptTokensRate": rate(metrics.prompt_tokens),
        "generationTokensRate": rate(metrics.generation_tokens),
        "firstTokenRate": rate(tuple(f"{n}_count" for n in metrics.ttft)),
        "finishedRate": rate(metrics.finished),
    }
    if metrics.preemptions:
        scalars["preemptionRate"] = rate(metrics.preemptions)
    if metrics.kv_used:
        scalars["kvUsedTokens"] = rank_gauge(metrics.kv_used)
    if metrics.capacity:
        scalars["kvCapacityTokens"] = rank_gauge(metrics.capacity)
    if metrics.block_size:
        scalars["blockSize"] = rank_gauge(metrics.block_size)
    if metrics.spec_accepted_tokens and metrics.spec_drafts:
        scalars["specAcceptedRate"] = rate(metrics.spec_accepted_tokens)
        scalars["specDraftRate"] = rate(metrics.spec_drafts)
    if metrics.spec_acceptance_length:
        scalars["specAcceptanceLength"] = f"avg by ({by}) ({either(metrics.spec_acceptance_length)})"

    def histogram(names: Names, labels: tuple[tuple[str, str], ...] = ()) -> tuple[str, str, str]:
        series = selector_string({**selector, **dict(labels)})  # `labels`: one histogram among several (a stage)

        def part(suffix: str, extra: str = "") -> str:
            inner = either(tuple(f"{n}_{suffix}" for n in names), lambda s: f"increase({s}[{hw}])", series)
            return f"sum by ({by}{extra}) (max by ({rank_by}{extra}) ({inner}))"  # as `rate`: one copy per scrape

        return part("bucket", ", le"), part("sum"), part("count")

    histograms = {"ttftSeconds": histogram(metrics.ttft), "queueSeconds": histogram(metrics.queue_time)}
    if metrics.prompt_histogram:
        histograms["promptTokens"] = histogram(metrics.prompt_histogram)
    if metrics.time_per_output_token:
        histograms["itlSeconds"] = histogram(metrics.time_per_output_token)
    if metrics.prefill_time:
        histograms["prefillSeconds"] = histogram(metrics.prefill_time, metrics.prefill_time_labels)

    overridden = set()
    for name, template in (overrides or {}).items():
        if name in OVERRIDABLE:
            scalars[name] = Template(template).safe_substitute(selector=sel, window=rw, by=by)
            overridden.add(name)
    info = replica_of(f"{metrics.capacity_info}{sel}") if metrics.capacity_info else None
    return Queries(
        scalars=scalars,
        histograms=histograms,
        capacity_info=info,
        rank_label=metrics.rank_label,
        overridden=frozenset(overridden),
    )


POD_KEPT_AS: Final = "m3fleet_pod"  # where a worker's series keep their pod's name once renamed to the leader's


def worker_pod_pattern(leader_worker_set: str) -> str:
    """The names of a LeaderWorkerSet's worker pods, `<name>-<group>-<index>`, capturing their leader's
    `<name>-<group>` (an RE2 pattern, anchored as Prometheus anchors them; a Kubernetes name has no regex
    metacharacter but the dot, and no backslash a PromQL string would need escaped)."""
    return f"({leader_worker_set.replace('.', '[.]')}-[0-9]+)-[0-9]+"


@dataclass(frozen=True)
class Gateway:
    """A gateway's request-size histogram (bytes, observed as each request arrives) and the labels selecting
    this fleet's requests (spec.autoscaling.gateway)."""

    metric: str
    selector: tuple[tuple[str, str], ...]

    def queries(self, rate_window: float) -> dict[str, str]:
        """GatewaySignals field -> PromQL returning one value (summed over the gateway's replicas)."""
        sel, w = selector_string(dict(self.selector)), f"{int(rate_window)}s"
        return {
            "request_rate": f"sum(rate({self.metric}_count{sel}[{w}]))",
            "bytes_rate": f"sum(rate({self.metric}_sum{sel}[{w}]))",
            "recent_request_rate": f"sum(irate({self.metric}_count{sel}[{w}]))",
            "recent_bytes_rate": f"sum(irate({self.metric}_sum{sel}[{w}]))",
        }


def held_requests_query(namespace: str, pool: str, metric: str) -> str:
    """Requests the endpoint picker of `pool` holds in its flow control (its gauge `metric`, by pool), summed over
    priorities and flows: what scales a fleet from zero. The picker's pod is scraped into the pool's namespace."""
    return f"sum({metric}{selector_string({'namespace': namespace, 'inference_pool': pool})})"

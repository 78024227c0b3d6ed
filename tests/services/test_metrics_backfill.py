"""Adapter arithmetic against a real Prometheus on backfilled data (promtool), so numbers are exact.

Samples every 15 s over 2 minutes, three hours in the past (outside the head block), queried at a
fixed time: rates, histogram increases, DP engines summed per replica,
vLLM's capacity from cache_config_info labels, TRT-LLM blocks in tokens of its exported size, staleness and overrides.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from m3fleet.autoscaling.policy import Action, PolicyState, decide
from m3fleet.autoscaling.prometheus import PrometheusAdapter
from m3fleet.autoscaling.signals import FleetState, ReplicaSignals
from tests.support.autoscaling.plans import config
from tests.support.autoscaling.prom import prometheus, require_prometheus

pytestmark = pytest.mark.prometheus

T0 = (int(time.time()) // 60) * 60 - 3 * 3600
STEPS = 9  # samples at T0, T0+15, ..., T0+120
END = T0 + 15 * (STEPS - 1)
WINDOW = 60.0


class OpenMetrics:
    """Builds an OpenMetrics file: one family at a time, samples in time order, `# EOF` at the end."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, series: dict[str, list[float | None]], suffix: str = "") -> None:
        """`series` maps a label string to one value per step."""
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, values in series.items():
            for step, value in enumerate(values):
                if value is not None:  # None: not scraped at that step
                    self.lines.append(f"{name}{suffix}{{{labels}}} {value} {T0 + 15 * step}")

    def gauge(self, name: str, series: dict[str, float | tuple[float, int] | list[float | None]]) -> None:
        """`series`: label string -> a value at every step, (value, steps) for a series that stops early, or one
        value (None: no sample) per step."""
        expanded: dict[str, list[float | None]] = {}
        for labels, value in series.items():
            if isinstance(value, list):
                expanded[labels] = value
                continue
            v, steps = value if isinstance(value, tuple) else (value, STEPS)
            expanded[labels] = [v] * steps
        self.family(name, "gauge", expanded)

    def counter(self, name: str, series: dict[str, float]) -> None:
        """`series`: label string -> increase per 15 s step."""
        base = name.removesuffix("_total")
        self.family(base, "counter", {k: [v * i for i in range(STEPS)] for k, v in series.items()}, "_total")

    def histogram(self, name: str, labels: str, bounds: list[str], per_step: list[float], total: float) -> None:
        """`per_step[i]`: observations per step at or below bounds[i] (cumulative); `total` value per step."""
        self.lines.append(f"# TYPE {name} histogram")
        for step in range(STEPS):
            t = T0 + 15 * step
            for bound, count in zip(bounds, per_step, strict=True):
                self.lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {count * step} {t}')
            self.lines.append(f"{name}_sum{{{labels}}} {total * step} {t}")
            self.lines.append(f"{name}_count{{{labels}}} {per_step[-1] * step} {t}")

    def text(self) -> str:
        return "\n".join([*self.lines, "# EOF"]) + "\n"


def _data() -> str:
    om = OpenMetrics()
    e0, e1 = 'pod="v-0",engine="0"', 'pod="v-0",engine="1"'
    # vLLM, new names, two DP engines; replica v-1 exports only the old KV name; v-2 exports both.
    # A replica whose last sample is 90 s before END (inside Prometheus's 5 min lookback): stale.
    stale = 'pod="stale-0"'
    every_minute: list[float | None] = [1 if step % 4 == 0 else None for step in range(STEPS)]  # a 60 s scrape
    running = {e0: 3, e1: 5, 'pod="v-1"': 2, 'pod="v-2"': 1, stale: (1, 3), 'pod="v-sparse"': every_minute}
    om.gauge("vllm:num_requests_running", running)
    every_minute_zero = [None if v is None else 0.0 for v in every_minute]
    om.gauge(
        "vllm:num_requests_waiting",
        {e0: 1, e1: 0, 'pod="v-1"': 0, 'pod="v-2"': 0, stale: (0, 3), 'pod="v-sparse"': every_minute_zero},
    )
    om.gauge(
        "vllm:kv_cache_usage_perc",
        {e0: 0.4, e1: 0.6, 'pod="v-2"': 0.3, stale: (0.5, 3), 'pod="v-sparse"': every_minute_zero},
    )
    om.gauge("vllm:gpu_cache_usage_perc", {'pod="v-1"': 0.9, 'pod="v-2"': 0.8})
    om.gauge(
        "vllm:cache_config_info",
        {
            f'{e0},block_size="128",num_gpu_blocks="4000",kv_cache_size_tokens="256000"': 1,
            f'{e1},block_size="128",num_gpu_blocks="4000",kv_cache_size_tokens="256000"': 1,
            'pod="v-2",engine="0",block_size="128",num_gpu_blocks="1000"': 1,  # no kv_cache_size_tokens label
        },
    )
    om.counter("vllm:prompt_tokens_total", {e0: 1500, e1: 1500})  # 3000 per 15 s = 200 tokens/s
    om.counter("vllm:generation_tokens_total", {e0: 300, e1: 300})
    om.counter("vllm:request_success_total", {f'{e0},finished_reason="stop"': 15})  # 1 request/s
    om.counter("vllm:num_preemptions_total", {e0: 1.5})
    om.histogram("vllm:time_to_first_token_seconds", e0, ["0.5", "1.0", "+Inf"], [5, 10, 15], 12.0)
    om.histogram("vllm:request_prompt_tokens", e0, ["1000.0", "5000.0", "+Inf"], [3, 15, 15], 45_000.0)
    # SGLang and TRT-LLM.
    om.gauge("sglang:num_running_reqs", {'pod="s-0"': 7})
    om.gauge("sglang:num_queue_reqs", {'pod="s-0"': 2})
    om.gauge("sglang:token_usage", {'pod="s-0"': 0.5})
    om.gauge("sglang:num_used_tokens", {'pod="s-0"': 50_000})
    om.gauge("sglang:max_total_num_tokens", {'pod="s-0"': 100_000})
    om.gauge("trtllm_num_requests_running", {'pod="t-0"': 4})
    om.gauge("trtllm_num_requests_waiting", {'pod="t-0"': 0})
    om.gauge("trtllm_kv_cache_utilization", {'pod="t-0"': 0.25})
    om.gauge("trtllm_kv_cache_max_blocks", {'pod="t-0"': 1000})
    om.gauge("trtllm_kv_cache_used_blocks", {'pod="t-0"': 250})
    om.gauge("trtllm_kv_cache_tokens_per_block", {'pod="t-0"': 32})
    om.gauge("gateway_queue", {'pod="v-0"': 9})
    # One pod scraped by two jobs (a PodMonitor and annotation-based discovery): every series twice.
    dup = [f'pod="v-dup",engine="0",job="{job}"' for job in ("podmonitor", "kubernetes-pods")]
    om.gauge("vllm:num_requests_running", dict.fromkeys(dup, 2))
    om.counter("vllm:prompt_tokens_total", dict.fromkeys(dup, 1500))  # 100 tokens/s, not 200
    for labels in dup:
        om.histogram("vllm:time_to_first_token_seconds", labels, ["0.5", "1.0", "+Inf"], [5, 10, 15], 12.0)
    return om.text()


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    _, promtool = require_prometheus()
    work = tmp_path_factory.mktemp("backfill")
    (work / "data.om").write_text(_data())
    made = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(work / "data.om"), str(work / "tsdb")],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    with prometheus(work, "global: {}\n", tsdb=work / "tsdb") as url:
        yield url


def read(url: str, engine: str, **kwargs: Any) -> dict[str, ReplicaSignals]:
    adapter = PrometheusAdapter.for_engine(engine, url, rate_window=WINDOW, histogram_window=WINDOW, **kwargs)
    snapshot = adapter.read(at=END)
    assert snapshot.error is None
    return {r.replica: r for r in snapshot.replicas}


def test_vllm_sums_dp_engines_and_reads_capacity_from_cache_config_info(prom: str) -> None:
    r = read(prom, "vllm")["v-0"]
    assert (r.running, r.waiting) == (8, 1)  # 3 + 5 running, 1 + 0 waiting
    assert r.kv_usage == pytest.approx(0.5)  # both engines, equal capacity
    assert r.kv_capacity_tokens == 2 * 256_000 and r.kv_capacity_tokens_per_rank == 256_000  # per engine
    assert r.prompt_tokens_rate == pytest.approx(200)
    assert r.generation_tokens_rate == pytest.approx(40)
    assert r.finished_rate == pytest.approx(1)
    assert r.first_token_rate == pytest.approx(1)
    assert r.preemption_rate == pytest.approx(0.1)
    assert r.sample_time == END


def test_vllm_histograms_are_increases_over_the_window(prom: str) -> None:
    r = read(prom, "vllm")["v-0"]
    assert r.prompt_tokens is not None and r.ttft_seconds is not None
    # Over 60 s (4 steps): 12 at <= 1000, 60 at <= 5000, sum 180,000.
    assert r.prompt_tokens.cumulative == (12, 60, 60)
    assert r.prompt_tokens.mean() == pytest.approx(3000)
    assert r.ttft_seconds.bounds[-1] == float("inf") and r.ttft_seconds.count == 60


def test_removed_vllm_kv_name_is_not_read(prom: str) -> None:
    replicas = read(prom, "vllm")
    assert replicas["v-1"].kv_usage is None  # only gpu_cache_usage_perc (removed in vLLM 0.12): unknown
    assert replicas["v-2"].kv_usage == pytest.approx(0.3)


def test_vllm_without_kv_cache_size_tokens_takes_the_summed_blocks_once(prom: str) -> None:
    r = read(prom, "vllm")["v-2"]
    assert r.kv_capacity_tokens == 1000 * 128
    assert r.kv_used_tokens == pytest.approx(0.3 * 128_000)


def test_sglang_reads_tokens_directly(prom: str) -> None:
    r = read(prom, "sglang")["s-0"]
    assert (r.running, r.waiting, r.kv_usage, r.kv_used_tokens, r.kv_capacity_tokens) == (7, 2, 0.5, 50_000, 100_000)


def test_trtllm_converts_blocks_to_tokens(prom: str) -> None:
    r = read(prom, "trtllm")["t-0"]
    assert (r.kv_capacity_tokens, r.kv_used_tokens) == (32_000, 8_000)


def test_trtllm_kv_overrides_are_tokens_not_blocks(prom: str) -> None:
    """queryOverrides give kvCapacityTokens and kvUsedTokens in tokens (their names say so): never multiplied by
    the block size again, and the other, not overridden, still converted from blocks."""
    capacity = {"kvCapacityTokens": "sum by ($by) (trtllm_kv_cache_max_blocks$selector) * 32"}
    r = read(prom, "trtllm", overrides=capacity)["t-0"]
    assert (r.kv_capacity_tokens, r.kv_used_tokens, r.kv_usage) == (32_000, 8_000, 0.25)
    used = {"kvUsedTokens": "sum by ($by) (trtllm_kv_cache_used_blocks$selector) * 32"}
    r = read(prom, "trtllm", overrides=used)["t-0"]
    assert (r.kv_capacity_tokens, r.kv_used_tokens, r.kv_usage) == (32_000, 8_000, 0.25)


def test_a_pod_scraped_by_two_jobs_is_counted_once(prom: str) -> None:
    r = read(prom, "vllm")["v-dup"]
    assert r.running == 2 and r.prompt_tokens_rate == pytest.approx(100) and r.first_token_rate == pytest.approx(1)
    assert r.ttft_seconds is not None and r.ttft_seconds.count == pytest.approx(60)  # 15 a step over 60 s, once


def test_a_scrape_interval_as_long_as_the_rate_window_is_said(prom: str) -> None:
    """Scraped every 60 s, a 60 s window holds one sample (read 5 s after a scrape, so whether the range is open at
    its start, as from Prometheus 3, or closed, does not matter): every rate() is empty. The policy says so."""
    at = END - 5
    snapshot = PrometheusAdapter.for_engine("vllm", prom, rate_window=WINDOW).read(at=at)
    replicas = {r.replica: r for r in snapshot.replicas}
    assert replicas["v-sparse"].scrapes_in_window == 1 and replicas["v-0"].scrapes_in_window == 4
    adapter = PrometheusAdapter.for_engine("vllm", prom, selector={"pod": "v-sparse"}, rate_window=WINDOW)
    decision, _ = decide(
        config(), PolicyState(), adapter.read(at=at), FleetState(now=at, current_replicas=1, ready_replicas=1)
    )
    assert "1 replicas have fewer than two scrapes in the 60s rate window" in decision.reason
    assert "every 30s or less, or raise spec.autoscaling.prometheus.rateWindowSeconds" in decision.reason
    # spec.autoscaling.prometheus.rateWindowSeconds: a window of twice the interval holds two scrapes.
    longer = PrometheusAdapter.for_engine("vllm", prom, selector={"pod": "v-sparse"}, rate_window=2 * WINDOW)
    snapshot = longer.read(at=at)
    assert snapshot.window_seconds == 2 * WINDOW and snapshot.replicas[0].scrapes_in_window == 2
    decision, _ = decide(config(), PolicyState(), snapshot, FleetState(now=at, current_replicas=1, ready_replicas=1))
    assert "scrapes in the" not in decision.reason


def test_query_override_replaces_one_signal(prom: str) -> None:
    r = read(prom, "vllm", overrides={"waiting": "sum by ($by) (gateway_queue$selector)"})["v-0"]
    assert r.waiting == 9 and r.running == 8


def test_stale_replica_holds_the_decision(prom: str) -> None:
    replicas = read(prom, "vllm", selector={"pod": "stale-0"})
    assert replicas["stale-0"].sample_time == END - 90
    adapter = PrometheusAdapter.for_engine("vllm", prom, selector={"pod": "stale-0"})
    snapshot = adapter.read(at=END)
    decision, _ = decide(config(), PolicyState(), snapshot, FleetState(now=END, current_replicas=2, ready_replicas=2))
    assert (decision.action, decision.desired_replicas) == (Action.HOLD, 2)
    assert "no fresh metrics" in decision.reason

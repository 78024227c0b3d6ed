"""Real-Prometheus test helpers: engine-format metrics served over HTTP, and a Prometheus process.

Each engine's exposition text is rendered from a `Reading` (gauges, cumulative counters and histograms at one
moment): an `EngineState`'s steady rates times the seconds since the server started (`vllm_text` & co.), or a
replica's counters in the simulator's engine model (tests/support/cluster/live.py), so Prometheus scrapes what a real
engine would expose.
Prometheus always listens on 127.0.0.1 with a temporary data dir and is stopped by PID.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from m3fleet.autoscaling.signals import TTFT_BUCKETS, one_two_five_buckets
from tests.support.ports import free_port

# vLLM's inter-token latency buckets (vllm/v1/metrics/buckets.py INTER_TOKEN_LATENCY_BUCKETS), which its per-request
# vllm:request_time_per_output_token_seconds uses.
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip

# vLLM's request phase-timing buckets (vllm/v1/metrics/buckets.py REQUEST_LATENCY_BUCKETS), which its per-request
# vllm:request_prefill_time_seconds uses.
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip

# SGLang's per-stage latency buckets (srt/observability/metrics_collector.py: exponential_buckets(start=0.001,
# width=1.62, length=30)), which sglang:per_stage_req_latency_seconds uses.
STAGE_LATENCY_BUCKETS: tuple[float, ...] = tuple(0.001 * 1.62**i for i in range(30))

INSTALL_HINT = "apt-get install prometheus (the Debian package also ships promtool)"


def require_prometheus() -> tuple[str, str]:
    """The prometheus and promtool binaries, or a failed test saying how to install them."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        pytest.fail(f"the prometheus/promtool binaries are missing: {INSTALL_HINT}", pytrace=False)
    return prometheus, promtool


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}", pytrace=False)


@contextmanager
def prometheus(
    workdir: Path,
    config: str,
    tsdb: Path | None = None,
    tls: tuple[Path, Path, Path] | None = None,
    port: int | None = None,
) -> Iterator[str]:
    """Run Prometheus on 127.0.0.1 (config checked with promtool first); yields its URL. With `tls` (serving
    cert, its key, the CA that signed it) it serves https only (its --web.config.file). `port` (a free one
    when None) lets a stopped Prometheus come back at the same URL."""
    binary, promtool = require_prometheus()
    config_file = workdir / "prometheus.yml"
    config_file.write_text(config)
    check = subprocess.run([promtool, "check", "config", str(config_file)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    port = port or free_port()
    log = (workdir / "prometheus.log").open("a")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={tsdb or workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            *web_config(workdir, tls),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, (workdir / "prometheus.log").read_text()
            try:
                return requests.get(f"{url}/-/ready", timeout=1, verify=str(tls[2]) if tls else True).status_code == 200
            except requests.RequestException:
                return False

        wait_for(ready, 15, "Prometheus to become ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def instant_value(url: str, expression: str) -> float | None:
    """The value of a PromQL expression now (a sum, one series), None when it has no series: to assert what a
    test's Prometheus scraped, beside what the operator made of it."""
    answer = requests.get(f"{url}/api/v1/query", params={"query": expression}, timeout=5)
    answer.raise_for_status()
    result = answer.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def web_config(workdir: Path, tls: tuple[Path, Path, Path] | None) -> list[str]:
    if tls is None:
        return []
    path = workdir / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {tls[0]}\n  key_file: {tls[1]}\n")
    return [f"--web.config.file={path}"]


# --- engine-format metrics (a stand-in exporter) ---------------------------------------------------
#
# Each renderer writes /metrics text the way the pinned engine does for a replica of the given shape,
# following its metrics code (label sets, which ranks emit, per-rank vs summed values):
#   vLLM 0.33.0   vllm/v1/metrics/loggers.py; cache_config_info labels from CacheConfig.metrics_info()
#                 with num_gpu_blocks summed over DP engines (v1/engine/core_client.py) and
#                 kv_cache_size_tokens per engine.
#   SGLang 0.5.23 srt/observability/metrics_collector.py: scheduler gauges per rank with model_name,
#                 engine_type, tp_rank, pp_rank, moe_ep_rank (+ dp_rank with DP attention); only
#                 attention-TP rank 0 emits unless --enable-metrics-for-all-schedulers (then every TP
#                 rank repeats its group's values). Token counters come from the tokenizer manager.
#   TRT-LLM       trtllm_ names on /prometheus/metrics, KV in blocks plus trtllm_kv_cache_tokens_per_block.


@dataclass(frozen=True)
class Reading:
    """One replica's /metrics at one moment, totals over its ranks: gauges, cumulative counters, and
    cumulative histograms (a count per bound, +Inf last) over `prompt_bounds` and TTFT_BUCKETS."""

    running: float
    waiting: float
    kv_usage: float
    capacity_tokens: float  # the whole replica's KV tokens
    prompt_tokens: float
    generation_tokens: float
    finished: float
    preemptions: float
    prompt_bounds: tuple[float, ...]
    prompt_buckets: tuple[float, ...]
    prompt_sum: float
    ttft_buckets: tuple[float, ...]
    ttft_sum: float
    itl_buckets: tuple[float, ...] = ()  # per request (its mean time per output token) over ITL_BUCKETS; () = none
    itl_sum: float = 0.0
    # per request, its prefill by the engine's clock (vLLM's and SGLang's) over REQUEST_LATENCY_BUCKETS; () = none
    prefill_buckets: tuple[float, ...] = ()
    prefill_sum: float = 0.0

    @classmethod
    def idle(cls, capacity_tokens: float, prompt_bounds: tuple[float, ...]) -> Reading:
        """An engine that has served nothing yet."""
        empty = (0.0,) * (len(prompt_bounds) + 1), (0.0,) * (len(TTFT_BUCKETS) + 1)
        return cls(0, 0, 0, capacity_tokens, 0, 0, 0, 0, prompt_bounds, empty[0], 0, empty[1], 0)


@dataclass(frozen=True)
class EngineState:
    """One replica's steady load (totals over its ranks): gauges, rates (per second) and the one prompt
    length/TTFT it observes."""

    running: float
    waiting: float
    kv_usage: float
    capacity_tokens: float  # the whole replica's KV tokens
    prompt_tokens_rate: float
    generation_tokens_rate: float
    request_rate: float  # requests reaching first token and finishing, per second
    prompt_tokens: float  # every request's prompt length (histogram)
    ttft_seconds: float = 0.5
    preemption_rate: float = 0.0
    itl_seconds: float = 0.03  # every request's mean time per output token
    prefill_seconds: float = 0.1  # every request's prefill, first scheduling to first token (the engine's own clock)

    def reading(self, elapsed: float, prompt_bounds: tuple[float, ...]) -> Reading:
        """What the replica exports after `elapsed` seconds at this load (counters grow at the rates)."""
        requests_ = self.request_rate * elapsed
        return Reading(
            running=self.running,
            waiting=self.waiting,
            kv_usage=self.kv_usage,
            capacity_tokens=self.capacity_tokens,
            prompt_tokens=self.prompt_tokens_rate * elapsed,
            generation_tokens=self.generation_tokens_rate * elapsed,
            finished=requests_,
            preemptions=self.preemption_rate * elapsed,
            prompt_bounds=prompt_bounds,
            prompt_buckets=_all_at(prompt_bounds, self.prompt_tokens, requests_),
            prompt_sum=self.prompt_tokens * requests_,
            ttft_buckets=_all_at(TTFT_BUCKETS, self.ttft_seconds, requests_),
            ttft_sum=self.ttft_seconds * requests_,
            itl_buckets=_all_at(ITL_BUCKETS, self.itl_seconds, requests_),
            itl_sum=self.itl_seconds * requests_,
            prefill_buckets=_all_at(REQUEST_LATENCY_BUCKETS, self.prefill_seconds, requests_),
            prefill_sum=self.prefill_seconds * requests_,
        )


def _all_at(bounds: tuple[float, ...], value: float, count: float) -> tuple[float, ...]:
    """Cumulative bucket counts (+Inf last) of `count` observations, every one equal to `value`."""
    return tuple(count if value <= bound else 0.0 for bound in (*bounds, math.inf))


def _histogram(
    name: str, labels: str, bounds: tuple[float, ...], buckets: tuple[float, ...], total: float, share: float = 1.0
) -> list[str]:
    """A histogram's lines from its cumulative bucket counts (+Inf last), `share` of them (one DP engine's)."""
    lines = [f"# HELP {name} histogram", f"# TYPE {name} histogram"]
    for bound, count in zip((*bounds, math.inf), buckets, strict=True):
        le = "+Inf" if bound == math.inf else f"{bound:g}"
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count * share}')
    lines += [f"{name}_sum{{{labels}}} {total * share}", f"{name}_count{{{labels}}} {buckets[-1] * share}"]
    return lines


def _family(name: str, kind: str, samples: list[tuple[str, float]]) -> list[str]:
    """One metric family as prometheus_client prints it (counters get their _total suffix)."""
    base = name.removesuffix("_total")
    out = [f"# HELP {base} {kind}", f"# TYPE {base} {kind}"]
    out += [f"{name}{{{labels}}} {value}" for labels, value in samples]
    return out


def vllm_text(state: EngineState, elapsed: float, dp: int = 1, max_model_len: int = 1_048_576) -> str:
    return vllm_exposition(state.reading(elapsed, one_two_five_buckets(max_model_len)), dp)


def vllm_exposition(reading: Reading, dp: int = 1) -> str:
    """vLLM /metrics of one replica with `dp` engines (`--data-parallel-size dp`; TP does not show:
    a TP group is one engine). Each engine holds 1/dp of the load and of the KV."""
    model = 'model_name="MiniMaxAI/MiniMax-M3"'
    engines = [f'{model},engine="{e}"' for e in range(dp)]
    per_engine_tokens = int(reading.capacity_tokens / dp)
    blocks = per_engine_tokens // 128

    def each(value: float) -> list[tuple[str, float]]:
        return [(labels, value) for labels in engines]

    info = [
        (
            f'block_size="128",cache_dtype="auto",engine="{e}",kv_cache_size_tokens="{per_engine_tokens}",'
            f'num_gpu_blocks="{blocks * dp}",num_cpu_blocks="None",enable_prefix_caching="True"',
            1.0,
        )
        for e in range(dp)
    ]
    lines = [
        *_family("vllm:num_requests_running", "gauge", each(reading.running / dp)),
        *_family("vllm:num_requests_waiting", "gauge", each(reading.waiting / dp)),
        *_family("vllm:kv_cache_usage_perc", "gauge", each(reading.kv_usage)),
        *_family("vllm:cache_config_info", "gauge", info),
        *_family("vllm:prompt_tokens_total", "counter", each(reading.prompt_tokens / dp)),
        *_family("vllm:generation_tokens_total", "counter", each(reading.generation_tokens / dp)),
        *_family(
            "vllm:request_success_total",
            "counter",
            [(f'{labels},finished_reason="stop"', reading.finished / dp) for labels in engines],
        ),
        *_family("vllm:num_preemptions_total", "counter", each(reading.preemptions / dp)),
    ]
    for labels in engines:
        lines += _histogram(
            "vllm:time_to_first_token_seconds", labels, TTFT_BUCKETS, reading.ttft_buckets, reading.ttft_sum, 1 / dp
        )
        if reading.itl_buckets:
            lines += _histogram(
                "vllm:request_time_per_output_token_seconds",
                labels,
                ITL_BUCKETS,
                reading.itl_buckets,
                reading.itl_sum,
                1 / dp,
            )
        if reading.prefill_buckets:
            lines += _histogram(
                "vllm:request_prefill_time_seconds",
                labels,
                REQUEST_LATENCY_BUCKETS,
                reading.prefill_buckets,
                reading.prefill_sum,
                1 / dp,
            )
        lines += _histogram(
            "vllm:request_prompt_tokens",
            labels,
            reading.prompt_bounds,
            reading.prompt_buckets,
            reading.prompt_sum,
            1 / dp,
        )
    return "\n".join(lines) + "\n"


def sglang_text(
    state: EngineState,
    elapsed: float,
    tp: int = 8,
    dp: int = 1,
    all_schedulers: bool = True,
    nodes: int = 1,
    node_rank: int = 0,
) -> str:
    reading = state.reading(elapsed, one_two_five_buckets(1_048_576))
    return sglang_exposition(reading, tp, dp, all_schedulers, nodes, node_rank)


def sglang_exposition(
    reading: Reading, tp: int = 8, dp: int = 1, all_schedulers: bool = True, nodes: int = 1, node_rank: int = 0
) -> str:
    """SGLang /metrics of one replica: `--tp tp` and, with dp > 1, `--dp dp --enable-dp-attention`
    (attention TP = tp / dp, one KV pool per DP rank). Only attention-TP rank 0 of each pool emits,
    unless `all_schedulers` (--enable-metrics-for-all-schedulers): then every rank repeats its pool.
    A replica over `nodes` nodes: the pod of `node_rank` has the schedulers of its tp / nodes ranks, and only
    node 0 the tokenizer's series (prompt and generation tokens, TTFT, end-to-end latency, prompt lengths);
    a worker node's come from the health server SGLang runs there (srt/utils/common.py,
    launch_dummy_health_check_server)."""
    model = 'model_name="MiniMaxAI/MiniMax-M3",engine_type="unified"'
    attn_tp = tp // dp
    per_node = tp // nodes
    ranks = []
    for rank in range(node_rank * per_node, (node_rank + 1) * per_node):
        pool = rank // attn_tp
        if rank % attn_tp and not all_schedulers:
            continue
        labels = f'{model},tp_rank="{rank}",pp_rank="0",moe_ep_rank="{rank}"'
        ranks.append((labels + (f',dp_rank="{pool}"' if dp > 1 else ""), pool))
    share = 1.0 / dp
    pool_tokens = int(reading.capacity_tokens * share)

    def gauge(value: float) -> list[tuple[str, float]]:
        return [(labels, value) for labels, _ in ranks]

    lines = [
        *_family("sglang:num_running_reqs", "gauge", gauge(reading.running * share)),
        *_family("sglang:num_queue_reqs", "gauge", gauge(reading.waiting * share)),
        *_family("sglang:token_usage", "gauge", gauge(reading.kv_usage)),
        *_family("sglang:num_used_tokens", "gauge", gauge(round(reading.kv_usage * pool_tokens))),
        *_family("sglang:max_total_num_tokens", "gauge", gauge(pool_tokens)),
        *_family("sglang:page_size", "gauge", gauge(1)),
        *_family("sglang:num_retracted_requests_total", "counter", gauge(reading.preemptions * share)),
    ]
    if reading.prefill_buckets:
        # Each scheduler times its pool's requests by stage (srt/observability/req_time_stats.py); the adapter reads
        # stage "prefill_forward" only. Another stage's series (a decode of 2 s per request) must not count.
        count, prefill = reading.prefill_buckets[-1], reading.prefill_sum
        stages = [
            (stage, _all_at(STAGE_LATENCY_BUCKETS, seconds, count), seconds * count)
            for stage, seconds in (("prefill_forward", prefill / count if count else 0.0), ("decode_forward", 2.0))
        ]
        for labels, _ in ranks:
            for stage, buckets, total in stages:
                lines += _histogram(
                    "sglang:per_stage_req_latency_seconds",
                    f'{labels},stage="{stage}"',
                    STAGE_LATENCY_BUCKETS,
                    buckets,
                    total,
                    share,
                )
    if node_rank == 0:
        lines += _sglang_tokenizer(reading, model)
    return "\n".join(lines) + "\n"


def _sglang_tokenizer(reading: Reading, model: str) -> list[str]:
    """The tokenizer manager's series (node 0 only)."""
    finished = reading.finished
    lines = [
        *_family(
            "sglang:prompt_tokens_total",
            "counter",
            [(f'{model},is_streaming="true"', reading.prompt_tokens)],
        ),
        *_family(
            "sglang:generation_tokens_total",
            "counter",
            [(f'{model},is_streaming="true"', reading.generation_tokens)],
        ),
    ]
    ttft = reading.ttft_buckets, reading.ttft_sum
    lines += _histogram("sglang:time_to_first_token_seconds", model, TTFT_BUCKETS, *ttft)
    # End-to-end latency: only its count (requests finished) is read; every request is put at 10 s.
    e2e = _all_at(TTFT_BUCKETS, 10.0, finished)
    lines += _histogram("sglang:e2e_request_latency_seconds", model, TTFT_BUCKETS, e2e, 10.0 * finished)
    lines += _histogram(
        "sglang:prompt_tokens_histogram", model, reading.prompt_bounds, reading.prompt_buckets, reading.prompt_sum
    )
    return lines


def trtllm_text(state: EngineState, elapsed: float, tokens_per_block: int = 64, export_block_size: bool = True) -> str:
    reading = state.reading(elapsed, one_two_five_buckets(1_048_576))
    return trtllm_exposition(reading, tokens_per_block, export_block_size)


def trtllm_exposition(reading: Reading, tokens_per_block: int = 64, export_block_size: bool = True) -> str:
    labels = 'model_name="MiniMaxAI/MiniMax-M3",engine_type="trtllm"'
    max_blocks = reading.capacity_tokens / tokens_per_block
    lines = [
        *_family("trtllm_num_requests_running", "gauge", [(labels, reading.running)]),
        *_family("trtllm_num_requests_waiting", "gauge", [(labels, reading.waiting)]),
        *_family("trtllm_kv_cache_utilization", "gauge", [(labels, reading.kv_usage)]),
        *_family("trtllm_kv_cache_max_blocks", "gauge", [(labels, max_blocks)]),
        *_family("trtllm_kv_cache_used_blocks", "gauge", [(labels, reading.kv_usage * max_blocks)]),
        *(
            _family("trtllm_kv_cache_tokens_per_block", "gauge", [(labels, tokens_per_block)])
            if export_block_size
            else []
        ),
        *_family("trtllm_prompt_tokens_total", "counter", [(labels, reading.prompt_tokens)]),
        *_family("trtllm_generation_tokens_total", "counter", [(labels, reading.generation_tokens)]),
        *_family("trtllm_request_success_total", "counter", [(labels, reading.finished)]),
    ]
    lines += _histogram(
        "trtllm_time_to_first_token_seconds", labels, TTFT_BUCKETS, reading.ttft_buckets, reading.ttft_sum
    )
    return "\n".join(lines) + "\n"


# The Gateway API Inference Extension's endpoint picker (pkg/epp/metrics): request sizes in bytes, observed when
# the request body arrives, per model_name (what the client asked for) and target_model_name (what it was sent to).
GIE_REQUEST_SIZES = "inference_objective_request_sizes"
GIE_SIZE_BUCKETS: tuple[float, ...] = tuple(float(2**k) for k in range(6, 31))  # 64 B .. 1 GiB


class GatewayLoad:
    """A gateway's arriving requests per model: counters integrated over time at rates a test can change."""

    def __init__(self, models: dict[str, tuple[float, float]]) -> None:
        # model -> (requests/s, bytes per request)
        self._lock = threading.Lock()
        self._models = dict(models)
        self._totals = {model: (0.0, 0.0) for model in models}
        self._last: float | None = None

    def set(self, model: str, requests_per_second: float, bytes_per_request: float) -> None:
        with self._lock:
            self._advance(time.monotonic())
            self._models[model] = (requests_per_second, bytes_per_request)

    def _advance(self, now: float) -> None:
        dt = 0.0 if self._last is None else now - self._last
        self._last = now
        for model, (rate, size) in self._models.items():
            count, total = self._totals.get(model, (0.0, 0.0))
            self._totals[model] = (count + rate * dt, total + rate * dt * size)

    def text(self) -> str:
        """The endpoint picker's /metrics: one histogram series set per model (every request of a model the same
        size, so its bucket counts are all-or-nothing)."""
        with self._lock:
            self._advance(time.monotonic())
            lines = [f"# HELP {GIE_REQUEST_SIZES} request sizes", f"# TYPE {GIE_REQUEST_SIZES} histogram"]
            for model, (count, total) in sorted(self._totals.items()):
                size = self._models[model][1]
                labels = f'model_name="{model}",target_model_name="{model}"'
                for bound, n in zip((*GIE_SIZE_BUCKETS, math.inf), _all_at(GIE_SIZE_BUCKETS, size, count), strict=True):
                    le = "+Inf" if bound == math.inf else f"{bound:g}"
                    lines.append(f'{GIE_REQUEST_SIZES}_bucket{{{labels},le="{le}"}} {n}')
                lines += [
                    f"{GIE_REQUEST_SIZES}_sum{{{labels}}} {total}",
                    f"{GIE_REQUEST_SIZES}_count{{{labels}}} {count}",
                ]
            return "\n".join(lines) + "\n"


Route = Callable[[float], tuple[int, str]]  # elapsed seconds -> (HTTP status, body)


class MetricsServer:
    """Serves scripted metrics: GET <path> -> routes[path](seconds since start)."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.started = time.time()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = server.routes.get(self.path)
                status, body = route(time.time() - server.started) if route else (404, "not found\n")
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> MetricsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

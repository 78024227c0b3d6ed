"""Real-Prometheus test helpers: engine-format metrics served over HTTP, and a Prometheus process.

The server renders each engine's exposition text from an `EngineState` at the current wall time
(counters grow at the state's rates), so Prometheus scrapes what a real engine would expose.
Prometheus always listens on 127.0.0.1 with a temporary data dir and is stopped by PID.
"""

from __future__ import annotations

import math
import shutil
import socket
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

INSTALL_HINT = "apt-get install prometheus (the Debian package also ships promtool)"


def require_prometheus() -> tuple[str, str]:
    """The prometheus and promtool binaries, or a failed test saying how to install them."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        pytest.fail(f"the prometheus/promtool binaries are missing: {INSTALL_HINT}", pytrace=False)
    return prometheus, promtool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}", pytrace=False)


@contextmanager
def prometheus(workdir: Path, config: str, tsdb: Path | None = None) -> Iterator[str]:
    """Run Prometheus on 127.0.0.1 (config checked with promtool first); yields its URL."""
    binary, promtool = require_prometheus()
    config_file = workdir / "prometheus.yml"
    config_file.write_text(config)
    check = subprocess.run([promtool, "check", "config", str(config_file)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    log = (workdir / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={tsdb or workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, (workdir / "prometheus.log").read_text()
            try:
                return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
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


# --- engine-format metrics ------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineState:
    """One replica's load: gauges, rates (per second) and the one prompt length/TTFT it observes."""

    running: float
    waiting: float
    kv_usage: float
    capacity_tokens: float
    prompt_tokens_rate: float
    generation_tokens_rate: float
    request_rate: float  # requests reaching first token and finishing, per second
    prompt_tokens: float  # every request's prompt length (histogram)
    ttft_seconds: float = 0.5
    preemption_rate: float = 0.0


def _histogram(name: str, labels: str, bounds: tuple[float, ...], value: float, count: float) -> list[str]:
    lines = [f"# TYPE {name} histogram"]
    for bound in (*bounds, math.inf):
        le = "+Inf" if bound == math.inf else f"{bound:.1f}"
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count if value <= bound else 0}')
    lines += [f"{name}_sum{{{labels}}} {value * count}", f"{name}_count{{{labels}}} {count}"]
    return lines


def vllm_text(state: EngineState, elapsed: float, old_names: bool = False, max_model_len: int = 1_048_576) -> str:
    """vLLM /metrics (two DP engines splitting the load, like `--data-parallel-size 2`)."""
    lines: list[str] = []
    usage = "vllm:gpu_cache_usage_perc" if old_names else "vllm:kv_cache_usage_perc"
    for engine in ("0", "1"):
        labels = f'model_name="MiniMaxAI/MiniMax-M3",engine="{engine}"'
        requests_ = state.request_rate * elapsed / 2
        blocks = int(state.capacity_tokens / 2 / 128)
        lines += [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {state.running / 2}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {state.waiting / 2}",
            f"# TYPE {usage} gauge",
            f"{usage}{{{labels}}} {state.kv_usage}",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{{labels},block_size="128",num_gpu_blocks="{blocks}",cache_dtype="auto"}} 1',
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{labels}}} {state.prompt_tokens_rate * elapsed / 2}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{labels}}} {state.generation_tokens_rate * elapsed / 2}",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} {requests_}',
            "# TYPE vllm:num_preemptions_total counter",
            f"vllm:num_preemptions_total{{{labels}}} {state.preemption_rate * elapsed / 2}",
        ]
        lines += _histogram("vllm:time_to_first_token_seconds", labels, TTFT_BUCKETS, state.ttft_seconds, requests_)
        lines += _histogram(
            "vllm:request_prompt_tokens", labels, one_two_five_buckets(max_model_len), state.prompt_tokens, requests_
        )
    return "\n".join(lines) + "\n"


def sglang_text(state: EngineState, elapsed: float) -> str:
    labels = 'model_name="MiniMaxAI/MiniMax-M3"'
    requests_ = state.request_rate * elapsed
    lines = [
        f"sglang:num_running_reqs{{{labels}}} {state.running}",
        f"sglang:num_queue_reqs{{{labels}}} {state.waiting}",
        f"sglang:token_usage{{{labels}}} {state.kv_usage}",
        f"sglang:num_used_tokens{{{labels}}} {state.kv_usage * state.capacity_tokens}",
        f"sglang:max_total_num_tokens{{{labels}}} {state.capacity_tokens}",
        f"sglang:prompt_tokens_total{{{labels}}} {state.prompt_tokens_rate * elapsed}",
        f"sglang:generation_tokens_total{{{labels}}} {state.generation_tokens_rate * elapsed}",
    ]
    lines += _histogram("sglang:time_to_first_token_seconds", labels, TTFT_BUCKETS, state.ttft_seconds, requests_)
    lines += _histogram("sglang:e2e_request_latency_seconds", labels, TTFT_BUCKETS, 10.0, requests_)
    return "\n".join(lines) + "\n"


def trtllm_text(state: EngineState, elapsed: float, tokens_per_block: int = 32) -> str:
    labels = 'model_name="MiniMaxAI/MiniMax-M3",engine_type="trtllm"'
    max_blocks = state.capacity_tokens / tokens_per_block
    requests_ = state.request_rate * elapsed
    lines = [
        f"trtllm_num_requests_running{{{labels}}} {state.running}",
        f"trtllm_num_requests_waiting{{{labels}}} {state.waiting}",
        f"trtllm_kv_cache_utilization{{{labels}}} {state.kv_usage}",
        f"trtllm_kv_cache_max_blocks{{{labels}}} {max_blocks}",
        f"trtllm_kv_cache_used_blocks{{{labels}}} {state.kv_usage * max_blocks}",
        f"trtllm_prompt_tokens_total{{{labels}}} {state.prompt_tokens_rate * elapsed}",
        f"trtllm_generation_tokens_total{{{labels}}} {state.generation_tokens_rate * elapsed}",
        f"trtllm_request_success_total{{{labels}}} {requests_}",
    ]
    lines += _histogram("trtllm_time_to_first_token_seconds", labels, TTFT_BUCKETS, state.ttft_seconds, requests_)
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

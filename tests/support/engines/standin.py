"""A small OpenAI-compatible completions server that streams tokens, on 127.0.0.1 only (stdlib).

It stands in for the engine so the engines' real benchmark clients can run on a CPU: `/v1/completions`
streams `max_tokens` chunks as server-sent events (one word of the test's word-level tokenizer each, then a
usage chunk and `[DONE]`), with a first-token delay that grows with the prompt and a fixed inter-token
delay, so the clients measure real, predictable latencies. It counts requests and the most it served at
once, and can require an API key (`Authorization: Bearer KEY`) as an engine started with `--api-key` does.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOST = "127.0.0.1"  # loopback only, never another address


@dataclass
class Timing:
    first_token_s: float = 0.010  # plus per_prompt_token_s for every prompt token
    per_prompt_token_s: float = 0.0001
    inter_token_s: float = 0.004


@dataclass
class Stats:
    requests: int = 0
    completions: int = 0
    unauthorized: list[str] = field(default_factory=list)  # paths asked for without the key
    in_flight: int = 0
    most_in_flight: int = 0
    prompt_tokens: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class StandIn:
    """`with StandIn(model) as server:` serves on `server.url` until the block ends."""

    def __init__(self, model: str, api_key: str | None = None, timing: Timing | None = None) -> None:
        self.model = model
        self.api_key = api_key
        self.timing = timing or Timing()
        self.stats = Stats()
        self._server = ThreadingHTTPServer((HOST, 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="standin", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                """Like vLLM's and SGLang's --api-key: the OpenAI routes need the key; /metrics, /health do not."""
                if not self.path.startswith("/v1/") or standin.api_key is None:
                    return True
                if self.headers.get("Authorization") == f"Bearer {standin.api_key}":
                    return True
                with standin.stats.lock:
                    standin.stats.unauthorized.append(f"{self.command} {self.path}")
                self._json(401, {"error": {"message": "invalid API key", "type": "invalid_request_error"}})
                return False

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                if self.path.startswith("/v1/models"):
                    self._json(200, {"object": "list", "data": [{"id": standin.model, "object": "model"}]})
                elif self.path in ("/health", "/health_generate", "/ping"):
                    self._json(200, {})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self._authorized():
                    return
                if self.path == "/v1/completions":
                    self._complete(body)
                elif self.path == "/flush_cache":
                    self._json(200, {})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

            def _complete(self, body: dict[str, Any]) -> None:
                stats, timing = standin.stats, standin.timing
                prompt = body.get("prompt", "")
                prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
                max_tokens = int(body.get("max_tokens") or 16)
                if body.get("model") != standin.model:
                    self._json(404, {"error": {"message": f"model {body.get('model')!r} does not exist"}})
                    return
                with stats.lock:
                    stats.requests += 1
                    stats.in_flight += 1
                    stats.most_in_flight = max(stats.most_in_flight, stats.in_flight)
                    stats.prompt_tokens.append(prompt_tokens)
                try:
                    time.sleep(timing.first_token_s + timing.per_prompt_token_s * prompt_tokens)
                    usage = {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": max_tokens,
                        "total_tokens": prompt_tokens + max_tokens,
                    }
                    if not body.get("stream"):
                        time.sleep(timing.inter_token_s * (max_tokens - 1))
                        text = " ".join(f"w{i % 1000}" for i in range(max_tokens))
                        choice = {"index": 0, "text": text, "finish_reason": "length"}
                        self._json(200, {"id": "cmpl-standin", "object": "text_completion", "choices": [choice],
                                         "usage": usage})  # fmt: skip
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for i in range(max_tokens):
                        if i:
                            time.sleep(timing.inter_token_s)
                        last = i == max_tokens - 1
                        choice = {"index": 0, "text": f" w{i % 1000}", "finish_reason": "length" if last else None}
                        self._event({"id": "cmpl-standin", "object": "text_completion", "choices": [choice]})
                    if (body.get("stream_options") or {}).get("include_usage"):  # as OpenAI, vLLM and SGLang do
                        self._event({"id": "cmpl-standin", "object": "text_completion", "choices": [], "usage": usage})
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                    self.close_connection = True
                    with stats.lock:
                        stats.completions += 1
                finally:
                    with stats.lock:
                        stats.in_flight -= 1

            def _event(self, data: dict[str, Any]) -> None:
                self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
                self.wfile.flush()

        return Handler

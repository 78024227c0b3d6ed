"""Scripted HTTP(S) servers on loopback, standing in for a Prometheus that answers badly (status, body, headers)."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "AKIA-SECRET-0123456789-do-not-echo"
EMPTY_RESULT = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})


@contextmanager
def serving(
    status: int, body: str, headers: dict[str, str] | None = None, tls: ssl.SSLContext | None = None
) -> Iterator[str]:
    """An HTTP(S) server on 127.0.0.1 answering every GET with `status` and `body`; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with served(Handler, tls) as url:
        yield url


@contextmanager
def served(handler: type[BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

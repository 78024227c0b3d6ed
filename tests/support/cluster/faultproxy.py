"""A fault-injecting HTTPS proxy in front of the real kube-apiserver: the faults a real apiserver gives only under
load, compaction or a network partition, on demand.

One proxy per operator process: its kubeconfig names the proxy as the server (a serving cert for 127.0.0.1
from the control plane's CA), and the proxy forwards every request to the apiserver with the client's own
credentials (the audit log still says who made it). A test scripts faults per request:

* `fail(verb, resource, status)`: answer 409 / 422 / 429 (with Retry-After) / 500 / 503 instead of the apiserver,
  before anything changes (the write is rejected, not lost); with `forward=True` the request reaches the
  apiserver and only its answer is replaced (the write happened, the client is told it failed); `dry_run=True`
  (or False) hits only dry runs (or only real writes).
* `expire(resource)`: the next watch of a resource ends with the apiserver's own "410 Gone" event (its
  resourceVersion is too old: history compacted); the client must list again.
* `cut(resource, after=N)`: the next watch is forwarded for N events, then its connection is closed mid-stream.
* `stand_in(verb, resource, body)`: answer 200 with `body`, for what no kubelet here can give (kwok runs no
  containers: a pod's log); `rewrite(verb, resource, edit)`: the apiserver's answer, edited in place by `edit`
  (what a kubelet would report that kwok does not: a container that cannot start).
* `cut_off()` / `restore()`: a partition between this client and the apiserver: open streams are torn down and
  every new request is dropped unanswered (the connection is closed) until restored.

Verbs are the apiserver's (get, list, watch, create, update, patch, delete, deletecollection), resources its
plurals; `requests` records what was asked and what was answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.support.cluster.controlplane import ControlPlane
from tests.support.ports import free_port

REASONS = {
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


@dataclass(frozen=True)
class Call:
    """One request as the apiserver's authorizer sees it, and what the client got."""

    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    status: int  # 0: dropped (cut off) or cut mid-stream
    dry_run: bool = False
    at: float = field(default_factory=time.monotonic)  # when it was answered (a Retry-After is honoured or not)

    def __str__(self) -> str:
        target = "/".join(x for x in (self.resource, self.subresource, self.namespace, self.name) if x)
        return f"{self.verb} {target} -> {self.status}"


def classify(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str, str, str]:
    """(verb, resource, subresource, namespace, name) of a REST path, as the apiserver's RequestInfo has it."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return method.lower(), "", "", "", ""  # /version, /openapi, /healthz: no resource
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) > 2:  # /namespaces/NS/RESOURCE...; /namespaces/NAME is a namespace
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if method == "GET":
        verb = "watch" if query.get("watch") in ("1", "true") else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = METHOD_VERBS.get(method, method.lower())
    return verb, resource, subresource, namespace, name


@dataclass
class Fault:
    verb: str
    resource: str
    status: int = 0  # the answer instead of the apiserver's (0: forward; `expire`/`cut` act on the stream)
    subresource: str = ""
    namespace: str | None = None
    retry_after: int | None = None
    times: int | None = 1  # None: until cleared
    forward: bool = False  # the apiserver gets the request; the client gets the fault
    gone: bool = False  # a watch answered with the 410 Gone event
    cut_after: int | None = None  # a watch cut after this many events
    dry_run: bool | None = None  # True: only dry runs (?dryRun=All); False: only real writes; None: both
    body: bytes | None = None  # the answer's body instead of a Status (`stand_in`)
    edit: Callable[[dict[str, Any]], None] | None = None  # edits the apiserver's answer (`rewrite`)
    hits: int = 0

    def matches(self, verb: str, resource: str, subresource: str, namespace: str, dry_run: bool) -> bool:
        return (
            (self.times is None or self.hits < self.times)
            and self.dry_run in (None, dry_run)
            and self.verb in (verb, "*")
            and self.resource in (resource, "*")
            and self.subresource == subresource
            and self.namespace in (None, namespace)
        )


def status_body(code: int, message: str) -> bytes:
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    return json.dumps({**status, "message": message, "reason": REASONS.get(code, "Unknown"), "code": code}).encode()


@dataclass
class FaultProxy:
    control_plane: ControlPlane
    workdir: Path
    port: int = field(default_factory=free_port)
    faults: list[Fault] = field(default_factory=list)
    requests: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _cut_off: bool = False
    _open: dict[asyncio.BaseTransport, str] = field(default_factory=dict)  # open streams and their resource
    _loop: asyncio.AbstractEventLoop | None = None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # -- the test's side --------------------------------------------------------------------------

    def fail(self, verb: str, resource: str, status: int, **options: Any) -> Fault:
        return self._add(Fault(verb, resource, status, **options))

    def expire(self, resource: str, **options: Any) -> Fault:
        return self._add(Fault("watch", resource, gone=True, **options))

    def cut(self, resource: str, after: int = 0, **options: Any) -> Fault:
        return self._add(Fault("watch", resource, cut_after=after, **options))

    def stand_in(self, verb: str, resource: str, body: bytes, **options: Any) -> Fault:
        return self._add(Fault(verb, resource, 200, body=body, **options))

    def rewrite(self, verb: str, resource: str, edit: Callable[[dict[str, Any]], None], **options: Any) -> Fault:
        return self._add(Fault(verb, resource, edit=edit, **options))

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def cut_off(self) -> None:
        """From now on this client reaches nothing: streams torn down, every request dropped unanswered."""
        with self._lock:
            self._cut_off = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._drop_open)

    def drop_watches(self, resource: str = "*") -> None:
        """Close the open watches (of one resource): with `expire` first, the client's next watch hears 410 Gone."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._drop_open, resource)

    def restore(self) -> None:
        with self._lock:
            self._cut_off = False

    def calls(self, verb: str | None = None, resource: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self.requests if verb in (None, c.verb) and resource in (None, c.resource)]

    def _add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    # -- the proxy ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def running(self) -> Iterator[FaultProxy]:
        started = threading.Event()
        stop: list[asyncio.Event] = []

        async def serve() -> None:
            serving = self.control_plane.ca.serving(f"faultproxy-{self.port}")
            server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            server_tls.load_cert_chain(serving.cert, serving.key)
            upstream_tls = ssl.create_default_context(cafile=str(self.control_plane.ca.cert))
            timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=None)
            async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
                app = web.Application(client_max_size=64 * 1024**2)

                async def handle(request: web.Request) -> web.StreamResponse:
                    return await self._handle(request, session, upstream_tls)

                app.router.add_route("*", "/{tail:.*}", handle)
                runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=server_tls).start()
                self._loop = asyncio.get_running_loop()
                stop.append(asyncio.Event())
                started.set()
                await stop[0].wait()
                self._drop_open()
                await runner.cleanup()

        thread = threading.Thread(target=asyncio.run, args=(serve(),), name=f"faultproxy-{self.port}", daemon=True)
        thread.start()
        if not started.wait(30):
            raise RuntimeError("the fault proxy did not start")
        try:
            yield self
        finally:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(stop[0].set)
            thread.join(15)

    def _drop_open(self, resource: str = "*") -> None:
        for transport, of in list(self._open.items()):
            if resource in ("*", of):
                transport.abort()
                self._open.pop(transport, None)

    def _fault_for(self, call: tuple[str, str, str, str, str], dry_run: bool) -> Fault | None:
        verb, resource, subresource, namespace, _ = call
        with self._lock:
            for fault in self.faults:
                if fault.matches(verb, resource, subresource, namespace, dry_run):
                    fault.hits += 1
                    return fault
        return None

    def _record(self, call: tuple[str, str, str, str, str], status: int, dry_run: bool = False) -> None:
        with self._lock:
            self.requests.append(Call(*call, status, dry_run))

    async def _handle(
        self, request: web.Request, session: aiohttp.ClientSession, upstream_tls: ssl.SSLContext
    ) -> web.StreamResponse:
        call = classify(request.method, request.path, dict(request.query))
        transport = request.transport
        if self._cut_off or transport is None:
            self._record(call, 0)
            if transport is not None:
                transport.abort()
            raise asyncio.CancelledError  # nothing is answered: the client sees its connection dropped
        dry_run = "dryRun" in request.query
        fault = self._fault_for(call, dry_run)
        body = await request.read()
        if fault is not None and fault.status and not fault.forward:
            return self._answer(call, fault, dry_run)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = f"{self.control_plane.server}{request.path_qs}"
        async with session.request(
            request.method, url, headers=headers, data=body or None, ssl=upstream_tls
        ) as upstream:
            if fault is not None and fault.status:  # forwarded: the apiserver acted, the client hears otherwise
                await upstream.read()
                return self._answer(call, fault, dry_run)
            if fault is not None and fault.edit is not None and upstream.status == 200:
                answer = json.loads(await upstream.read())
                fault.edit(answer)
                self._record(call, 200, dry_run)
                return web.Response(status=200, body=json.dumps(answer).encode(), content_type="application/json")
            if fault is not None and fault.gone and upstream.status == 200:
                self._record(call, 410)
                gone = {"type": "ERROR", "object": json.loads(status_body(410, "too old resource version"))}
                return web.Response(status=200, body=json.dumps(gone).encode() + b"\n", content_type="application/json")
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP},
            )
            await response.prepare(request)
            self._open[transport] = call[1]
            try:
                events = 0  # a watch sends one JSON event a line
                async for chunk in upstream.content.iter_any():
                    if fault is not None and fault.cut_after is not None and events >= fault.cut_after:
                        self._record(call, 0)
                        transport.abort()  # mid-stream: no terminating chunk, the client sees a broken stream
                        return response
                    await response.write(chunk)
                    events += chunk.count(b"\n")
                await response.write_eof()
            finally:
                self._open.pop(transport, None)
            self._record(call, upstream.status, dry_run)
            return response

    def _answer(self, call: tuple[str, str, str, str, str], fault: Fault, dry_run: bool) -> web.Response:
        self._record(call, fault.status, dry_run)
        headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
        if fault.body is not None:
            return web.Response(status=fault.status, body=fault.body, headers=headers, content_type="text/plain")
        message = f"injected by the fault proxy: {REASONS.get(fault.status, fault.status)}"
        body = status_body(fault.status, message)
        return web.Response(status=fault.status, body=body, headers=headers, content_type="application/json")

"""The key guard: an authenticating reverse proxy in front of an engine that must never hold the keys itself.

SGLang 0.5.23 serves its whole configuration on `/server_info` (`admin_api_key`, and `launch_command` with
`--api-key`), to anyone holding the API key or, with no API key, to anyone, and logs both keys at start. So
m3fleet gives SGLang no key at all and binds it to 127.0.0.1; this proxy, the only listener on the pod's engine
port, holds the keys (env from Secrets, in its own container) and enforces them as SGLang would:

* `/health*`, `/ready*`, `/metrics*` and CORS preflights pass (probes, Prometheus);
* the routes SGLang itself serves at its normal auth level (`NORMAL` in `srt/utils/auth.py`; the list comes from
  SGLang's own route table, `engines/sglang-routes.json`) need the API key when one is set;
* everything else (SGLang's admin routes, and any path it does not list) needs the admin key, and is refused
  when none is set.

Run by the pod as `python3 -c <this file's text> <config JSON>` in the engine's image (SGLang depends on
aiohttp), so it uses the standard library and aiohttp only. WebSocket upgrades are refused: SGLang's only one
(/v1/realtime, speech) is outside MiniMax-M3's API and SGLang does not authenticate it.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import aiohttp.web

OPEN_PREFIXES = ("/health", "/ready", "/metrics")  # what SGLang itself leaves open (srt/utils/auth.py)
# Hop-by-hop headers (RFC 9110 7.6.1), and the framing aiohttp sets for the body it streams on.
NOT_FORWARDED = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
    | {"content-length"}
)
# Nor the key itself: SGLang holds none and needs none, and so can never log one from a request.
NOT_FORWARDED_UP = NOT_FORWARDED | {"authorization"}
CHUNK = 64 * 1024
SESSION: aiohttp.web.AppKey[aiohttp.ClientSession] = aiohttp.web.AppKey("session", aiohttp.ClientSession)


def route_pattern(template: str) -> re.Pattern[str]:
    """A Starlette path template (`/v1/files/{file_id}`, `{rest:path}`) as the regex Starlette matches it with."""
    parts: list[str] = []
    position = 0
    for param in re.finditer(r"{([a-zA-Z_][a-zA-Z0-9_]*)(:[a-zA-Z_][a-zA-Z0-9_]*)?}", template):
        parts.append(re.escape(template[position : param.start()]))
        convertor = (param.group(2) or ":str")[1:]
        parts.append({"path": ".*", "int": "[0-9]+", "float": r"[0-9]+(\.[0-9]+)?"}.get(convertor, "[^/]+"))
        position = param.end()
    parts.append(re.escape(template[position:]))
    return re.compile("^" + "".join(parts) + "$")


@dataclass(frozen=True)
class Keys:
    api_key: str | None
    admin_key: str | None


def presented(authorization: str | None, expected: str) -> bool:
    """`Authorization: Bearer <expected>`, compared in constant time (as SGLang does)."""
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), expected.encode())


class Guard:
    def __init__(self, normal_routes: list[tuple[str, str]], keys: Keys) -> None:
        self.normal = [(method.upper(), route_pattern(template)) for method, template in normal_routes]
        self.keys = keys

    def is_normal(self, method: str, path: str) -> bool:
        return any(method == m and pattern.match(path) for m, pattern in self.normal)

    def verdict(self, method: str, path: str, authorization: str | None) -> int | None:
        """None to forward; else the status to answer with (401: no or a wrong key, 403: no key opens it)."""
        if method == "OPTIONS" or path.startswith(OPEN_PREFIXES):
            return None
        if self.is_normal(method, path):
            key = self.keys.api_key
            return None if key is None or presented(authorization, key) else 401
        if self.keys.admin_key is None:
            return 403
        return None if presented(authorization, self.keys.admin_key) else 401


def build_app(guard: Guard, upstream: str) -> aiohttp.web.Application:
    async def session_context(app: aiohttp.web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)  # a generation may stream for a long time
        connector = aiohttp.TCPConnector(limit=0)  # the engine's own scheduler is what limits concurrency
        app[SESSION] = aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False)
        yield
        await app[SESSION].close()

    async def forward(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        if request.headers.get("Upgrade"):
            return aiohttp.web.json_response({"error": "upgrades (WebSocket) are not served"}, status=501)
        status = guard.verdict(request.method, request.path, request.headers.get("Authorization"))
        if status is not None:
            return aiohttp.web.json_response({"error": "Unauthorized" if status == 401 else "Forbidden"}, status=status)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED_UP}
        body = request.content.iter_chunked(CHUNK) if request.body_exists else None
        try:
            async with request.app[SESSION].request(
                request.method, upstream + request.raw_path, headers=headers, data=body, allow_redirects=False
            ) as answer:
                response = aiohttp.web.StreamResponse(status=answer.status, reason=answer.reason)
                for name, value in answer.headers.items():
                    if name.lower() not in NOT_FORWARDED:
                        response.headers.add(name, value)
                await response.prepare(request)
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientConnectionError:
            return aiohttp.web.json_response({"error": "the engine is not answering (yet)"}, status=502)

    app = aiohttp.web.Application(client_max_size=0)  # no limit of our own: the engine's applies, as without us
    app.cleanup_ctx.append(session_context)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main(argv: list[str]) -> None:
    """argv: one JSON object: {"listen": port, "upstream": port, "apiKeyEnv": NAME, "adminKeyEnv": NAME,
    "normalRoutes": [[method, template], ...]}; the keys are read from the two variables (empty or unset: none)."""
    config = json.loads(argv[0])
    keys = Keys(os.environ.pop(config["apiKeyEnv"], "") or None, os.environ.pop(config["adminKeyEnv"], "") or None)
    guard = Guard([(method, template) for method, template in config["normalRoutes"]], keys)
    app = build_app(guard, f"http://127.0.0.1:{int(config['upstream'])}")
    api = "required" if keys.api_key else "not set"
    admin = "need the admin key" if keys.admin_key else "closed"
    host = str(config.get("host", "0.0.0.0"))  # every interface of the pod; tests pass 127.0.0.1
    route = f"{host}:{config['listen']} -> 127.0.0.1:{config['upstream']}"
    print(f"key guard: {route} (API key {api}; admin routes {admin})", flush=True)
    aiohttp.web.run_app(
        app, host=config.get("host", "0.0.0.0"), port=int(config["listen"]), print=None, access_log=None
    )


if __name__ == "__main__":
    main(sys.argv[1:])

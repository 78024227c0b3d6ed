#!/usr/bin/env python3
"""SGLang's own HTTP server on a CPU, far enough to answer `/server_info` (runs INSIDE the SGLang venv).

    sglang_server.py routes              -> {"normalRoutes": [[method, path], ...], "otherRoutes": [...]} on stdout
    sglang_server.py serve PORT ARGV...  -> SGLang's FastAPI app on 127.0.0.1:PORT until killed

`routes` reads SGLang's real route table (srt/entrypoints/http_server.py `app`): the routes without an admin auth
level are those SGLang guards with the API key (`NORMAL`, srt/utils/auth.py), the rest need its admin key.

`serve` parses ARGV (what follows `python3 -m sglang.launch_server`) with SGLang's own `prepare_server_args` and
serves SGLang's own `app` with SGLang's own key middleware exactly as `launch_server` adds it (from the parsed
--api-key / --admin-api-key). Only the scheduler side is a stand-in: a tokenizer manager that holds the parsed
server args and reports an empty internal state, since there is no GPU to run schedulers on.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def route_table() -> dict[str, list[list[str]]]:
    from fastapi.routing import APIRoute
    from sglang.srt.entrypoints.http_server import app
    from sglang.srt.utils.auth import AuthLevel

    normal: set[tuple[str, str]] = set()
    other: set[tuple[str, str]] = set()
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue  # a WebSocket route (the key guard refuses upgrades) or a mount (unknown to the guard: admin)
        level = getattr(route.endpoint, "_auth_level", AuthLevel.NORMAL)
        for method in route.methods:
            (normal if level == AuthLevel.NORMAL else other).add((method, route.path))
    return {"normalRoutes": [list(r) for r in sorted(normal)], "otherRoutes": [list(r) for r in sorted(other)]}


class StandInTokenizerManager:
    """What `/server_info` and `/health` read from the tokenizer manager, without schedulers behind it."""

    def __init__(self, server_args: Any) -> None:
        self.server_args = server_args
        self.startup_time = time.time()
        self.gracefully_exit = False

    async def get_internal_state(self) -> list[dict[str, Any]]:
        return [{}]

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"stand-in tokenizer manager has no {name} (no scheduler on a CPU)")


def serve(port: int, argv: list[str]) -> None:
    import uvicorn
    from sglang.srt.entrypoints import http_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.auth import add_api_key_middleware, app_has_admin_force_endpoints

    server_args = prepare_server_args(argv)
    app = http_server.app
    manager = StandInTokenizerManager(server_args)
    http_server.set_global_state(http_server._GlobalState(manager, None, {}))  # type: ignore[arg-type]
    # As launch_server does (http_server.py, single tokenizer mode).
    api_key, admin_api_key = server_args.api_key, server_args.admin_api_key
    if api_key or admin_api_key or app_has_admin_force_endpoints(app):
        add_api_key_middleware(app, api_key=api_key, admin_api_key=admin_api_key)
    print(f"sglang app ready on 127.0.0.1:{port}", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")  # no warmup: no model


def main() -> int:
    if sys.argv[1] == "routes":
        json.dump(route_table(), sys.stdout)
        return 0
    serve(int(sys.argv[2]), sys.argv[3:])
    return 0


if __name__ == "__main__":
    sys.exit(main())

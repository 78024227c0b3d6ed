"""The key guard's decision (m3fleet.keyguard.Guard), table by table: SGLang's auth levels with the keys moved out."""

from __future__ import annotations

import pytest

from m3fleet.engines.sglang import api_key_routes
from m3fleet.keyguard import Guard, Keys, route_pattern

API, ADMIN = "Bearer api-k", "Bearer admin-k"
BOTH = Guard(list(api_key_routes()), Keys("api-k", "admin-k"))
API_ONLY = Guard(list(api_key_routes()), Keys("api-k", None))
NONE = Guard(list(api_key_routes()), Keys(None, None))


@pytest.mark.parametrize(
    ("guard", "method", "path", "authorization", "verdict"),
    [
        (BOTH, "GET", "/health", None, None),  # probes
        (BOTH, "GET", "/metrics", None, None),  # Prometheus
        (BOTH, "OPTIONS", "/flush_cache", None, None),  # CORS preflight, as SGLang
        (BOTH, "GET", "/server_info", None, 401),
        (BOTH, "GET", "/server_info", API, None),
        (BOTH, "GET", "/server_info", ADMIN, 401),  # an API-key route takes the API key only, as SGLang
        (BOTH, "POST", "/v1/chat/completions", "bearer api-k", None),  # the scheme is case-insensitive
        (BOTH, "POST", "/v1/chat/completions", "Bearer api-kx", 401),
        (BOTH, "GET", "/v1/models/MiniMaxAI/MiniMax-M3", API, None),  # {model:path}
        (BOTH, "POST", "/flush_cache", API, 401),  # admin route
        (BOTH, "POST", "/flush_cache", ADMIN, None),
        (BOTH, "GET", "/v1/../flush_cache", API, 401),  # a path SGLang does not list: admin
        (BOTH, "DELETE", "/server_info", API, 401),  # a method SGLang does not list for it: admin
        (API_ONLY, "POST", "/flush_cache", API, 403),  # no admin key: the admin routes answer no one
        (NONE, "GET", "/server_info", None, None),  # no API key: SGLang's own default
        (NONE, "POST", "/update_weights_from_disk", None, 403),
    ],
)
def test_verdicts(guard: Guard, method: str, path: str, authorization: str | None, verdict: int | None) -> None:
    assert guard.verdict(method, path, authorization) == verdict


def test_route_patterns_match_as_starlette_does() -> None:
    assert route_pattern("/v1/files/{file_id}").match("/v1/files/abc")
    assert not route_pattern("/v1/files/{file_id}").match("/v1/files/abc/content")
    assert route_pattern("/v1/models/{model:path}").match("/v1/models/a/b")
    assert not route_pattern("/a.b").match("/aXb")  # literal parts are escaped

"""No SGLang key is readable without presenting it: SGLang's own server behind the rendered key guard.

SGLang 0.5.23 answers `/server_info` with its whole configuration (`admin_api_key`, and `launch_command` with
`--api-key`). These tests run SGLang's own FastAPI app (tests/support/engines/sglang_server.py: SGLang's routes,
handlers, argument parser and key middleware; only the scheduler is a stand-in) with the argv m3fleet renders, behind
the key guard the rendered pod runs (its container's command and args, in the SGLang venv's Python as in the image),
and read every GET route SGLang has, with no key, the API key and the admin key.

1. The route table m3fleet ships (engines/sglang-routes.json) is SGLang's own.
2. Through the guard no answer of any GET route holds either key; without the API key only /health*, /ready* and
   /metrics answer; the admin routes need the admin key; SGLang itself never holds a key, so its log cannot either.
3. The control: SGLang given the keys as flags, as m3fleet did before, serves the admin key on /server_info to
   anyone holding the API key - what the test above would catch.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.engines import sglang
from m3fleet.planner import plan
from m3fleet.render import render
from tests.support.engines import runner
from tests.support.engines.grid import expand
from tests.support.engines.tier import needs_engines, require_engines
from tests.support.ports import free_port

pytestmark = [pytest.mark.engine_parsers, needs_engines]

SERVER = Path(runner.__file__).with_name("sglang_server.py")
ROUTES = Path(__file__).resolve().parents[2] / "operator" / "m3fleet" / "engines" / sglang.ROUTES_FILE
API_KEY = "sk-api-7d1f0c"  # what the kubelet reads from the Secrets into the guard's environment
ADMIN_KEY = "sk-admin-93be55"
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
START_TIMEOUT_S = 300.0  # importing SGLang (torch) on a loaded 2-core box


def sglang_python() -> str:
    require_engines()
    pythons = runner.find_engine_pythons()
    assert pythons is not None
    return pythons["sglang"]


def sglang_routes() -> dict[str, list[list[str]]]:
    result = subprocess.run(
        [sglang_python(), str(SERVER), "routes"], capture_output=True, text=True, timeout=runner.TIMEOUT_S, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return dict(json.loads(result.stdout))


@pytest.fixture(scope="module")
def routes() -> dict[str, list[list[str]]]:
    """SGLang's own route table, read once for the module (each read imports SGLang: 20-50 s on a loaded box)."""
    return sglang_routes()


def test_the_shipped_route_table_is_sglangs_own(routes: dict[str, list[list[str]]]) -> None:
    """Regenerate with: python -m tests.engine_parsers.test_key_guard (in this repo's venv)."""
    stored = json.loads(ROUTES.read_text())
    assert stored["normalRoutes"] == routes["normalRoutes"], "stale: regenerate sglang-routes.json"


@dataclass
class Answer:
    status: int
    headers: str
    body: str

    def holds_a_key(self) -> bool:
        text = self.headers + self.body
        return API_KEY in text or ADMIN_KEY in text


def ask(port: int, method: str, path: str, key: str | None = None) -> Answer:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    if method in ("POST", "PUT"):
        request.data, request.headers["Content-Type"] = b"{}", "application/json"
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return Answer(response.status, str(response.headers), response.read().decode(errors="replace"))
    except urllib.error.HTTPError as error:
        return Answer(error.code, str(error.headers), error.read().decode(errors="replace"))


def wait_answering(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited {process.returncode}: {log.read_text()[-4000:]}"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # answering
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"nothing answered on {port}: {log.read_text()[-4000:]}")


@contextmanager
def started(argv: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        wait_answering(port, process, log)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def sample_with_keys() -> list[dict[str, Any]]:
    doc: dict[str, Any] = {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "m3", "namespace": "llm"},
        "spec": {
            "model": {"source": {"pvc": {"claimName": "w"}}},
            "engine": {
                "name": "sglang",
                "apiKeySecretRef": {"name": "api", "key": "key"},
                "adminApiKeySecretRef": {"name": "admin", "key": "key"},
            },
            "accelerator": "h200",
        },
    }
    resource = parse_resource(doc)
    return render(resource, plan(resource.spec))


def pod_containers() -> dict[str, dict[str, Any]]:
    workload = next(o for o in sample_with_keys() if o["kind"] == "Deployment")
    return {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}


def with_port(argv: list[str], port: int) -> list[str]:
    at = argv.index("--port")
    return [*argv[: at + 1], str(port), *argv[at + 2 :]]


def concrete(path: str) -> str:
    """A request path for a route template: every {param} filled."""
    parts = [("x" if part.startswith("{") and part.endswith("}") else part) for part in path.split("/")]
    return "/".join(parts)


def get_paths(routes: dict[str, list[list[str]]]) -> list[str]:
    return sorted(
        {concrete(path) for method, path in [*routes["normalRoutes"], *routes["otherRoutes"]] if method == "GET"}
    )


def test_no_key_is_readable_through_any_route_of_sglang_behind_the_guard(
    tmp_path: Path, routes: dict[str, list[list[str]]]
) -> None:
    containers = pod_containers()
    engine, guard = containers["engine"], containers["key-guard"]
    engine_port, guard_port = free_port(), free_port()
    engine_argv = with_port(list(engine["args"]), engine_port)
    assert engine["command"] == sglang.COMMAND and engine_argv[engine_argv.index("--host") + 1] == "127.0.0.1"
    assert "valueFrom" not in json.dumps(engine.get("env", []))  # the engine container is given no Secret
    config = {**json.loads(guard["args"][0]), "listen": guard_port, "upstream": engine_port, "host": "127.0.0.1"}
    guard_env = {
        e["name"]: {"api": API_KEY, "admin": ADMIN_KEY}[e["valueFrom"]["secretKeyRef"]["name"]] for e in guard["env"]
    }
    guard_argv = [sglang_python(), *[expand(arg, {}) for arg in guard["command"][1:]], json.dumps(config)]
    engine_log, guard_log = tmp_path / "sglang.log", tmp_path / "guard.log"
    with (
        started([sglang_python(), str(SERVER), "serve", str(engine_port), *engine_argv], engine_port, engine_log),
        started(guard_argv, guard_port, guard_log, guard_env),
    ):
        info = ask(guard_port, "GET", "/server_info", API_KEY)
        assert info.status == 200, info.body[:2000]
        served = json.loads(info.body)  # SGLang's own answer: its configuration, and it holds no key
        assert served["api_key"] is None and served["admin_api_key"] is None, served
        assert "--port" in served["launch_command"]
        paths = get_paths(routes)
        assert "/server_info" in paths and "/get_server_info" in paths
        for path in paths:
            for key in (None, API_KEY, ADMIN_KEY):
                answer = ask(guard_port, "GET", path, key)
                assert not answer.holds_a_key(), f"GET {path} with {key}: {answer.status} {answer.body[:2000]}"
                if key is None and not path.startswith(OPEN_PREFIXES):
                    assert answer.status in (401, 403), f"GET {path} without a key: {answer.status}"
        # An admin route: not with the API key, with the admin key it reaches SGLang.
        assert ask(guard_port, "POST", "/flush_cache", API_KEY).status == 401
        assert ask(guard_port, "POST", "/flush_cache", ADMIN_KEY).status not in (401, 403)
    for log in (engine_log, guard_log):
        text = log.read_text()
        assert API_KEY not in text and ADMIN_KEY not in text, f"{log.name}: {text[-2000:]}"


def test_control_sglang_given_the_keys_serves_the_admin_key_to_an_api_key_holder(tmp_path: Path) -> None:
    """As m3fleet ran SGLang before the key guard (the keys as flags, SGLang on the engine port)."""
    port = free_port()
    argv = with_port(list(pod_containers()["engine"]["args"]), port)
    argv += ["--api-key", API_KEY, "--admin-api-key", ADMIN_KEY]
    log = tmp_path / "sglang.log"
    with started([sglang_python(), str(SERVER), "serve", str(port), *argv], port, log):
        assert ask(port, "GET", "/server_info").status == 401
        leaked = ask(port, "GET", "/server_info", API_KEY)
        assert leaked.status == 200 and ADMIN_KEY in leaked.body and leaked.holds_a_key()


if __name__ == "__main__":  # regenerate the shipped table from the pinned SGLang
    table = sglang_routes()
    rows = ",\n".join(f"  {json.dumps(route)}" for route in table["normalRoutes"])
    ROUTES.write_text(f'{{"normalRoutes": [\n{rows}\n]}}\n')
    print(f"wrote {ROUTES} ({len(table['normalRoutes'])} API-key routes)")

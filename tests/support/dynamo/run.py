"""The commands of a disaggregated fleet's rendered pods, started on loopback with the pinned Dynamo.

What a kubelet would do with each pod, minus the container: its `python3 -m dynamo.<module> ...` argv, its literal
environment and its downward-API variables (POD_NAME, POD_NAMESPACE, POD_UID from the pod on the apiserver), and
the ServiceAccount token it would mount (a kubeconfig with a TokenRequest token of the pod's ServiceAccount: the
rendered Role is what Dynamo's Kubernetes discovery runs with). What is substituted, and why:

- an engine worker's module (dynamo.vllm / dynamo.sglang / dynamo.trtllm) by dynamo.mocker, Dynamo's CPU engine:
  no GPU here. It keeps the worker's role (--disaggregation-mode), its Dynamo namespace, discovery backend, request
  and event planes, the served model name and the KV block size; only the engine's own flags are left out;
- the model path by a stand-in directory (a config.json and a tiny word-level tokenizer): no weights here;
- every listening port by a free loopback one, and each process advertises 127.0.0.1 (DYN_TCP_RPC_HOST,
  DYN_EVENT_PLANE_HOST, DYN_SYSTEM_HOST): many pods share this host, and nothing may listen or be dialled off
  loopback. kwok's pod IPs are not this host's, so the pod's own address cannot be used.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.cluster.controlplane import Process
from tests.support.dynamo.commands import module_of
from tests.support.ports import free_port

TOKENIZER_SCRIPT = Path(__file__).resolve().parents[1] / "engines" / "tiny_tokenizer.py"
ENGINE_MODULES = ("dynamo.vllm", "dynamo.sglang", "dynamo.trtllm")
# The worker's Dynamo settings the mocker keeps, as every backend spells them (dynamo.vllm's --model is vLLM's).
KEPT_FLAGS = ("--discovery-backend", "--request-plane", "--event-plane", "--endpoint")
LOOPBACK = "127.0.0.1"
LOOPBACK_ENV = {"DYN_TCP_RPC_HOST": LOOPBACK, "DYN_EVENT_PLANE_HOST": LOOPBACK, "DYN_SYSTEM_HOST": LOOPBACK}
# The kubelet's downward API, for the fieldRef paths Dynamo's pods use.
FIELD_PATHS = {"metadata.name", "metadata.namespace", "metadata.uid"}
METRIC_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def stand_in_model(directory: Path, dynamo_python: str) -> Path:
    """A model directory the mocker and the frontend load: config.json and a word-level tokenizer ("w0" .. "w1999",
    one word one token) with a chat template, made offline in the Dynamo venv (it has `tokenizers`)."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run([dynamo_python, str(TOKENIZER_SCRIPT), str(directory)], check=True, capture_output=True)
    config = directory / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings["chat_template"] = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    config.write_text(json.dumps(settings))
    model = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "max_position_embeddings": 131072,
        "vocab_size": 2003,
        "eos_token_id": 2,
    }
    (directory / "config.json").write_text(json.dumps(model))
    return directory


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in argv (`--flag value` or `--flag=value`), or None."""
    for index, token in enumerate(argv):
        if token == flag and index + 1 < len(argv):
            return argv[index + 1]
        if token.startswith(f"{flag}="):
            return token.split("=", 1)[1]
    return None


def pod_environment(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet sets it: literal values and the downward API's pod fields."""
    environment: dict[str, str] = {}
    for variable in container.get("env") or []:
        if "value" in variable:
            environment[variable["name"]] = variable["value"]
            continue
        path = ((variable.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        if path in FIELD_PATHS:
            section, field = path.split(".")
            environment[variable["name"]] = pod[section][field]
    return environment


@dataclass
class Launch:
    """One pod's Dynamo process as started here."""

    pod: str
    role: str  # frontend | prefill | decode
    module: str  # what the pod runs
    argv: list[str]  # what runs here (after the interpreter)
    env: dict[str, str]
    system_port: int  # the worker's /metrics and /health (DYN_SYSTEM_PORT); the frontend's HTTP port
    served_model_name: str = ""  # a worker's --served-model-name
    process: Process | None = None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.system_port}/metrics", timeout=5) as response:
            return str(response.read().decode())


def plan_launch(pod: dict[str, Any], role: str, model: Path) -> Launch:
    """What this pod's Dynamo container becomes here (the module docstring lists each substitution)."""
    container = next(c for c in pod["spec"]["containers"] if module_of([*c.get("command", []), *c.get("args", [])]))
    found = module_of([*container.get("command", []), *container.get("args", [])])
    assert found is not None
    module, argv = found
    env = {**pod_environment(pod, container), **LOOPBACK_ENV}
    port = free_port()
    if module == "dynamo.frontend":
        argv = replace_flag(replace_flag(argv, "--http-host", LOOPBACK), "--http-port", str(port))
        return Launch(pod["metadata"]["name"], role, module, ["-m", module, *argv], env, port)
    if module not in ENGINE_MODULES:
        raise AssertionError(f"{pod['metadata']['name']} runs {module}, not a Dynamo engine worker")
    mode = flag_value(argv, "--disaggregation-mode")
    block_size = flag_value(argv, "--block-size") or flag_value(argv, "--page-size")
    assert mode == role, f"{pod['metadata']['name']} (role {role}) runs --disaggregation-mode {mode}"
    served_model_name = flag_value(argv, "--served-model-name")
    assert block_size is not None, f"{pod['metadata']['name']}: no KV block size in {argv}"
    assert served_model_name is not None, f"{pod['metadata']['name']}: no --served-model-name in {argv}"
    kept = [token for flag in KEPT_FLAGS if (value := flag_value(argv, flag)) is not None for token in (flag, value)]
    mocker = ["--model-path", str(model), "--model-name", served_model_name, "--block-size", block_size]
    env["DYN_SYSTEM_PORT"] = str(port)
    namespace = flag_value(argv, "--namespace")
    if namespace is not None:  # the mocker has no --namespace: it reads DYN_NAMESPACE, as the workers' flag sets it
        env["DYN_NAMESPACE"] = namespace
    return Launch(
        pod["metadata"]["name"], role, module, ["-m", "dynamo.mocker", *mocker, "--disaggregation-mode", mode, *kept],
        env, port, served_model_name,
    )  # fmt: skip


def replace_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with `flag`'s value replaced (the flag must be there: a rendered command without it is a finding)."""
    index = argv.index(flag)
    return [*argv[: index + 1], value, *argv[index + 2 :]]


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of metric `name` in a Prometheus text exposition."""
    found: list[tuple[dict[str, str], float]] = []
    for line in text.splitlines():
        match = METRIC_LINE.match(line)
        if match and match["name"] == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
            found.append((labels, float(match["value"])))
    return found


def served_by(launch: Launch, counter: str = "dynamo_component_requests_total") -> float:
    """The worker's own `generate` endpoint counter: requests it served (or, with dynamo_component_response_bytes_total,
    what it answered: a prefill worker answers the router with the KV hand-off, not with tokens)."""
    return sum(
        value for labels, value in samples(launch.metrics(), counter) if labels.get("dynamo_endpoint") == "generate"
    )


def worker_id(launch: Launch) -> str:
    """The id the worker's runtime labels its metrics with (the router's metrics name workers by it)."""
    ids = {labels["worker_id"] for labels, _ in samples(launch.metrics(), "dynamo_component_requests_total")}
    assert len(ids) == 1, ids
    return ids.pop()


def blocks_indexed(frontend: Launch, worker: str) -> float:
    """KV blocks the frontend's KV router learnt `worker` stored (KV events applied to its index)."""
    return sum(
        value
        for labels, value in samples(frontend.metrics(), "dynamo_component_kv_cache_events_applied")
        if labels.get("worker_id") == worker and labels.get("event_type") == "stored" and labels.get("status") == "ok"
    )


def by_role(launches: list[Launch]) -> dict[str, list[Launch]]:
    grouped: dict[str, list[Launch]] = defaultdict(list)
    for launch in launches:
        grouped[launch.role].append(launch)
    return grouped


def prefix_tokens_routed_to_cache(frontend: Launch) -> float:
    """Prompt tokens the KV router found cached on the prefill worker it picked, summed over its decisions."""
    return sum(
        value
        for labels, value in samples(
            frontend.metrics(), "dynamo_component_router_kv_selected_cached_prefix_tokens_total"
        )
        if labels.get("phase") == "prefill"
    )

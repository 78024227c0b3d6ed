"""Hostile strings in every user-controlled field reach the engine as literal data.

Each rendered engine container is started the way the kubelet starts it: its env resolved in order and its
command/args with `$(VAR)` expanded (Kubernetes' rules, `$$` a literal `$`), ConfigMap files at their mount path,
then exec'd - `vllm`, `trtllm-serve`, `python3` (SGLang and the hub chat-template lookup), `mpirun` and `ssh` are
recording stand-ins on PATH, and bash is the real bash. The payloads carry command substitutions, backticks, `;`,
pipes, quotes, a newline and `$(HF_TOKEN)`; the test asserts the stand-in's argv and env hold them byte for byte and
that no payload ran (a canary file). The image's environment is hostile too: BASH_ENV and an exported bash function
named like the engine, which `bash -p` must ignore.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.api.spec_pod import CONFIG_MOUNT, HOME_MOUNT, SSH_MOUNT
from m3fleet.planner import plan
from m3fleet.render import render
from tests.support.engines.grid import expand
from tests.support.stubs import install_stubs

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")

STUB = """#!/bin/bash -p
name="$(basename "$0")"
printf '%s\\0' "$@" > "${STUB_LOG}/${name}.argv"
env -0 > "${STUB_LOG}/${name}.env"
if [ "${name}" = python3 ] && [ "${1:-}" = -c ]; then
  case "$2" in *hf_hub_download*) echo /hf-cache/chat_template.jinja ;; esac
fi
exit 0
"""
STUBS = ("vllm", "python3", "trtllm-serve", "mpirun", "ssh", "install", "mkdir", "seq")
SECRET_VALUE = "secret-from-the-kubelet"
CANARY = "pwned"
LWS = {"LWS_LEADER_ADDRESS": "m3-0.m3.llm", "LWS_GROUP_SIZE": "1", "LWS_WORKER_INDEX": "0"}


def payload(field: str) -> str:
    c = CANARY  # relative: every command runs in the test's directory
    return (
        f"{field} $(touch {c}) `touch {c}` ; touch {c} | touch {c} && touch {c} "
        f"'q' \"dq\" \\ $(HF_TOKEN) ${{HOME}} $$ *\nline2 $(touch {c})"
    )


@dataclass(frozen=True)
class Hostile:
    checkpoint: str
    sub_path: str
    extra: list[str]
    env_value: str


def hostile_resource(engine: str, accelerator: str, hf: bool, values: Hostile) -> dict[str, Any]:
    source: dict[str, Any] = (
        {"huggingFace": {"cacheClaimName": "hf", "tokenSecretRef": {"name": "hf", "key": "token"}}}
        if hf
        else {"pvc": {"claimName": "w", "subPath": values.sub_path}}
    )
    engine_spec: dict[str, Any] = {
        "name": engine,
        "extraArgs": values.extra,
        "env": [{"name": "USER_NOTE", "value": values.env_value}],
    }
    if engine != "trtllm":
        engine_spec["apiKeySecretRef"] = {"name": "api", "key": "key"}
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "m3", "namespace": "llm"},
        "spec": {
            "model": {"checkpoint": values.checkpoint, "source": source},
            "engine": engine_spec,
            "accelerator": accelerator,
            "context": {"maxModelLen": 8192},
        },
    }


@dataclass
class Started:
    log: Path
    home: Path

    def argv(self, stub: str) -> list[str]:
        return (self.log / f"{stub}.argv").read_bytes().decode().split("\0")[:-1]

    def env(self, stub: str) -> dict[str, str]:
        pairs = (self.log / f"{stub}.env").read_bytes().decode().split("\0")[:-1]
        return dict(p.split("=", 1) for p in pairs)


def kubelet_env(container: dict[str, Any], extra: dict[str, str]) -> dict[str, str]:
    """The container's env as the kubelet resolves it: in order, each value's $(VAR) from those before it."""
    env = dict(extra)
    for entry in container.get("env", []):
        env[entry["name"]] = expand(entry["value"], env) if "value" in entry else SECRET_VALUE
    return env


def start(tmp: Path, objects: list[dict[str, Any]], role: str) -> Started:
    """Exec one rendered container as the kubelet would, with stand-ins on PATH and mounts under `tmp`."""
    workload = next(o for o in objects if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    if workload["kind"] == "Deployment":
        template = workload["spec"]["template"]
    else:
        template = workload["spec"]["leaderWorkerTemplate"][f"{role}Template"]
    container = template["spec"]["containers"][0]
    mounts = {CONFIG_MOUNT: tmp / "config", HOME_MOUNT: tmp / "home", SSH_MOUNT: tmp / "ssh"}
    for path in mounts.values():
        path.mkdir()
    config = next((o["data"] for o in objects if o["kind"] == "ConfigMap"), {})
    for name, text in config.items():
        (mounts[CONFIG_MOUNT] / name).write_text(text)
    stubs, log = install_stubs(tmp / "stubs", STUBS, STUB), tmp / "log"
    log.mkdir()
    evil = tmp / "bash_env.sh"
    evil.write_text(f"touch {tmp / CANARY}\n")
    image_env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "STUB_LOG": str(log),
        "BASH_ENV": str(evil),  # an image (or anyone) setting BASH_ENV must not run code in the launcher
        "BASH_FUNC_python3%%": f"() {{ touch {tmp / CANARY}; }}",  # nor an exported function named python3
    }
    env = kubelet_env(container, {**image_env, **LWS})

    def local(arg: str) -> str:
        for mount, path in mounts.items():
            if arg == mount or arg.startswith(f"{mount}/"):
                return str(path) + arg.removeprefix(mount)
        return arg

    env = {k: local(v) for k, v in env.items()}
    argv = [local(expand(a, env)) for a in [*container["command"], *container.get("args", [])]]
    if argv[0] == "/bin/bash":
        argv[0] = str(BASH)
    elif "/" not in argv[0]:
        argv[0] = str(stubs / argv[0])
    result = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, f"{argv[:6]}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return Started(log, mounts[HOME_MOUNT])


def values_for(tmp: Path) -> Hostile:
    return Hostile(
        checkpoint=payload("checkpoint"),
        sub_path=payload("subpath"),
        extra=[payload("arg"), "plain", payload("arg2")],
        env_value=payload("env"),
    )


def rendered(engine: str, accelerator: str, hf: bool, values: Hostile) -> list[dict[str, Any]]:
    resource = parse_resource(hostile_resource(engine, accelerator, hf, values))
    return render(resource, plan(resource.spec))


def assert_untouched(tmp: Path) -> None:
    assert not (tmp / CANARY).exists(), "a payload (or BASH_ENV / an exported function) ran"


def test_vllm_gets_every_value_literally(tmp_path: Path) -> None:
    values = values_for(tmp_path)
    run = start(tmp_path, rendered("vllm", "h200", False, values), "single")
    argv = run.argv("vllm")
    assert argv[0] == "serve" and argv[1] == f"/models/{values.sub_path}"
    assert argv[argv.index("--served-model-name") + 1] == values.checkpoint
    assert argv[-len(values.extra) :] == values.extra
    env = run.env("vllm")
    assert env["USER_NOTE"] == values.env_value
    assert env["VLLM_API_KEY"] == SECRET_VALUE and SECRET_VALUE not in argv  # the key: env only, never argv
    assert_untouched(tmp_path)


def test_sglang_gets_every_value_literally_and_no_key(tmp_path: Path) -> None:
    """SGLang holds no key (the key guard beside it does): none in its argv or its environment."""
    values = values_for(tmp_path)
    doc = hostile_resource("sglang", "h200", False, values)
    doc["spec"]["engine"]["adminApiKeySecretRef"] = {"name": "admin", "key": "key"}
    resource = parse_resource(doc)
    run = start(tmp_path, render(resource, plan(resource.spec)), "single")
    argv = run.argv("python3")
    assert argv[:2] == ["-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == f"/models/{values.sub_path}"
    assert argv[argv.index("--served-model-name") + 1] == values.checkpoint
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[-len(values.extra) :] == values.extra
    env = run.env("python3")
    assert env["USER_NOTE"] == values.env_value
    assert SECRET_VALUE not in argv and SECRET_VALUE not in env.values()
    assert_untouched(tmp_path)


@pytest.mark.parametrize("hf", [False, True], ids=["pvc-direct-exec", "hub-launch-script"])
def test_trtllm_single_node_gets_every_value_literally(tmp_path: Path, hf: bool) -> None:
    values = values_for(tmp_path)
    run = start(tmp_path, rendered("trtllm", "h200", hf, values), "single")
    argv = run.argv("trtllm-serve")
    if hf:  # the script fetched the checkpoint's chat template by its (hostile) id
        assert run.argv("python3")[-2:] == [values.checkpoint, "chat_template.jinja"]
        assert argv[argv.index("--chat_template") + 1] == "/hf-cache/chat_template.jinja"
    else:
        assert argv[0] == f"/models/{values.sub_path}"
        assert argv[argv.index("--chat_template") + 1] == f"/models/{values.sub_path}/chat_template.jinja"
    assert argv[-len(values.extra) :] == values.extra
    assert run.env("trtllm-serve")["USER_NOTE"] == values.env_value
    assert_untouched(tmp_path)


def test_trtllm_leader_hands_every_value_to_mpirun_literally(tmp_path: Path) -> None:
    values = values_for(tmp_path)
    objects = rendered("trtllm", "gb200", False, values)
    assert any(o["kind"] == "LeaderWorkerSet" for o in objects) or pytest.fail("expected a multi-node replica")
    run = start(tmp_path, objects, "leader")
    argv = run.argv("mpirun")
    command = argv[argv.index("trtllm-llmapi-launch") :]
    assert command[2] == f"/models/{values.sub_path}"
    assert command[-len(values.extra) :] == values.extra
    assert "-x" in argv and "USER_NOTE" in argv and run.env("mpirun")["USER_NOTE"] == values.env_value
    assert_untouched(tmp_path)


def test_the_kubelet_would_not_expand_references_in_user_values(tmp_path: Path) -> None:
    """`$(HF_TOKEN)` in a user's value stays text (escaped as `$$(`), so the token never lands in argv or env."""
    values = values_for(tmp_path)
    objects = rendered("vllm", "h200", True, values)
    container = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = kubelet_env(container, {})
    assert env["HF_TOKEN"] == SECRET_VALUE
    argv = [expand(a, env) for a in container["args"]]
    assert SECRET_VALUE not in " ".join(argv) and SECRET_VALUE not in env["USER_NOTE"]
    assert "$(HF_TOKEN)" in argv[argv.index("--served-model-name") + 1]
    assert os.sep not in values.checkpoint.split()[0]  # the payloads are not paths the test created

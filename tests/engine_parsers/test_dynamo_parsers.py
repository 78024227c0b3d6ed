"""Every NVIDIA Dynamo command m3fleet renders is accepted by Dynamo's own argument parsers, of the pinned release.

Items: the Dynamo frontend and worker commands of every disaggregated sample and of a fixed grid (each backend the
product renders on Dynamo x accelerator x each role's strategy), taken from the rendered objects the way
test_rendered_commands.py takes vLLM's and SGLang's. All go through ONE checker process in the venv
`.ci/dynamo-env.sh` builds (tests/support/dynamo/checker.py says what each module's check runs: dynamo.frontend and
dynamo.trtllm completely; dynamo.vllm and dynamo.sglang their Dynamo half, without the engine their parse_args
imports). Without the venv these tests fail with the build command; `M3FLEET_SKIP_ENGINE_PARSERS=1` skips them.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from tests.support.dynamo import env
from tests.support.engines.tier import needs_engines

pytestmark = [pytest.mark.engine_parsers, needs_engines]

# The checker's own controls: what Dynamo accepts and what it refuses, so a checker that accepted everything (a
# parser never reached, an error swallowed) fails here. Each refusal is one thing wrong with an accepted command.
PLANES = ["--discovery-backend", "kubernetes", "--request-plane", "tcp", "--event-plane", "zmq"]
ACCEPTED: dict[str, tuple[str, list[str]]] = {
    "frontend": ("dynamo.frontend", ["--http-port", "8000", "--router-mode", "kv", *PLANES]),
    "trtllm-prefill": (
        "dynamo.trtllm",
        ["--model-path", "/models/m3", "--disaggregation-mode", "prefill", "--extra-engine-args", "/e.yaml", *PLANES],
    ),
    "vllm-decode": ("dynamo.vllm", ["--disaggregation-mode", "decode", "--model", "/models/m3", *PLANES]),
    "sglang-prefill": ("dynamo.sglang", [*PLANES, "--model-path", "/models/m3", "--disaggregation-mode", "prefill"]),
}
REFUSED: dict[str, tuple[str, list[str], str]] = {
    # (module, argv, the words Dynamo's refusal must contain)
    "frontend-router-mode": ("dynamo.frontend", ["--router-mode", "kv-cache"], "--router-mode"),
    "frontend-engine-flag": ("dynamo.frontend", ["--block-size", "128"], "--block-size"),
    "frontend-plane": ("dynamo.frontend", ["--request-plane", "grpc"], "--request-plane"),
    "trtllm-mode": ("dynamo.trtllm", ["--model-path", "/m", "--disaggregation-mode", "prefil"], "prefil"),
    "trtllm-stray": ("dynamo.trtllm", ["--model-path", "/m", "stray"], "stray"),
    "vllm-discovery": ("dynamo.vllm", ["--model", "/m", "--discovery-backend", "k8s"], "--discovery-backend"),
    "sglang-event-plane": ("dynamo.sglang", ["--model-path", "/m", "--event-plane", "kafka"], "--event-plane"),
}


def items_of(cases: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"id": name, "module": case[0], "argv": case[1], "env": {}} for name, case in cases.items()]


@pytest.fixture(scope="module")
def control_verdicts() -> dict[str, dict[str, Any]]:
    env.require_python()
    return env.check(items_of(ACCEPTED) + items_of(REFUSED))


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_checker_accepts_a_valid_command(control_verdicts: dict[str, dict[str, Any]], name: str) -> None:
    result = control_verdicts[name]
    module, argv = ACCEPTED[name]
    assert result["verdict"] == "accept", f"{module} {shlex.join(argv)}:\n{result['error']}"
    assert result["unknown_spellings"] == []
    # What the parser made of it: proof it was parsed, not waved through.
    parsed = result["parsed"]
    assert (parsed["discovery_backend"], parsed["request_plane"], parsed["event_plane"]) == ("kubernetes", "tcp", "zmq")
    if module == "dynamo.sglang":  # SGLang's own flag there: handed on to the engine's parser
        assert result["engine_argv"][-2:] == ["--disaggregation-mode", "prefill"]
    elif module != "dynamo.frontend":
        assert parsed["disaggregation_mode"] == argv[argv.index("--disaggregation-mode") + 1]


def test_checker_hands_the_engine_flags_of_vllm_and_sglang_on() -> None:
    # The Dynamo half of dynamo.vllm keeps its own flags and leaves the engine's: --model is vLLM's.
    result = env.check(
        [{"id": "v", "module": "dynamo.vllm", "argv": ["--model", "/m", "--block-size", "128"], "env": {}}]
    )["v"]
    assert result["verdict"] == "accept"
    assert result["engine_argv"] == ["--model", "/m", "--block-size", "128"]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_checker_refuses_an_invalid_command(control_verdicts: dict[str, dict[str, Any]], name: str) -> None:
    module, argv, words = REFUSED[name]
    result = control_verdicts[name]
    assert result["verdict"] == "reject", f"{module} accepted {shlex.join(argv)}"
    assert words in result["error"], result["error"]


def test_checker_reads_the_container_environment() -> None:
    # Dynamo's options default from DYN_* variables, so a command is checked with its container's environment.
    item = {"id": "e", "module": "dynamo.frontend", "argv": [], "env": {"DYN_ROUTER_MODE": "kv"}}
    assert env.check([item])["e"]["parsed"]["router_mode"] == "kv"
    assert env.check([{**item, "id": "d", "env": {}}])["d"]["parsed"]["router_mode"] != "kv"

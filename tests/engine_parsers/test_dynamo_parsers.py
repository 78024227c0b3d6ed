"""Every NVIDIA Dynamo command m3fleet renders is accepted by Dynamo's own argument parsers, of the pinned release.

Items: the Dynamo frontend and worker commands of every disaggregated sample and of a fixed grid (each backend the
product renders on Dynamo x accelerator x each role's strategy), taken from the rendered objects the way
test_rendered_commands.py takes vLLM's and SGLang's. All go through ONE checker process in the venv
`.ci/dynamo-env.sh` builds (tests/support/dynamo/checker.py says what each module's check runs: dynamo.frontend and
dynamo.trtllm completely; dynamo.vllm and dynamo.sglang their Dynamo half, without the engine their parse_args
imports). Without the venv these tests fail with the build command; `M3FLEET_SKIP_ENGINE_PARSERS=1` skips them.
"""

from __future__ import annotations

import contextlib
import itertools
import shlex
from typing import Any

import pytest
import yaml

from m3fleet.errors import SpecError
from tests.support.dynamo import env
from tests.support.dynamo.commands import DynamoCommand, dynamo_commands
from tests.support.engines import grid
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


# --- every Dynamo command the operator renders -----------------------------------------------------------------------

BACKENDS = ("trtllm", "vllm", "sglang")
ACCELERATORS = ("h200", "gb200")
# Each role's layout: the backend's defaults, and each strategy the roles can be pinned to.


def layout(prefill: str, decode: str) -> dict[str, Any]:
    return {"prefill": {"parallelism": {"strategy": prefill}}, "decode": {"parallelism": {"strategy": decode}}}


LAYOUTS: dict[str, dict[str, Any]] = {
    "auto": {},
    "tp-ep": layout("tp-ep", "tp-ep"),
    "dp-ep-decode": layout("tp-ep", "dp-ep"),
}
INPUTS = (8_192, 32_768)


def disaggregated(backend: str, accelerator: str, layout: str, input_tokens: int) -> dict[str, Any]:
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "grid", "namespace": grid.NAMESPACE},
        "spec": {
            "model": {"variant": "bf16", "source": {"pvc": {"claimName": "weights", "subPath": "m3"}}},
            "engine": {"name": backend},
            "accelerator": accelerator,
            "context": {"maxModelLen": 131_072},
            "disaggregation": {"inputTokens": input_tokens, "outputTokens": 1024, **LAYOUTS[layout]},
        },
    }


def rendered_fleets() -> list[grid.Rendered]:
    """Every sample with spec.disaggregation and the grid's specs the planner accepts (the rest are refused by
    design, e.g. a layout that does not fit the role's pool), rendered."""
    fleets = [
        grid.render_document(f"sample/disaggregated/{path.stem}", yaml.safe_load(path.read_text()))
        for path in sorted((grid.SAMPLES_DIR / "disaggregated").glob("*.yaml"))
    ]
    fleets += [r for r in grid.samples() if dynamo_commands(r.label, r.objects)]
    for backend, accelerator, layout, input_tokens in itertools.product(BACKENDS, ACCELERATORS, LAYOUTS, INPUTS):
        label = f"grid/{backend}-{accelerator}-{layout}-{input_tokens}"
        with contextlib.suppress(SpecError):
            fleets.append(grid.render_document(label, disaggregated(backend, accelerator, layout, input_tokens)))
    return fleets


FLEETS = rendered_fleets()
COMMANDS: list[DynamoCommand] = [c for fleet in FLEETS for c in dynamo_commands(fleet.label, fleet.objects)]


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, Any]]:
    env.require_python()
    return env.check([command.item() for command in COMMANDS])


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_dynamo_accepts_rendered_command(verdicts: dict[str, dict[str, Any]], command: DynamoCommand) -> None:
    result = verdicts[command.id]
    problems = []
    if result["verdict"] != "accept":
        problems.append(f"{command.module} rejects it at stage {result['stage']!r}:\n{result['error']}")
    if result["unknown_spellings"]:
        problems.append(f"not spelt as {command.module} defines the flag: {result['unknown_spellings']}")
    unexpanded = [arg for arg in command.argv if "$(" in arg or "${" in arg]
    if unexpanded:
        problems.append(f"references nothing expands before Dynamo parses them: {unexpanded}")
    if problems:
        pytest.fail(
            f"{command.id} (role {command.role}):\n" + "\n".join(problems) + f"\nargv: {shlex.join(command.argv)}",
            pytrace=False,
        )


def worker_block_size(command: DynamoCommand, result: dict[str, Any]) -> str | None:
    """The KV block size a worker runs with, where its backend reads it (Dynamo's flag or the engine's)."""
    if command.module == "dynamo.trtllm":
        return str(result["parsed"].get("kv_block_size"))
    flag = {"dynamo.vllm": "--block-size", "dynamo.sglang": "--page-size"}[command.module]
    return value_of(result["engine_argv"], flag)


def value_of(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def disaggregation_mode(command: DynamoCommand, result: dict[str, Any]) -> str | None:
    if command.module == "dynamo.sglang":  # SGLang's own flag, handed to its parser
        return value_of(result["engine_argv"], "--disaggregation-mode")
    return str(result["parsed"].get("disaggregation_mode"))


@pytest.mark.parametrize("fleet", FLEETS, ids=[f.label for f in FLEETS])
def test_the_frontend_and_the_workers_of_a_fleet_find_each_other(
    verdicts: dict[str, dict[str, Any]], fleet: grid.Rendered
) -> None:
    # As Dynamo parses them: the frontend routes only to workers registered under its namespace, through the same
    # discovery backend and planes, hashing prompts in blocks of the workers' KV block size.
    commands = dynamo_commands(fleet.label, fleet.objects)
    frontends = [c for c in commands if c.module == "dynamo.frontend"]
    workers = [c for c in commands if c.module != "dynamo.frontend"]
    assert len(frontends) == 1 and {c.role for c in workers} == {"prefill", "decode"}, [c.id for c in commands]
    frontend = verdicts[frontends[0].id]["parsed"]
    assert frontend["router_mode"] == "kv"
    shared = ("namespace", "discovery_backend", "request_plane", "event_plane")
    for worker in workers:
        result = verdicts[worker.id]
        assert {k: result["parsed"][k] for k in shared} == {k: frontend[k] for k in shared}, worker.id
        assert disaggregation_mode(worker, result) == worker.role, worker.id
        assert worker_block_size(worker, result) == str(frontend["kv_cache_block_size"]), worker.id
    assert frontend["discovery_backend"] == "kubernetes"


def test_every_backend_and_role_is_checked() -> None:
    # A planner change could quietly refuse a whole backend: keep each one's frontend and both roles checked.
    for backend in BACKENDS:
        module = f"dynamo.{backend}"
        roles = {c.role for c in COMMANDS if c.module == module}
        assert roles == {"prefill", "decode"}, (module, roles)
        places = {c.id.rsplit("/", 2)[1] for c in COMMANDS if c.module == module}
        assert "leader" in places, f"no multi-node {module} command"
    assert sum(c.module == "dynamo.frontend" for c in COMMANDS) == len(FLEETS)

"""Every vLLM and SGLang command m3fleet renders is accepted by that engine's own parser and validation.

Items: every sample in manifests/samples/ plus a fixed grid (engine x accelerator x variant x strategy x
context x KV dtype x text-only, MXFP4 x MoE backend; single pods and multi-node leader + worker), see
grid.py. All go through ONE `runner.check()` call per session (conftest.py): importing vLLM alone takes
7-30 s. Without the engine venvs these tests fail with the build command; `M3FLEET_SKIP_ENGINE_PARSERS=1` skips
them.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from m3fleet.api.models import EngineName
from m3fleet.catalog import ENGINES
from tests.support.engines import grid, runner
from tests.support.engines.tier import needs_engines, require_engines

pytestmark = pytest.mark.engine_parsers
# Only the engine verdicts need the venvs (needs_engines); the coverage and image checks below always run.

RENDERED = grid.samples() + grid.grid(grid.spec_grid(runner.ENGINES)) + grid.grid(grid.PIPELINE_SPECS)
COMMANDS = [command for rendered in RENDERED for command in grid.commands(rendered)]


@pytest.fixture(scope="module")
def verdicts(engine_verdicts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """id -> checker result for every command (one checker run with the negative controls, conftest.py); fails
    (never skips) with the build hint without the venvs."""
    require_engines()
    return engine_verdicts


@needs_engines
@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_engine_accepts_rendered_command(verdicts: dict[str, dict[str, Any]], command: grid.Command) -> None:
    result = verdicts[command.id]
    problems: list[str] = []
    if result["verdict"] != "accept":
        problems.append(f"{command.engine} rejects it at stage {result['stage']!r}:\n{result['error']}")
    if result["unknown_spellings"]:
        # argparse takes unique prefixes and vLLM rewrites `_`: accepted today, broken by the next new flag.
        problems.append(f"not spelt as {command.engine} defines the flag: {result['unknown_spellings']}")
    unexpanded = [arg for arg in command.argv if "$(" in arg]
    if unexpanded:
        problems.append(f"references the kubelet cannot expand (no such env var): {unexpanded}")
    if problems:
        pytest.fail(
            f"{command.resource}, container {command.container!r} (role {command.role}):\n"
            + "\n".join(problems)
            + f"\nargv after the launcher: {shlex.join(command.argv)}",
            pytrace=False,
        )


def _has(engine: str, role: str, *tokens: str) -> bool:
    return any(c.engine == engine and c.role == role and set(tokens) <= set(c.argv) for c in COMMANDS)


@pytest.mark.parametrize("engine", runner.ENGINES)
def test_grid_still_covers_the_cases_it_promises(engine: str) -> None:
    # A planner change could quietly turn every multi-node spec into a rejection; keep the cases checked.
    multimodal = {"vllm": "--mm-encoder-tp-mode", "sglang": "--enable-multimodal"}[engine]
    yarn = {"vllm": "--hf-overrides", "sglang": "--json-model-override-args"}[engine]
    kv_fp8 = {"vllm": "fp8", "sglang": "fp8_e4m3"}[engine]
    dp = {"vllm": "--data-parallel-size", "sglang": "--enable-dp-attention"}[engine]
    ep = {"vllm": "--enable-expert-parallel", "sglang": "--ep-size"}[engine]
    pp = {"vllm": "--pipeline-parallel-size", "sglang": "--pp-size"}[engine]
    for role in ("leader", "worker"):
        assert _has(engine, role, "--nnodes"), f"no multi-node {role} command for {engine}"
        assert _has(engine, role, pp, ep), f"no multi-node pipeline-parallel {role} command for {engine}"
        assert _has(engine, role, dp), f"no multi-node dp-ep {role} command for {engine}"
        # vLLM applies YaRN only on ROCm (its NVIDIA M3 model ignores rope_scaling, so the planner refuses it
        # there), and MI355X serves 1M on one node: only SGLang has a multi-node YaRN command.
        if engine == "sglang":
            assert _has(engine, role, yarn), f"no multi-node {role} command with YaRN for {engine}"
    text_only = {"vllm": "--language-model-only", "sglang": "--language-model-only"}[engine]
    for tokens in ([multimodal], [yarn], [dp, ep], [ep], ["--kv-cache-dtype", kv_fp8], [text_only]):
        assert _has(engine, "single", *tokens), f"no single-pod {engine} command with {tokens}"
    assert any(c.engine == engine and multimodal not in c.argv for c in COMMANDS), "no text-only command"
    if engine == "vllm":
        for backend in ("aiter", "emulation"):
            assert _has(engine, "single", "--moe-backend", backend), f"no MXFP4 command with {backend}"
    accelerators = {r.accelerator for r in RENDERED if r.engine == engine and r.label.startswith("grid/")}
    # An accelerator whose flags are its twin's (tests/unit/test_pools.py proves it) is covered by the twin's commands.
    twins = {a: grid.flag_twin(engine, a) for a in ENGINES[EngineName(engine)].support}
    assert accelerators == {a for a, twin in twins.items() if twin is None}, "every served accelerator but twins"
    assert all(twin in accelerators for twin in twins.values() if twin is not None)


@pytest.mark.parametrize("engine", runner.ENGINES)
def test_default_images_are_tags_of_the_checked_release(engine: str) -> None:
    # The flags are checked against the pinned version: the default pods must run exactly that release.
    version = runner.pinned_versions()[engine]
    facts = ENGINES[EngineName(engine)]
    assert facts.version == version
    for accelerator, image in facts.images.items():
        tag = image.rsplit(":", 1)[1]
        assert tag == f"v{version}" or tag.startswith(f"v{version}-"), f"{accelerator}: {image}"

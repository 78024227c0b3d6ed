"""Negative controls for the engine-parser tier: the check can pass AND can fail.

Every item goes through ONE `runner.check()` call per session, with the rendered commands (conftest.py; vLLM's
import alone takes 7-30 s). Without the engine venvs these tests fail with the build command;
`M3FLEET_SKIP_ENGINE_PARSERS=1` skips them.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.support.engines import runner
from tests.support.engines.tier import needs_engines, require_engines

pytestmark = [pytest.mark.engine_parsers, needs_engines]

VLLM_BASE = [
    "MiniMaxAI/MiniMax-M3",
    "--tensor-parallel-size",
    "8",
    "--block-size",
    "128",
    "--tool-call-parser",
    "minimax_m3",
    "--reasoning-parser",
    "minimax_m3",
    "--enable-auto-tool-choice",
    "--max-model-len",
    "131072",
]
SGLANG_BASE = [
    "--model-path",
    "MiniMaxAI/MiniMax-M3",
    "--tp-size",
    "8",
    "--trust-remote-code",
    "--mem-fraction-static",
    "0.75",
    "--reasoning-parser",
    "minimax-m3",
    "--tool-call-parser",
    "minimax-m3",
    "--enable-metrics",
]


def swap(argv: list[str], flag: str, value: str) -> list[str]:
    """`argv` with the value after `flag` replaced."""
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def rename(argv: list[str], flag: str, spelling: str) -> list[str]:
    """`argv` with `flag` spelt `spelling`."""
    return [spelling if arg == flag else arg for arg in argv]


ITEMS: dict[str, tuple[str, list[str]]] = {
    "vllm-good": ("vllm", VLLM_BASE),
    "vllm-misspelt": ("vllm", rename(VLLM_BASE, "--block-size", "--block-sizes")),
    "vllm-tool-parser-dash": ("vllm", swap(VLLM_BASE, "--tool-call-parser", "minimax-m3")),
    "vllm-reasoning-parser-dash": ("vllm", swap(VLLM_BASE, "--reasoning-parser", "minimax-m3")),
    "vllm-kv-fp9": ("vllm", [*VLLM_BASE, "--kv-cache-dtype", "fp9"]),
    "vllm-abbrev": ("vllm", rename(VLLM_BASE, "--tensor-parallel-size", "--tensor-parallel-si")),
    "vllm-underscore-eq": ("vllm", [*VLLM_BASE, "--gpu_memory_utilization=0.9"]),
    "vllm-spec-good": (
        "vllm",
        [*VLLM_BASE, "--speculative-config", '{"method":"minimax_m3_mtp","num_speculative_tokens":3}'],
    ),
    "vllm-spec-method": (
        "vllm",
        [*VLLM_BASE, "--speculative-config", '{"method":"minimax_m3","num_speculative_tokens":3}'],
    ),
    "vllm-spec-key": ("vllm", [*VLLM_BASE, "--speculative-config", '{"method":"eagle3","draft_model":"x/y"}']),
    "vllm-spec-backend": (
        "vllm",
        [*VLLM_BASE, "--speculative-config", '{"method":"eagle3","model":"x/y","attention_backend":"FLASH_ATTENTION"}'],
    ),
    "sglang-good": ("sglang", SGLANG_BASE),
    "sglang-spec-eagle": ("sglang", [*SGLANG_BASE, "--speculative-algorithm", "EAGLE-3"]),
    "sglang-misspelt": ("sglang", rename(SGLANG_BASE, "--tp-size", "--tp-sizes")),
    "sglang-tool-parser-underscore": ("sglang", swap(SGLANG_BASE, "--tool-call-parser", "minimax_m3")),
    "sglang-reasoning-parser-underscore": ("sglang", swap(SGLANG_BASE, "--reasoning-parser", "minimax_m3")),
    "sglang-kv-fp9": ("sglang", [*SGLANG_BASE, "--kv-cache-dtype", "fp9"]),
    "sglang-abbrev": ("sglang", rename(SGLANG_BASE, "--tp-size", "--tensor-parallel-si")),
    "sglang-abbrev-eq": ("sglang", [*SGLANG_BASE, "--context-len=131072"]),
}


@pytest.fixture(scope="module")
def verdicts(engine_verdicts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """id -> checker result for every item in ITEMS (one checker run with the rendered commands, conftest.py); {}
    when the venvs are missing."""
    return engine_verdicts


def verdict(verdicts: dict[str, dict[str, Any]], item_id: str) -> dict[str, Any]:
    """One item's result; fails (never skips) with the build command when the venvs are missing."""
    if not verdicts:
        require_engines()
    return verdicts[item_id]


@pytest.mark.parametrize("item_id", ["vllm-good", "sglang-good", "vllm-spec-good"])
def test_known_good_command_is_accepted(verdicts: dict[str, dict[str, Any]], item_id: str) -> None:
    result = verdict(verdicts, item_id)
    assert (result["verdict"], result["error"], result["unknown_spellings"]) == ("accept", None, [])


@pytest.mark.parametrize(
    ("item_id", "stage", "needle"),
    [
        ("vllm-misspelt", "parse", "unrecognized arguments: --block-sizes"),
        ("vllm-tool-parser-dash", "registry", "invalid tool call parser: minimax-m3"),
        ("vllm-reasoning-parser-dash", "registry", "invalid reasoning parser: minimax-m3"),
        ("vllm-kv-fp9", "subconfigs", "Invalid kv_cache_dtype: 'fp9'"),
        ("sglang-misspelt", "parse", "unrecognized arguments: --tp-sizes"),
        (
            "sglang-tool-parser-underscore",
            "parse",
            "argument --tool-call-parser: invalid choice: 'minimax_m3'",
        ),
        (
            "sglang-reasoning-parser-underscore",
            "parse",
            "argument --reasoning-parser: invalid choice: 'minimax_m3'",
        ),
        ("sglang-kv-fp9", "parse", "argument --kv-cache-dtype: invalid choice: 'fp9'"),
        # --speculative-config: what SpeculativeConfig would refuse once it has the checkpoint (checker.speculative)
        ("vllm-spec-method", "subconfigs", "unknown method 'minimax_m3'"),
        ("vllm-spec-key", "subconfigs", "unknown keys ['draft_model']"),
        ("vllm-spec-backend", "subconfigs", "FLASH_ATTENTION"),
        ("sglang-spec-eagle", "speculative", "Unknown speculative algorithm name: EAGLE-3"),
    ],
)
def test_bad_command_is_rejected_at_stage(
    verdicts: dict[str, dict[str, Any]], item_id: str, stage: str, needle: str
) -> None:
    result = verdict(verdicts, item_id)
    assert (result["verdict"], result["stage"]) == ("reject", stage), result
    assert needle in result["error"]


@pytest.mark.parametrize(
    ("item_id", "spelling"),
    [
        ("vllm-abbrev", "--tensor-parallel-si"),
        ("vllm-underscore-eq", "--gpu_memory_utilization=0.9"),
        ("sglang-abbrev", "--tensor-parallel-si"),
        ("sglang-abbrev-eq", "--context-len=131072"),
    ],
)
def test_inexact_spelling_is_accepted_but_reported(
    verdicts: dict[str, dict[str, Any]], item_id: str, spelling: str
) -> None:
    # argparse takes unique prefixes and vLLM rewrites `_` to `-`: only the spelling check sees it.
    result = verdict(verdicts, item_id)
    assert (result["verdict"], result["unknown_spellings"]) == ("accept", [spelling]), result


def test_misspelt_flag_is_also_reported_as_unknown_spelling(verdicts: dict[str, dict[str, Any]]) -> None:
    assert verdict(verdicts, "vllm-misspelt")["unknown_spellings"] == ["--block-sizes"]
    assert verdict(verdicts, "sglang-misspelt")["unknown_spellings"] == ["--tp-sizes"]


@pytest.mark.parametrize("engine", runner.ENGINES)
def test_venv_holds_the_pinned_engine_version(verdicts: dict[str, dict[str, Any]], engine: str) -> None:
    verdict(verdicts, f"{engine}-good")  # fails with the build hint when the venvs are missing
    python = runner.find_engine_pythons()[engine]  # type: ignore[index]
    installed = subprocess.run(
        [python, "-c", f"import importlib.metadata as m; print(m.version({engine!r}))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert installed == runner.pinned_versions()[engine]

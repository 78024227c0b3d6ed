"""Run `checker.py` in each engine's own venv and collect its verdicts (stdlib only).

The venvs come from `bash .ci/engine-envs.sh`, which records their interpreters in
`$M3FLEET_ENGINE_ENVS/pythons.env` (default `~/.cache/m3fleet/engine-envs`). `M3FLEET_VLLM_PY` /
`M3FLEET_SGLANG_PY` override that, both or neither.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

CHECKER = Path(__file__).with_name("checker.py")
VERSIONS = Path(__file__).resolve().parents[3] / "operator" / "m3fleet" / "catalog" / "versions.py"
ENGINES = ("vllm", "sglang")
BUILD_HINT = "build them with `bash .ci/engine-envs.sh` (3-6 min and 11 GB cold, seconds when cached)"
# Importing vLLM takes 7-30 s (cold disk cache); each item a few ms. Generous, for a loaded CI box.
TIMEOUT_S = 600.0


def envs_root() -> Path:
    """Where `.ci/engine-envs.sh` builds the venvs."""
    default = Path.home() / ".cache" / "m3fleet" / "engine-envs"
    return Path(os.environ.get("M3FLEET_ENGINE_ENVS") or default)


def pinned_versions() -> dict[str, str]:
    """{"vllm": VLLM_VERSION, "sglang": SGLANG_VERSION} from the catalog (the single source)."""
    pinned = runpy.run_path(str(VERSIONS))
    return {engine: str(pinned[f"{engine.upper()}_VERSION"]) for engine in ENGINES}


def find_engine_pythons() -> dict[str, str] | None:
    """{"vllm": python, "sglang": python}, or None when the venvs are missing or stale."""
    from_env = {e: os.environ.get(f"M3FLEET_{e.upper()}_PY", "") for e in ENGINES}
    if all(from_env.values()):
        pythons = from_env
    else:
        record = envs_root() / "pythons.env"
        if not record.is_file():
            return None
        lines = dict(line.split("=", 1) for line in record.read_text().splitlines() if "=" in line)
        pythons = {e: lines.get(f"{e.upper()}_PY", "") for e in ENGINES}  # VLLM_PY, SGLANG_PY
        # The build script names each venv <engine>-<version>-<hash>; a record from before a
        # version bump in versions.py points at the old engines: treat it as missing.
        pinned = pinned_versions()
        for engine, python in pythons.items():
            if f"/{engine}-{pinned[engine]}-" not in python:
                return None
    if not all(python and os.access(python, os.X_OK) for python in pythons.values()):
        return None
    return pythons


def check(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Verdicts for `items` ({"id", "engine", "argv"}), in input order; one subprocess per engine."""
    pythons = find_engine_pythons()
    if pythons is None:
        raise RuntimeError(f"engine venvs not found under {envs_root()}: {BUILD_HINT}")
    by_engine: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        if item["engine"] not in ENGINES:
            raise ValueError(f"unknown engine {item['engine']!r} in item {item['id']!r}")
        by_engine.setdefault(item["engine"], []).append(item)
    if len({item["id"] for item in items}) != len(items):
        raise ValueError("item ids must be unique")

    # Both engines at once: each checker is mostly its engine's import (torch, then the engine).
    with ThreadPoolExecutor(max(len(by_engine), 1)) as pool:
        batches = [
            pool.submit(run_checker, pythons[engine], CHECKER, batch, f"{engine} checker")
            for engine, batch in by_engine.items()
        ]
        results = {r["id"]: r for batch in batches for r in batch.result()}
    return [results[item["id"]] for item in items]


def run_checker(python: str, script: Path, items: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    """`script`'s JSON verdicts on `items` (JSON on stdin), run by another venv's `python`."""
    proc = subprocess.run(
        [python, str(script)], input=json.dumps(items), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{what} exited {proc.returncode}:\n{proc.stderr[-5000:]}")
    verdicts: list[dict[str, Any]] = json.loads(proc.stdout)
    return verdicts

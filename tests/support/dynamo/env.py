"""The pinned Dynamo venv (`.ci/dynamo-env.sh`): where it is, and Dynamo's own parsers run in it (stdlib only).

`$M3FLEET_DYNAMO_PY` overrides the interpreter; otherwise `$M3FLEET_DYNAMO_ENV/python.env` (default
`~/.cache/m3fleet/dynamo`) names it. Without it the tests that need it fail with the build command, never skip.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.dynamo.pinned import dynamo_version
from tests.support.engines import runner

CHECKER = Path(__file__).with_name("checker.py")
BUILD_HINT = "build it with `bash .ci/dynamo-env.sh` (1-7 min and 700 MB cold, a second when cached)"


def env_root() -> Path:
    return Path(os.environ.get("M3FLEET_DYNAMO_ENV") or Path.home() / ".cache" / "m3fleet" / "dynamo")


def find_python() -> str | None:
    """The Dynamo venv's python, or None when it is missing or built for another release than the catalog's."""
    python = os.environ.get("M3FLEET_DYNAMO_PY", "")
    if not python:
        record = env_root() / "python.env"
        if not record.is_file():
            return None
        lines = dict(line.split("=", 1) for line in record.read_text().splitlines() if "=" in line)
        python = lines.get("DYNAMO_PY", "")
        # The build script names the venv dynamo-<version>-<hash>: a record from before a bump is stale.
        if f"/dynamo-{dynamo_version()}-" not in python:
            return None
    return python if os.access(python, os.X_OK) else None


def require_python() -> str:
    """The venv's python; fails the test (pytest.fail, no traceback) with the build command when missing."""
    try:
        python = find_python()
        version = dynamo_version()
    except LookupError as exc:  # the catalog names no Dynamo release: nothing to check against
        pytest.fail(str(exc), pytrace=False)
    if python is None:
        pytest.fail(f"the Dynamo {version} venv is not under {env_root()}: {BUILD_HINT}", pytrace=False)
    return python


def check(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """id -> verdict of Dynamo's own parser for each item ({"id", "module", "argv", "env"}); one process."""
    if len({item["id"] for item in items}) != len(items):
        raise ValueError("item ids must be unique")
    verdicts = runner.run_checker(require_python(), CHECKER, items, "the Dynamo checker")
    return {result["id"]: result for result in verdicts}

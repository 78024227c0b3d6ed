"""The tier's switch and its failure when the engine venvs are missing (shared by its test modules)."""

from __future__ import annotations

import os

import pytest

from tests.support.engines import runner

SKIP_VAR = "M3FLEET_SKIP_ENGINE_PARSERS"
needs_engines = pytest.mark.skipif(os.environ.get(SKIP_VAR) == "1", reason=f"{SKIP_VAR}=1")


def require_engines() -> None:
    """Fail (never skip silently) with the build command when the venvs are missing."""
    if runner.find_engine_pythons() is None:
        pytest.fail(
            f"engine venvs not found under {runner.envs_root()}: {runner.BUILD_HINT}; "
            f"or set {SKIP_VAR}=1 to skip this tier",
            pytrace=False,
        )

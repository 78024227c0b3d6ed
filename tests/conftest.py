from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SAMPLES_DIR = ROOT / "manifests" / "samples"
SAMPLE_FILES = sorted(SAMPLES_DIR.glob("*.yaml"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite tests/golden/ from the current renderer (do this on purpose, then review the diff)",
    )


def load_sample(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


@pytest.fixture(params=SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def sample(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load_sample(request.param)

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


# Tiers whose files are slow and mostly wait (a real control plane, the engines' parsers, operator processes) run
# first: spread over xdist workers one file at a time (.ci/test), the quick CPU-bound files then fill in behind
# them instead of leaving one worker a long tail of cluster tests.
SLOW_TIERS_FIRST = ("cluster", "engine_parsers", "operator")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def tier(item: pytest.Item) -> int:
        top = item.path.relative_to(ROOT / "tests").parts[0]
        return SLOW_TIERS_FIRST.index(top) if top in SLOW_TIERS_FIRST else len(SLOW_TIERS_FIRST)

    items.sort(key=tier)  # stable: each file's tests stay together and in order


def load_sample(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


@pytest.fixture(params=SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def sample(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load_sample(request.param)

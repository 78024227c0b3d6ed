from __future__ import annotations

from typing import Any

import pytest

from tests.support.cluster.fixtures import chart, cluster
from tests.support.samples import ROOT, SAMPLE_FILES, load_sample

# The real control plane and the chart on it, once per session (per xdist worker) for the cluster and the fault
# tier together: defined in each tier's conftest instead, each tier would start a control plane of its own (a fixture
# is cached per conftest that defines it), about a minute of a busy worker's time and 5% of a core while it idles.
__all__ = ["chart", "cluster"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite tests/golden/ from the current renderer (do this on purpose, then review the diff)",
    )


# Tiers whose files are slow and mostly wait (a real control plane, behind the fault proxy or not; the engines'
# parsers) run first: spread over xdist workers one file at a time (.ci/test), the quick CPU-bound files then fill
# in behind them instead of leaving one worker a long tail of cluster tests.
SLOW_TIERS_FIRST = ("faults", "cluster", "engine_parsers")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def tier(item: pytest.Item) -> int:
        top = item.path.relative_to(ROOT / "tests").parts[0]
        return SLOW_TIERS_FIRST.index(top) if top in SLOW_TIERS_FIRST else len(SLOW_TIERS_FIRST)

    items.sort(key=tier)  # stable: each file's tests stay together and in order


@pytest.fixture(params=SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def sample(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load_sample(request.param)

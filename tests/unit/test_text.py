"""How token counts read in the planner's and the autoscaler's messages."""

from __future__ import annotations

import pytest

from m3fleet.text import tokens


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (300, "300"),
        (1_500, "1.5k"),
        (10_000, "10k"),
        (100_000, "100k"),
        (120_000, "120k"),
        (131_072, "131k"),
        (300_000, "300k"),
        (1_000_000, "1M"),
        (1_048_576, "1.05M"),
        (100_000_000, "100M"),
    ],
)
def test_token_counts_keep_their_significant_zeros(count: float, text: str) -> None:
    assert tokens(count) == text

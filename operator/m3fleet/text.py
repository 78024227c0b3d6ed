"""How numbers read in messages, so the planner and the autoscaler say the same thing about the same number."""

from __future__ import annotations


def tokens(count: float) -> str:
    """A token count with three significant digits: 1500 -> "1.5k", 131072 -> "131k", 1048576 -> "1.05M"."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(count) >= size:
            value = count / size
            digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
            text = f"{value:.{digits}f}"
            if "." in text:  # only a fraction's trailing zeros go: 100k stays 100k
                text = text.rstrip("0").rstrip(".")
            return text + unit
    return f"{count:.0f}"

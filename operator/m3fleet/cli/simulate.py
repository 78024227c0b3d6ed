"""`m3fleet simulate`: what the autoscaler would do with a resource. The command and the simulator are the
m3fleet-simulator distribution (the extra `m3fleet[simulate]`, source in simulator/), so the operator's package and
image carry neither; it adds the subcommand through its entry point, and nothing in m3fleet imports it.

Without it, `m3fleet simulate` (any flags, --help too) prints one line saying what is missing and the fix, and
exits 2: as argparse does for a subcommand this installation does not have.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from typing import Any

from m3fleet.exitcodes import EXIT_INVALID

GROUP = "m3fleet.subcommands"  # where a distribution declares `NAME = "module:register"`
NAME = "simulate"
DISTRIBUTION = "m3fleet-simulator"
FIX = "pip install 'm3fleet[simulate]'"


def register(sub: Any) -> None:
    """The installed simulator's subcommand, else a stand-in that explains its absence."""
    for point in entry_points(group=GROUP, name=NAME):
        try:
            add_subcommand = point.load()
        except ImportError as exc:
            _stand_in(sub, f"the installed {DISTRIBUTION} cannot be loaded ({exc}); fix: {FIX} (this m3fleet's)")
            return
        add_subcommand(sub)
        return
    _stand_in(sub, f"m3fleet simulate needs the autoscaling simulator ({DISTRIBUTION}), not installed; fix: {FIX}")


def _stand_in(sub: Any, message: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        NAME, add_help=False, help=f"simulate what the autoscaler would do with a resource (needs: {FIX})"
    )
    parser.set_defaults(func=lambda args: _missing(message), accepts_any_arguments=True)


def _missing(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_INVALID

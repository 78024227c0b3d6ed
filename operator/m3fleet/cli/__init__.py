"""`m3fleet` command line: plan | render | crd | simulate | bench | stage | run | release-caches | completion
(docs/cli.md). This module builds the parser from one module per subcommand (each `register(subparsers)` adds its
parser with `func` set to its `run(args)`) and dispatches; `inputs` holds what `plan` and `render` share.

Exit status (`m3fleet.exitcodes`): 0 success; 2 invalid input or an impossible spec (one message per failing
resource on stderr, nothing on stdout); 4 no cluster to talk to; 1 an internal error; others per subcommand.
Never a traceback (set M3FLEET_DEBUG=1 to see one).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from m3fleet import __version__
from m3fleet.cli import bench, completion, crd, plan, release_caches, render, run, simulate, stage
from m3fleet.documents import guarded
from m3fleet.exitcodes import MEANINGS

EPILOG = "exit status:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in MEANINGS.items())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="m3fleet",
        description="Plan, render and run MiniMax-M3 inference fleets (docs/cli.md).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for subcommand in (plan, render, crd, simulate, bench, stage, run, release_caches):
        subcommand.register(sub)
    completion.register(sub, parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # What parse_args does, except for a subcommand that takes anything (`simulate` when it is not installed).
    if unknown and not getattr(args, "accepts_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return guarded(lambda: int(args.func(args)))

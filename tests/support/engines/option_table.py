#!/usr/bin/env python3
"""Dump an engine's own command-line parser as a table: every option string -> the attribute (dest) it sets.

Runs INSIDE an engine venv (stdlib + the engine, never m3fleet), like checker.py. m3fleet's runtime cannot import
vLLM or SGLang, so the owned-flag guard (m3fleet.engines.flags) reads the checked-in result,
operator/m3fleet/engines/engine-options.json; test_option_table.py fails when that file differs from what the
pinned parsers say, and `python -m tests.support.engines.option_table_write` rewrites it.

    argv:   vllm | sglang [serve]
    stdout: {"version": str, "allowAbbrev": bool, "rewritesUnderscores": bool, "dottedKeys": bool,
             "options": {option string: dest}}

`_option_string_actions` is what argparse matches a token against: it holds every alias (vLLM's `-tp`, SGLang's
`--tp`), the negations BooleanOptionalAction adds (`--no-x`) and vLLM's hidden back-compat spellings
(`--no-enable-x` next to `--disable-x`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib.metadata import version
from typing import Any

import checker  # type: ignore[import-not-found]  # the sibling script (this file runs as a script, like it)


def table(parser: argparse.ArgumentParser, engine: str) -> dict[str, Any]:
    """`flexible` (vLLM's FlexibleArgumentParser) rewrites `_` to `-` in `--` names and folds dotted
    `--json-flag.key value` tokens into `--json-flag` before argparse sees them. `valueless`: option strings that
    take no value (store_true, --no-x, --disable-x)."""
    flexible = type(parser).__name__ == "FlexibleArgumentParser"
    actions = parser._option_string_actions
    return {
        "version": version(engine),
        "allowAbbrev": bool(parser.allow_abbrev),
        "rewritesUnderscores": flexible,
        "dottedKeys": flexible,
        "options": {option: actions[option].dest for option in sorted(actions)},
        "valueless": sorted(option for option, action in actions.items() if action.nargs == 0),
    }


def vllm_parser() -> tuple[argparse.ArgumentParser, list[str]]:
    """The `vllm serve` subparser, as vllm/entrypoints/cli/main.py builds it (see checker.vllm_engine), and the
    argv every probe starts with (the positional model)."""
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm")
    subparsers = root.add_subparsers(required=False, dest="subparser")
    return ServeSubcommand().subparser_init(subparsers), ["MiniMaxAI/MiniMax-M3"]


def sglang_parser() -> tuple[argparse.ArgumentParser, list[str]]:
    """What sglang.srt.server_args.prepare_server_args builds."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser, ["--model-path", "MiniMaxAI/MiniMax-M3"]


PARSERS = {"vllm": vllm_parser, "sglang": sglang_parser}
UNSET = "<m3fleet:unset>"


def parsed(parser: argparse.ArgumentParser, argv: list[str], dests: list[str]) -> argparse.Namespace:
    namespace = argparse.Namespace(**dict.fromkeys(dests, UNSET))
    checker.run_stage("parse", lambda: parser.parse_args(argv, namespace=namespace))
    return namespace


def probe(parser: argparse.ArgumentParser, base: list[str], item: dict[str, Any]) -> dict[str, Any]:
    """Which of item["dests"] the engine's parser sets for item["argv"]: argparse fills a default only for an
    attribute the namespace lacks, so each dest starts as a sentinel; a dest the base argv sets (the model) counts
    when the item changes its value."""
    dests = item["dests"]
    before = vars(parsed(parser, base, dests))
    try:
        after = vars(parsed(parser, [*base, *item["argv"]], dests))
    except checker.StageError as exc:
        return {"id": item["id"], "error": exc.error, "touched": []}
    return {"id": item["id"], "error": None, "touched": [d for d in dests if after[d] != before[d]]}


def main() -> int:
    """`option_table.py ENGINE`: the table. `option_table.py ENGINE serve`: one JSON request a line on stdin, one
    JSON answer a line on stdout, until stdin closes: "table", or [{"id", "argv", "dests"}] to probe. The engine is
    imported once for all of them (most of a run's time)."""
    engine, mode = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "table"
    out = checker.claim_stdout()
    parser, base = PARSERS[engine]()
    if mode == "table":
        checker.emit(out, table(parser, engine))
        return 0
    for line in sys.stdin:
        request = json.loads(line)
        answer = table(parser, engine) if request == "table" else [probe(parser, base, i) for i in request]
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

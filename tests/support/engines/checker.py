#!/usr/bin/env python3
"""Check engine command lines with the engine's OWN argument parser, offline.

Runs INSIDE an engine venv built by `.ci/engine-envs.sh`, so it imports only the stdlib and the
engine (never m3fleet or pytest). The stages are in tests/support/engines/grid.py.

    stdin:  [{"id": str, "engine": "vllm"|"sglang", "argv": [...]}]
            argv = what follows `vllm serve`, resp. `python -m sglang.launch_server`
    stdout: [{"id", "verdict": "accept"|"reject", "stage": str|None, "error": str|None,
              "unknown_spellings": [...]}]

`unknown_spellings` lists every `--flag` / `--flag=value` token that is not literally one of the
parser's option strings. argparse accepts unique prefixes (allow_abbrev) and vLLM rewrites `_` to
`-`, so a token can be accepted by the engine and still be listed here.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import os
import sys
import typing
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

Result = dict[str, Any]
MAX_ERROR = 3000  # vLLM's "valid options are ..." lists are long; keep them, but bounded


class StageError(Exception):
    """A check failed at a named stage."""

    def __init__(self, stage: str, error: str) -> None:
        super().__init__(f"{stage}: {error}")
        self.stage, self.error = stage, error[:MAX_ERROR]


def run_stage(stage: str, fn: Callable[[], Any]) -> Any:
    """Run one stage; argparse's sys.exit and any exception become a StageError for this item."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return fn()
    except SystemExit as exc:  # argparse prints usage, then "prog: error: ..." (maybe multi-line)
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        start = max((i for i, line in enumerate(lines) if ": error: " in line), default=0)
        raise StageError(stage, "\n".join(lines[start:]) or f"exit status {exc.code}") from None
    except Exception as exc:
        raise StageError(stage, f"{type(exc).__name__}: {exc}") from None


def option_strings(parser: argparse.ArgumentParser, subcommands: Iterable[str] = ()) -> set[str]:
    """Every option string `parser` defines, descending into the named subcommands' parsers."""
    # _option_string_actions is what argparse matches against; it also holds aliases an action
    # hides from its option_strings (vLLM's back-compat `--no-enable-x` next to `--disable-x`).
    found: set[str] = set(parser._option_string_actions)
    wanted = set(subcommands)
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name in wanted:
                    found |= option_strings(sub)
    return found


def unknown_spellings(argv: list[str], known: set[str], dotted_keys: bool) -> list[str]:
    """`--` tokens whose flag part is not exactly a defined option string.

    With `dotted_keys` (vLLM), `--attention-config.backend X` addresses a key of the JSON flag
    `--attention-config`, so only the part before the first `.` (and a trailing `+`) is the flag.
    """
    unknown: list[str] = []
    for token in argv:
        if not token.startswith("--") or token == "--":
            continue
        flag = token.split("=", 1)[0]
        if dotted_keys:
            flag = flag.split(".", 1)[0].removesuffix("+")
        if flag not in known:
            unknown.append(token)
    return unknown


class Engine(NamedTuple):
    check: Callable[[list[str]], None]  # runs every stage on one argv; raises StageError
    known: set[str]  # every option string the engine's parser defines
    dotted_keys: bool  # the parser accepts `--json-flag.key value`


# ----------------------------------------------------------------------------------------- vLLM
def vllm_engine() -> Engine:
    """Import vLLM once and return its checker."""
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"  # else: "Failed to infer device type" on a CPU box
    # HF_HUB_OFFLINE makes EngineArgs.__post_init__ call snapshot_download (fails uncached).
    # Without it nothing here fetches either: no stage below builds a ModelConfig.
    os.environ.pop("HF_HUB_OFFLINE", None)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")

    from vllm.config import AttentionConfig, CacheConfig, MultiModalConfig, ParallelConfig, SpeculativeConfig
    from vllm.config.speculative import SpeculativeMethod
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.model_executor.layers.quantization import DEPRECATED_QUANTIZATION_METHODS, QUANTIZATION_METHODS
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve = ServeSubcommand()

    def make_parser() -> Any:  # a vllm FlexibleArgumentParser
        # The `vllm` root parser with only the `serve` subcommand, as cli/main.py builds it.
        root = FlexibleArgumentParser(prog="vllm")
        subparsers = root.add_subparsers(required=False, dest="subparser")
        serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
        return root

    tool_parsers = set(ToolParserManager.list_registered())
    reasoning_parsers = set(ReasoningParserManager.list_registered())

    def config_kwargs(cls: type, engine_args: Any, renames: dict[str, str]) -> dict[str, Any]:
        # Same-named EngineArgs attributes (+ renames) that the user set; None = let vLLM default.
        kwargs: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            value = getattr(engine_args, renames.get(field.name, field.name), None)
            if field.init and not field.name.startswith("_") and value is not None:
                kwargs[field.name] = value
        return kwargs

    def subconfigs(ea: Any) -> None:
        # create_engine_config() needs the checkpoint's config.json (network), so build the
        # sub-configs it would build from the parsed values, as its code does.
        if ea.hf_overrides is not None and not isinstance(ea.hf_overrides, dict):
            raise ValueError(f"--hf-overrides did not parse to a dict: {ea.hf_overrides!r}")
        CacheConfig(**config_kwargs(CacheConfig, ea, {"cache_dtype": "kv_cache_dtype"}))
        attention = copy.deepcopy(ea.attention_config)
        if ea.attention_backend is not None:
            if attention.backend is not None:
                raise ValueError("attention_backend and attention_config.backend are mutually exclusive")
            attention.backend = AttentionConfig.validate_backend_before(ea.attention_backend)
        AttentionConfig(**dataclasses.asdict(attention))  # re-validate after the override
        MultiModalConfig(**config_kwargs(MultiModalConfig, ea, {"limit_per_prompt": "limit_mm_per_prompt"}))
        parallel = config_kwargs(ParallelConfig, ea, {"data_parallel_master_ip": "data_parallel_address"})
        ParallelConfig(**parallel)
        if ea.speculative_config is not None:
            speculative(ea.speculative_config)

    def literal_values(annotation: Any) -> set[str]:
        # SpeculativeMethod is a Literal of strings and of further Literals (MTP, EAGLE and DFlash types).
        values: set[str] = set()
        for arg in typing.get_args(annotation):
            values |= literal_values(arg) if typing.get_args(arg) else {arg}
        return values

    def speculative(config: Any) -> None:
        # SpeculativeConfig's own __post_init__ needs the target's ModelConfig (the checkpoint's config.json), so check
        # what it would read: a dict of its fields, a method it knows, an attention backend the enum holds.
        if not isinstance(config, dict):
            raise ValueError(f"--speculative-config did not parse to a dict: {config!r}")
        unknown = set(config) - {f.name for f in dataclasses.fields(SpeculativeConfig) if f.init}
        if unknown:
            raise ValueError(f"--speculative-config: unknown keys {sorted(unknown)}")
        if config.get("method") not in literal_values(SpeculativeMethod):
            raise ValueError(f"--speculative-config: unknown method {config.get('method')!r}")
        if "attention_backend" in config:
            AttentionConfig.validate_backend_before(config["attention_backend"])

    def check(argv: list[str]) -> None:
        args = run_stage("parse", lambda: make_parser().parse_args(["serve", *argv]))
        run_stage("validate", lambda: serve.validate(args))

        def registry() -> None:
            # validate_api_server_args: vLLM checks the tool parser only with
            # --enable-auto-tool-choice; a rendered name must be valid regardless.
            if args.tool_call_parser and args.tool_call_parser not in tool_parsers:
                raise KeyError(f"invalid tool call parser: {args.tool_call_parser}")
            if args.reasoning_parser and args.reasoning_parser not in reasoning_parsers:
                raise KeyError(f"invalid reasoning parser: {args.reasoning_parser}")
            # ModelConfig._verify_quantization's name checks (the rest needs the checkpoint).
            if args.quantization is not None and args.quantization not in QUANTIZATION_METHODS:
                raise ValueError(f"Unknown quantization method: {args.quantization}")
            if args.quantization in DEPRECATED_QUANTIZATION_METHODS and not args.allow_deprecated_quantization:
                raise ValueError(f"deprecated quantization method: {args.quantization}")

        run_stage("registry", registry)
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag  # as ServeSubcommand.cmd does
        engine_args = run_stage("engine_args", lambda: AsyncEngineArgs.from_cli_args(args))
        run_stage("subconfigs", lambda: subconfigs(engine_args))

    return Engine(check, option_strings(make_parser(), ["serve"]), dotted_keys=True)


# --------------------------------------------------------------------------------------- SGLang
def sglang_engine() -> Engine:
    """Import SGLang once and return its checker (prepare_server_args on one argv)."""
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def check(argv: list[str]) -> None:
        # prepare_server_args = argparse + ServerArgs.from_cli_args (types and choices only; the
        # semantic checks live in resolve_once(), which needs the checkpoint's config).
        args = run_stage("parse", lambda: prepare_server_args(list(argv)))
        # The algorithm name is only resolved at launch (SpeculativeAlgorithm.from_string in the scheduler).
        run_stage("speculative", lambda: SpeculativeAlgorithm.from_string(args.speculative_algorithm))

    parser = argparse.ArgumentParser(prog="sglang serve")  # what prepare_server_args builds
    ServerArgs.add_cli_args(parser)
    return Engine(check, option_strings(parser), dotted_keys=False)


ENGINES: dict[str, Callable[[], Engine]] = {"vllm": vllm_engine, "sglang": sglang_engine}


def claim_stdout() -> Any:
    """Engines log (and sometimes print) to stdout; keep fd 1 for our JSON alone by pointing it at
    stderr for everything else, C extensions included. Returns the stream to the real stdout."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def emit(out: Any, value: Any) -> None:
    json.dump(value, out, indent=1)
    out.write("\n")
    out.flush()


def main() -> int:
    items: list[dict[str, Any]] = json.load(sys.stdin)
    out = claim_stdout()

    engines: dict[str, Engine] = {}
    results: list[Result] = []
    for item in items:
        if item["engine"] not in engines:
            engines[item["engine"]] = ENGINES[item["engine"]]()
        engine = engines[item["engine"]]
        argv = [str(arg) for arg in item["argv"]]
        result: Result = {
            "id": item["id"],
            "verdict": "accept",
            "stage": None,
            "error": None,
            "unknown_spellings": unknown_spellings(argv, engine.known, engine.dotted_keys),
        }
        try:
            engine.check(argv)
        except StageError as exc:
            result.update(verdict="reject", stage=exc.stage, error=exc.error)
        results.append(result)

    emit(out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

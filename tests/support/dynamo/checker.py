#!/usr/bin/env python3
"""Check Dynamo command lines with Dynamo's OWN argument parsers (the pinned release), offline.

Runs INSIDE the venv `.ci/dynamo-env.sh` builds, so it imports only the stdlib and Dynamo (never m3fleet or
pytest). What each module's check runs, and what it cannot:

- dynamo.frontend: the module's own parse_args(), complete (validation included).
- dynamo.trtllm: the module's own parse_args(), complete. Its option module reads four defaults off
  TensorRT-LLM's BuildConfig (max_batch_size, max_num_tokens, max_seq_len, max_beam_width) at import; the
  1.3.0rc29 it pins is not on PyPI, so a four-field stand-in provides them (defaults only: a rendered flag's
  value is parsed and typed by Dynamo's own argparse actions either way). The engine YAML it passes through
  (--extra-engine-args) is TensorRT-LLM's to read: not checked here.
- dynamo.vllm, dynamo.sglang: their parse_args() builds the engine's parser (vllm==0.31.0, sglang==0.5.21, each
  with torch and CUDA libraries) and is not run. The Dynamo half is: the same Dynamo option groups the
  module's parser adds (runtime, backend, worker router) parse the argv and validate, and the tokens left over
  are reported as `engine_argv`, the flags that module hands its engine's parser.

    stdin:  [{"id": str, "module": "dynamo.frontend"|..., "argv": [...], "env": {NAME: value}}]
            argv = what follows `python3 -m <module>`; env = the container's literal environment
    stdout: [{"id", "verdict": "accept"|"reject", "stage", "error", "unknown_spellings", "engine_argv", "parsed"}]

`parsed` holds the settings the tests compare across roles (disaggregation mode, namespace, component, planes).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

PARSED_FIELDS = (
    "disaggregation_mode",
    "namespace",
    "component",
    "endpoint",
    "discovery_backend",
    "request_plane",
    "event_plane",
    "router_mode",
    "model_path",
    "model",
    "served_model_name",
    "block_size",
    "kv_block_size",
    "kv_cache_block_size",
    "http_port",
    "http_host",
)


def _engine_checker() -> Any:
    """tests/support/engines/checker.py, stdlib only like this script: its stages and their error capture."""
    path = Path(__file__).resolve().parents[1] / "engines" / "checker.py"
    spec = importlib.util.spec_from_file_location("engine_checker", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_engines = _engine_checker()
StageError = _engines.StageError


def run_stage(stage: str, fn: Callable[[], Any]) -> Any:
    """The engine checker's stage, with Dynamo's logged errors in the message: the frontend and dynamo.trtllm log
    "Unknown arguments specified: ..." and then sys.exit(1)."""

    def logged() -> Any:
        handler = logging.StreamHandler()  # sys.stderr here is run_stage's capture
        handler.setLevel(logging.WARNING)
        logging.getLogger().addHandler(handler)
        try:
            return fn()
        finally:
            logging.getLogger().removeHandler(handler)

    return _engines.run_stage(stage, logged)


@contextlib.contextmanager
def container_environment(env: dict[str, str]) -> Iterator[None]:
    """The container's environment for one item (Dynamo's options default from DYN_* variables, and its
    validation exports some): restored afterwards so items do not leak into each other."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


def unknown_spellings(argv: list[str], known: set[str], dynamic_prefixes: tuple[str, ...]) -> list[str]:
    """`--` tokens that are not literally one of the parser's option strings (argparse takes unique prefixes)."""
    unknown = []
    for token in argv:
        if not token.startswith("--") or token == "--":
            continue
        flag = token.split("=", 1)[0]
        if flag not in known and not flag.startswith(dynamic_prefixes):
            unknown.append(token)
    return unknown


def summary(*objects: Any) -> dict[str, Any]:
    """PARSED_FIELDS found on the parsed objects (first wins), as JSON-able values."""
    found: dict[str, Any] = {}
    for obj in objects:
        for field in PARSED_FIELDS:
            if field not in found and hasattr(obj, field):
                value = getattr(obj, field)
                value = getattr(value, "value", value)  # enums (DisaggregationMode) by their value
                found[field] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
    return found


class Module(NamedTuple):
    # argv -> (parsed summary, engine argv left for the engine's own parser)
    check: Callable[[list[str]], tuple[dict[str, Any], list[str]]]
    known: set[str]
    dynamic_prefixes: tuple[str, ...] = ()


def frontend_module() -> Module:
    from dynamo.frontend.frontend_args import FrontendArgGroup
    from dynamo.frontend.main import parse_args

    def check(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
        sys.argv = [sys.argv[0], *argv]  # parse_args() reads sys.argv, as `python -m` gives it
        config, _, _ = run_stage("parse", parse_args)
        return summary(config), []

    parser = argparse.ArgumentParser()
    FrontendArgGroup().add_arguments(parser)
    return Module(check, option_strings(parser))


def install_buildconfig_stand_in() -> None:
    """TensorRT-LLM's BuildConfig defaults, the only thing dynamo.trtllm's option module reads from the engine."""
    fields = {"max_batch_size": 2048, "max_num_tokens": 8192, "max_seq_len": None, "max_beam_width": 1}
    build_config = type(
        "BuildConfig", (), {"model_fields": {k: types.SimpleNamespace(default=v) for k, v in fields.items()}}
    )
    root, llmapi = types.ModuleType("tensorrt_llm"), types.ModuleType("tensorrt_llm.llmapi")
    llmapi.BuildConfig = build_config  # type: ignore[attr-defined]
    root.llmapi = llmapi  # type: ignore[attr-defined]
    sys.modules.setdefault("tensorrt_llm", root)
    sys.modules.setdefault("tensorrt_llm.llmapi", llmapi)


def trtllm_module() -> Module:
    install_buildconfig_stand_in()
    from dynamo.common.configuration.groups.router_args import register_worker_router_help
    from dynamo.common.configuration.groups.runtime_args import DynamoRuntimeArgGroup
    from dynamo.trtllm.args import parse_args
    from dynamo.trtllm.backend_args import DynamoTrtllmArgGroup

    def check(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
        config = run_stage("parse", lambda: parse_args(list(argv)))
        return summary(config), []

    parser = argparse.ArgumentParser()
    DynamoRuntimeArgGroup().add_arguments(parser)
    DynamoTrtllmArgGroup().add_arguments(parser)
    register_worker_router_help(parser)
    return Module(check, option_strings(parser), dynamic_prefixes=("--trtllm.",))


def dynamo_half_module(backend: str) -> Module:
    """dynamo.vllm / dynamo.sglang without their engine: the Dynamo option groups their parse_args() adds, parsed
    and validated the way it does (parse_known_args, Config.from_cli_args, the worker router flags, validate)."""
    from dynamo.common.configuration.groups.router_args import (
        parse_worker_router_config,
        register_worker_router_help,
    )
    from dynamo.common.configuration.groups.runtime_args import DynamoRuntimeArgGroup, DynamoRuntimeConfig

    if backend == "vllm":
        from dynamo.vllm.backend_args import DynamoVllmArgGroup as Group
        from dynamo.vllm.backend_args import DynamoVllmConfig as BackendConfig
    else:
        from dynamo.sglang.backend_args import DynamoSGLangArgGroup as Group  # type: ignore[no-redef]
        from dynamo.sglang.backend_args import DynamoSGLangConfig as BackendConfig  # type: ignore[no-redef]

    class DynamoHalf(DynamoRuntimeConfig, BackendConfig):  # type: ignore[misc,valid-type]
        """The Dynamo part of dynamo.<backend>.args' Config (which adds the engine's own args)."""

        def validate(self) -> None:
            DynamoRuntimeConfig.validate(self)
            BackendConfig.validate(self)

    def make_parser() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(allow_abbrev=False)  # as both modules build it
        DynamoRuntimeArgGroup().add_arguments(parser)
        Group().add_arguments(parser)
        register_worker_router_help(parser)
        return parser

    def check(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
        def parse() -> tuple[Any, list[str]]:
            args, unknown = make_parser().parse_known_args(list(argv))
            config = DynamoHalf.from_cli_args(args)
            config.router_advertisement, unknown = parse_worker_router_config(unknown)
            return config, unknown

        config, engine_argv = run_stage("parse", parse)
        run_stage("validate", config.validate)
        return summary(config), engine_argv

    # Engine flags are left to the engine parser: only the Dynamo options are "known" here.
    return Module(check, option_strings(make_parser()), dynamic_prefixes=("--",))


MODULES: dict[str, Callable[[], Module]] = {
    "dynamo.frontend": frontend_module,
    "dynamo.trtllm": trtllm_module,
    "dynamo.vllm": lambda: dynamo_half_module("vllm"),
    "dynamo.sglang": lambda: dynamo_half_module("sglang"),
}


def claim_stdout() -> Any:
    """Keep fd 1 for our JSON alone (the Rust runtime and loggers may print)."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def main() -> int:
    items: list[dict[str, Any]] = json.load(sys.stdin)
    out = claim_stdout()
    modules: dict[str, Module] = {}
    results = []
    for item in items:
        name = item["module"]
        if name not in modules:
            modules[name] = MODULES[name]()
        module = modules[name]
        argv = [str(arg) for arg in item["argv"]]
        sys.argv = [f"python3 -m {name}"]  # argparse's prog, in its messages
        result: dict[str, Any] = {
            "id": item["id"],
            "verdict": "accept",
            "stage": None,
            "error": None,
            "unknown_spellings": unknown_spellings(argv, module.known, module.dynamic_prefixes),
            "engine_argv": [],
            "parsed": {},
        }
        with container_environment(item.get("env", {})):
            try:
                result["parsed"], result["engine_argv"] = module.check(argv)
            except StageError as exc:
                result.update(verdict="reject", stage=exc.stage, error=exc.error)
        results.append(result)
    json.dump(results, out, indent=1)
    out.write("\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

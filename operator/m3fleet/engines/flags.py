"""Which engine option a command-line token sets, in every spelling the engine's own parser accepts.

m3fleet owns some engine flags (parallel sizes, context length, parsers, the API key, ...): they come from the plan
or another spec field, and a second spelling in `spec.engine.extraArgs` would silently override them. vLLM and
SGLang cannot be imported here, so their parsers are read from `engine-options.json`, a table of every option string
-> the attribute (argparse dest) it sets, dumped from the pinned engines' own parsers by
tests/support/engines/option_table.py (the engine-parser tier fails when the file differs from the parsers).

A token is matched as the engines match it (argparse of Python 3.11, the engines' interpreter, plus vLLM's
FlexibleArgumentParser rewriting before it):
- `--flag=value` is `--flag`; vLLM turns `_` into `-` in `--` names, and `--json-flag.key[+] value` is `--json-flag`;
- exact option strings, aliases included (`-tp`, `--tp-size`, `--no-x`, `--disable-x`: the table holds them);
- a unique prefix of any option string (allow_abbrev; single-dash prefixes even without it), and `-Xvalue` for a
  two-character option `-X`. A prefix that is ambiguous between an owned option and another is refused too: the
  engine would reject it anyway, so refusing it costs nothing and names the problem earlier.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from m3fleet.errors import SpecError

TABLE_FILE = "engine-options.json"
# What the user does instead of setting an owned flag, for flags no single spec field drives.
PLANNER = "leave it to the planner: it follows spec.parallelism, spec.context and the accelerator"
CATALOG = "nothing: the catalog fixes it for MiniMax-M3 (probes, the Service and the parsers rely on it)"
CONFIG_FILE = "pass the flags themselves: a config file can set any flag, the owned ones included"
API_KEY = "set spec.engine.apiKeySecretRef instead (the key never appears in the pod spec)"


def _instead(instead: str) -> str:
    """ "nothing: <why>" reads as a sentence in a fix."""
    why = instead.removeprefix("nothing: ")
    return f"there is nothing to set instead: {why}" if why != instead else instead


EXTRA_ARGS_FIELD = "spec.engine.extraArgs"


@dataclass(frozen=True)
class OptionTable:
    """One engine's parser as data: option string -> dest, and how the parser matches tokens."""

    engine: str
    version: str
    allow_abbrev: bool
    rewrites_underscores: bool  # vLLM's FlexibleArgumentParser: `--tensor_parallel_size` is `--tensor-parallel-size`
    dotted_keys: bool  # vLLM: `--hf-overrides.text_config.x 1` is `--hf-overrides '{"text_config": {"x": 1}}'`
    options: Mapping[str, str]
    complete: bool = True  # every option the engine takes (a parser's dump), so an unknown flag is an error

    def flag_name(self, token: str) -> str | None:
        """The option part of `token` after the engine's own rewriting; None for a value or positional."""
        if len(token) < 2 or not token.startswith("-") or token == "--":
            return None
        name = token.split("=", 1)[0]
        if self.dotted_keys and "." in name:
            name = name.removesuffix("+").split(".", 1)[0]
        if self.rewrites_underscores and name.startswith("--"):
            name = name.replace("_", "-")
        return name

    def dests(self, token: str) -> set[str]:
        """Every dest `token` sets (one) or may set (an ambiguous prefix) in the engine's parser."""
        name = self.flag_name(token)
        if name is None:
            return set()
        if name in self.options:
            return {self.options[name]}
        long = name.startswith("--")
        if long and not self.allow_abbrev:
            return set()
        found = {dest for option, dest in self.options.items() if option.startswith(name)}
        if not long and name[:2] in self.options:  # `-Xvalue`: a two-character option with its value attached
            found.add(self.options[name[:2]])
        return found

    def spellings(self, dest: str) -> list[str]:
        return sorted(option for option, d in self.options.items() if d == dest)


def table_from_json(engine: str, data: Mapping[str, object]) -> OptionTable:
    options = data["options"]
    if not isinstance(options, dict):
        raise ValueError(f"{TABLE_FILE}: {engine}.options is not a mapping")
    return OptionTable(
        engine=engine,
        version=str(data["version"]),
        allow_abbrev=bool(data["allowAbbrev"]),
        rewrites_underscores=bool(data.get("rewritesUnderscores", False)),
        dotted_keys=bool(data.get("dottedKeys", False)),
        options={str(k): str(v) for k, v in options.items()},
    )


@cache
def parser_table(engine: str) -> OptionTable:
    """The checked-in table of vLLM's or SGLang's parser (package data, read once)."""
    raw = json.loads(resources.files("m3fleet.engines").joinpath(TABLE_FILE).read_text(encoding="utf-8"))
    return table_from_json(engine, raw[engine])


def declared_table(engine: str, version: str, options: Iterable[str]) -> OptionTable:
    """A table for an engine whose parser cannot run here (trtllm-serve): the listed spellings, each its own dest,
    matched with prefixes (conservative: a prefix of an owned flag is refused even if the engine would not take it)."""
    return OptionTable(engine, version, True, False, False, {option: option for option in options}, complete=False)


@dataclass(frozen=True)
class OwnedFlag:
    flag: str  # the canonical spelling m3fleet renders
    instead: str  # what the user does instead: "set spec.x instead", or why nothing can


# argparse's own test for a negative number (ArgumentParser._negative_number_matcher): a value, not a flag.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def unknown_flag(index: int, token: str, table: OptionTable) -> SpecError | None:
    """The refusal of a flag the pinned parser does not know (the engine would exit and the pod crash-loop)."""
    name = table.flag_name(token)
    if not table.complete or name is None or _NEGATIVE_NUMBER.match(token) or table.dests(token):
        return None
    close = difflib.get_close_matches(name, list(table.options), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return SpecError(
        f"{EXTRA_ARGS_FIELD}[{index}]",
        f"{token!r} is not an option of {table.engine} {table.version} (its own parser would exit at start)",
        f"{hint}see `{table.engine} --help` of that version, or remove it",
    )


def check_extra_args(extra_args: Iterable[str], table: OptionTable, owned: Iterable[OwnedFlag]) -> None:
    """Refuse an extra arg that sets (or may set) an owned flag, in any spelling the engine's parser accepts, and
    a flag the engine's parser does not know."""
    by_dest: dict[str, OwnedFlag] = {}
    for flag in owned:
        dest = table.options.get(flag.flag)
        if dest is None:  # a unit test keeps every owned flag in the table; never silently unguarded
            raise KeyError(f"{table.engine} {table.version} has no option {flag.flag}")
        by_dest[dest] = flag
    for index, token in enumerate(extra_args):
        if (unknown := unknown_flag(index, token, table)) is not None:
            raise unknown
        hit = sorted(table.dests(token) & by_dest.keys())
        if not hit:
            continue
        flag = by_dest[hit[0]]
        spellings = ", ".join(table.spellings(hit[0]))
        raise SpecError(
            f"{EXTRA_ARGS_FIELD}[{index}]",
            f"{token!r} sets {flag.flag}, which m3fleet derives from the plan for {table.engine} "
            f"({table.engine} {table.version} reads it as {spellings} or any unique prefix of those)",
            f"remove it from {EXTRA_ARGS_FIELD}; {_instead(flag.instead)}",
        )

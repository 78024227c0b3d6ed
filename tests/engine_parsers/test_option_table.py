"""The owned-flag guard against the pinned engines' own parsers.

1. The checked-in table (operator/m3fleet/engines/engine-options.json) is exactly what vLLM's and SGLang's parsers
   define today: every option string, alias and negation, and how the parser matches tokens.
2. Every spelling of an owned flag derived from that table (each alias and negation, `--x=y`, vLLM's `_` and dotted
   JSON forms, the shortest unique prefix) is refused by the guard, AND the engine's own parser really sets the
   owned option from it (so the refusals are not guesses).
3. Every value-less option the guard lets through sets no owned option in the engine's parser.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from m3fleet.engines import flags, sglang, vllm
from m3fleet.engines.flags import OptionTable, OwnedFlag
from m3fleet.errors import SpecError
from tests.support.engines import option_table_write, runner
from tests.support.engines.tier import needs_engines, require_engines

pytestmark = [pytest.mark.engine_parsers, needs_engines]
OWNED: dict[str, tuple[OwnedFlag, ...]] = {"vllm": vllm.OWNED, "sglang": sglang.OWNED}
# A value each owned option's parser accepts (types and choices are the engine's).
VALUES: dict[str, str] = {
    "tensor_parallel_size": "2",
    "pipeline_parallel_size": "2",
    "data_parallel_size": "2",
    "block_size": "64",
    "max_model_len": "4096",
    "kv_cache_dtype": "fp8",
    "gpu_memory_utilization": "0.5",
    "shutdown_timeout": "30",
    "tool_call_parser": "minimax_m3",
    "reasoning_parser": "minimax_m3",
    "hf_overrides": '{"a":1}',
    "nnodes": "2",
    "node_rank": "1",
    "master_addr": "10.0.0.1",
    "port": "8001",
    "host": "127.0.0.1",
    "model": "other/model",
    "served_model_name": "other",
    "api_key": "sk-x",
    "tp_size": "2",
    "pp_size": "2",
    "dp_size": "2",
    "ep_size": "2",
    "mem_fraction_static": "0.5",
    "context_length": "4096",
    "json_model_override_args": '{"a":1}',
    "dist_init_addr": "10.0.0.1:20000",
    "model_path": "other/model",
    "admin_api_key": "sk-admin",
    # owned since issue 42: context parallelism, DP wiring, the KV cache's size, GPU ids
    "data_parallel_size_local": "2",
    "data_parallel_rank": "1",
    "data_parallel_start_rank": "1",
    "data_parallel_address": "10.0.0.1",
    "data_parallel_rpc_port": "13345",
    "prefill_context_parallel_size": "2",
    "decode_context_parallel_size": "2",
    "kv_cache_memory_bytes": "8000000000",
    "num_gpu_blocks_override": "64",
    "max_total_tokens": "4096",
    "base_gpu_id": "1",
    "gpu_id_step": "2",
    "attn_cp_size": "2",
    "dcp_size": "2",
    "moe_dp_size": "2",
    # owned since speculative decoding (issue 48): the draft's shape is the plan's
    "speculative_num_steps": "2",
    "speculative_eagle_topk": "1",
    "speculative_num_draft_tokens": "3",
}
SGLANG_VALUES = {"kv_cache_dtype": "fp8_e4m3", "tool_call_parser": "minimax-m3", "reasoning_parser": "minimax-m3"}
# The engines consume `--config FILE` before argparse (they read the file and splice its flags in), so no parser
# attribute records it; the guard refuses it regardless (a file can set any owned flag).
CONSUMED_BEFORE_ARGPARSE = {"config"}


def value_for(engine: str, dest: str) -> str:
    return (SGLANG_VALUES if engine == "sglang" else {}).get(dest) or VALUES[dest]


@pytest.fixture(scope="module")
def parsers() -> Iterator[option_table_write.Parsers]:
    """Each engine's parser in its venv, imported once for the module's table and probes."""
    require_engines()
    with option_table_write.Parsers() as started:
        yield started


@pytest.fixture(scope="module")
def tables(parsers: option_table_write.Parsers) -> dict[str, Any]:
    return parsers.dump()


def test_checked_in_table_is_what_the_pinned_parsers_define(tables: dict[str, Any]) -> None:
    checked_in = json.loads(option_table_write.TABLE.read_text())
    assert checked_in == tables, "engine-options.json is stale: python -m tests.support.engines.option_table_write"
    assert {engine: table["version"] for engine, table in tables.items()} == runner.pinned_versions()


def spellings(table: OptionTable, valueless: set[str], engine: str, dest: str) -> list[list[str]]:
    """Every way to set `dest` the table says the engine accepts, each with a value where the option takes one."""
    value = value_for(engine, dest) if dest in VALUES else ""
    found: list[list[str]] = []
    for option in table.spellings(dest):
        takes_value = option not in valueless
        found.append([option, value] if takes_value else [option])
        if takes_value:
            found.append([f"{option}={value}"])
        if table.rewrites_underscores and option.startswith("--") and "-" in option[2:]:
            under = "--" + option[2:].replace("-", "_")
            found.append([under, value] if takes_value else [under])
        if table.dotted_keys and value.startswith("{"):
            found.append([f"{option}.a", "1"])  # --hf-overrides.a 1 == --hf-overrides '{"a": 1}'
        # The shortest prefix that only this dest's options start with: argparse takes it (allow_abbrev).
        for end in range(3, len(option)):
            prefix = option[:end]
            if option.startswith("--") and {table.options[o] for o in table.options if o.startswith(prefix)} == {dest}:
                found.append([prefix, value] if takes_value else [prefix])
                break
    return found


@pytest.mark.parametrize("engine", runner.ENGINES)
def test_every_spelling_of_an_owned_flag_is_refused_and_really_sets_it(
    engine: str, tables: dict[str, Any], parsers: option_table_write.Parsers
) -> None:
    table = flags.table_from_json(engine, tables[engine])
    valueless = set(tables[engine]["valueless"])
    owned = OWNED[engine]
    items: list[dict[str, Any]] = []
    for flag in owned:
        dest = table.options[flag.flag]
        for argv in spellings(table, valueless, engine, dest):
            with pytest.raises(SpecError) as info:
                flags.check_extra_args(argv, table, owned)
            assert info.value.field == "spec.engine.extraArgs[0]" and flag.flag in info.value.problem, argv
            if dest not in CONSUMED_BEFORE_ARGPARSE:
                items.append({"id": f"{dest}:{' '.join(argv)}", "argv": argv, "dests": [dest], "flag": flag.flag})
    assert len(items) > 3 * len(owned)  # aliases, = forms and prefixes, not just the canonical spelling
    results = parsers.probe(engine, [{k: v for k, v in i.items() if k != "flag"} for i in items])
    wrong = [
        f"{item['argv']}: {results[item['id']]['error'] or 'did not set ' + item['dests'][0]}"
        for item in items
        if results[item["id"]]["touched"] != item["dests"]
    ]
    assert not wrong, f"{engine} does not read these as the owned option, so refusing them is a guess:\n" + "\n".join(
        wrong
    )


@pytest.mark.parametrize("engine", runner.ENGINES)
def test_what_the_guard_lets_through_sets_no_owned_option(
    engine: str, tables: dict[str, Any], parsers: option_table_write.Parsers
) -> None:
    table = flags.table_from_json(engine, tables[engine])
    owned = OWNED[engine]
    owned_dests = sorted({table.options[f.flag] for f in owned} - CONSUMED_BEFORE_ARGPARSE)
    items = []
    for option in tables[engine]["valueless"]:
        if table.options[option] in owned_dests or option in ("-h", "--help"):
            continue
        flags.check_extra_args([option], table, owned)  # let through
        items.append({"id": option, "argv": [option], "dests": owned_dests})
    assert len(items) > 50
    results = parsers.probe(engine, items)
    touched = {i: r["touched"] for i, r in results.items() if r["touched"]}
    errors = {i: r["error"] for i, r in results.items() if r["error"]}
    assert not touched, f"{engine} sets an owned option from a flag the guard let through: {touched}"
    assert not errors, errors

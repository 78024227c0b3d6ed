"""The rendered TensorRT-LLM `extra-llm-api-options.yaml` against the documented options
(tests/support/trtllm_schema.py).

TensorRT-LLM's own validation cannot run here (no wheel on PyPI), so this is the TRT counterpart of
tests/engine_parsers/: the sample plus a grid over gb200/h200 x tp/tp-ep/dp-ep x contexts, and negative
controls proving the schema rejects what the engine would.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from m3fleet.api import parse_resource
from m3fleet.api.models import EngineName, Plan
from m3fleet.catalog import ENGINES, TRTLLM_VERSION
from m3fleet.engines.trtllm import CONFIG_FILE, LEADER_SCRIPT
from m3fleet.planner import plan
from tests.support.engines import grid
from tests.support.trtllm_schema import DOCUMENTED_RELEASE, SCHEMA, errors

TRT_SPECS = grid.spec_grid(("trtllm",), contexts=(2_068, 131_072, 524_288), kv_dtypes=("bf16",), text_only=(False,))
RENDERED = [r for r in grid.samples() if r.engine == "trtllm"] + grid.grid(TRT_SPECS)

# The curated MiniMax-M3 throughput config's values (TRT-YAML): the schema must take it.
CURATED: dict[str, Any] = {
    "max_batch_size": 256,
    "max_num_tokens": 8192,
    "max_seq_len": 2068,
    "tensor_parallel_size": 8,
    "moe_expert_parallel_size": 8,
    "enable_attention_dp": True,
    "trust_remote_code": True,
    "cuda_graph_config": {"enable_padding": True, "max_batch_size": 256},
    "kv_cache_config": {"free_gpu_memory_fraction": 0.7, "enable_block_reuse": False},
    "sparse_attention_config": {"algorithm": "minimax_m3"},
    "stream_interval": 10,
    "num_postprocess_workers": 4,
}


def options(rendered: grid.Rendered) -> dict[str, Any]:
    config_map = next(o for o in rendered.objects if o["kind"] == "ConfigMap")
    loaded: dict[str, Any] = yaml.safe_load(config_map["data"][CONFIG_FILE])
    return loaded


def test_schema_is_a_valid_json_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA)


def test_schema_was_transcribed_for_the_pinned_release() -> None:
    # Bumping TRTLLM_VERSION means re-reading that release's guide and updating tests/support/trtllm_schema.py.
    assert TRTLLM_VERSION == DOCUMENTED_RELEASE
    for image in ENGINES[EngineName.TRTLLM].images.values():
        assert image.rsplit(":", 1)[1] == TRTLLM_VERSION, image


def test_grid_covers_the_documented_shapes() -> None:
    assert {r.accelerator for r in RENDERED} == set(ENGINES[EngineName.TRTLLM].support)
    assert any(o["kind"] == "LeaderWorkerSet" for r in RENDERED for o in r.objects), "no multi-node TRT case"
    strategies = {options(r)["enable_attention_dp"] for r in RENDERED}
    assert strategies == {True, False}, "need both DEP and TEP"


@pytest.mark.parametrize("rendered", RENDERED, ids=[r.label for r in RENDERED])
def test_rendered_options_match_the_documented_schema(rendered: grid.Rendered) -> None:
    problems = errors(options(rendered))
    assert not problems, f"{rendered.label}: {CONFIG_FILE} breaks the documented options:\n" + "\n".join(problems)


@pytest.mark.parametrize("rendered", RENDERED, ids=[r.label for r in RENDERED])
def test_rank_count_equals_tensor_parallel_size(rendered: grid.Rendered) -> None:
    # TRT-GUIDE: "The total number of tasks (ranks) must equal tensor_parallel_size"; a JSON Schema
    # cannot relate the YAML to the pods, so count the ranks the rendered launch starts.
    config_map = next(o for o in rendered.objects if o["kind"] == "ConfigMap")
    workload = next(o for o in rendered.objects if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    if workload["kind"] == "LeaderWorkerSet":
        ranks = int(re.search(r" -np (\d+) ", config_map["data"][LEADER_SCRIPT])[1])  # type: ignore[index]
    else:
        ranks = int(workload["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    opts = options(rendered)
    assert ranks == opts["tensor_parallel_size"] * opts.get("pipeline_parallel_size", 1)
    assert opts["cuda_graph_config"]["max_batch_size"] <= opts["max_batch_size"]


@pytest.mark.parametrize("rendered", RENDERED, ids=[r.label for r in RENDERED])
def test_prompts_longer_than_one_batch_are_chunked(rendered: grid.Rendered) -> None:
    # The PyTorch backend rejects a prompt longer than max_num_tokens unless prefill is chunked.
    opts = options(rendered)
    assert opts["enable_chunked_prefill"] is (opts["max_seq_len"] > opts["max_num_tokens"])


def test_curated_config_is_accepted() -> None:
    assert errors(CURATED) == []


def _with(path: str, value: Any) -> dict[str, Any]:
    """CURATED with the dotted `path` set to `value` (a key that does not exist is added)."""
    changed = copy.deepcopy(CURATED)
    *parents, leaf = path.split(".")
    target = changed
    for key in parents:
        target = target[key]
    target[leaf] = value
    return changed


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in CURATED.items() if k != key}


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        (_with("max_seq_length", 2068), "Additional properties are not allowed ('max_seq_length' was unexpected)"),
        (_with("kv_cache_config.enable_block_resuse", False), "'enable_block_resuse' was unexpected"),
        (_with("sparse_attention_config.sparse_topk_blocks", 16), "'sparse_topk_blocks' was unexpected"),
        (_with("max_batch_size", "256"), "'256' is not of type 'integer'"),
        (_with("enable_attention_dp", "true"), "'true' is not of type 'boolean'"),
        (_with("tensor_parallel_size", 0), "0 is less than the minimum of 1"),
        (_with("kv_cache_config.free_gpu_memory_fraction", 1.5), "1.5 is greater than the maximum of 1"),
        (_with("kv_cache_config.enable_block_reuse", True), "False was expected"),
        (_with("sparse_attention_config.algorithm", "rocket"), "'minimax_m3' was expected"),
        (_with("max_seq_len", 1_048_576), "1048576 is greater than the maximum of 524288"),
        (_without("sparse_attention_config"), "'sparse_attention_config' is a required property"),
        (_without("max_seq_len"), "'max_seq_len' is a required property"),
    ],
    ids=[
        "unknown-key",
        "unknown-nested-key",
        "undocumented-sparse-knob",
        "int-as-string",
        "bool-as-string",
        "zero-tp",
        "fraction-above-1",
        "block-reuse-on",
        "other-sparse-algorithm",
        "seq-len-past-native",
        "no-sparse-attention",
        "uncapped-seq-len",
    ],
)
def test_schema_rejects(document: dict[str, Any], needle: str) -> None:
    problems = errors(document)
    assert any(needle in p for p in problems), problems


def _planned(document: dict[str, Any]) -> tuple[Plan, dict[str, Any]]:
    """The plan and the rendered LLM API options of one resource."""
    planned = plan(parse_resource(document).spec)
    return planned, options(grid.render_document("planned", document))


SAMPLE_DOCUMENTS = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(grid.SAMPLES_DIR.glob("trtllm-*.yaml"))}
PLANNED = {r.label: _planned(s.document()) for s in TRT_SPECS for r in grid.grid([s])} | {
    f"sample/{stem}": _planned(document) for stem, document in SAMPLE_DOCUMENTS.items()
}


@pytest.mark.parametrize("label", sorted(PLANNED))
def test_batch_is_what_the_kv_pool_holds_at_the_curated_length(label: str) -> None:
    # max_batch_size comes from the plan's KV pool (per attention-DP rank under DEP), not from full-length sequences:
    # the largest power of two whose sequences of the curated length (TRT-YAML: max_seq_len 2068) all fit, capped at
    # the curated 256; CUDA graphs are captured up to the same batch.
    planned, opts = PLANNED[label]
    batch = opts["max_batch_size"]
    per_sequence = min(planned.max_model_len, 2068)
    assert 1 <= batch <= 256
    assert batch & (batch - 1) == 0, batch
    assert batch == 1 or batch * per_sequence <= planned.kv_cache_tokens_per_rank
    assert batch == 256 or 2 * batch * per_sequence > planned.kv_cache_tokens_per_rank
    assert opts["cuda_graph_config"]["max_batch_size"] == batch


def test_the_tep_sample_schedules_at_least_the_benchmarks_smallest_concurrency() -> None:
    # The guide's benchmark (and `m3fleet bench` on a trtllm resource) sweeps concurrency 32..1024; at 131072 tokens the
    # old full-length rule scheduled 8 sequences at a time.
    planned, opts = PLANNED["sample/trtllm-gb200-2x4-tep"]
    assert opts["enable_attention_dp"] is False, "TRT-GUIDE's TEP layout"
    assert planned.max_model_len == 131_072
    assert opts["max_batch_size"] >= 32
    assert opts["max_batch_size"] > planned.max_sequences_at_max_len

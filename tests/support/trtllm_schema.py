"""A strict JSON Schema of the TensorRT-LLM `extra_llm_api_options` YAML keys documented for MiniMax-M3.

TensorRT-LLM cannot be installed here (PyPI holds only a stub that downloads from pypi.nvidia.com), so
its own `TorchLlmArgs` cannot validate what we render. This schema is the substitute: only the keys the
pinned release's MiniMax-M3 deployment guide (TRT-GUIDE) and its curated YAML (TRT-YAML) set, plus the
two metrics switches TRT-MET documents. Anything else is rejected: a key we have not seen documented is
a key we cannot claim the engine accepts. The guide's hard M3 constraints are `const`s.
"""

from __future__ import annotations

from typing import Any, Final

from jsonschema import Draft202012Validator

# The release whose guide this schema transcribes. A test pins the catalog to it: bumping
# TRTLLM_VERSION in catalog/versions.py must come with re-reading that release's guide.
DOCUMENTED_RELEASE: Final = "1.3.0rc20"
# The BF16 checkpoint's native context (TRT-GUIDE: the only variant served). Past it needs YaRN, for
# which the guide documents no option.
BF16_NATIVE_CONTEXT: Final = 524_288

POSITIVE_INT: Final = {"type": "integer", "minimum": 1}
NON_NEGATIVE_INT: Final = {"type": "integer", "minimum": 0}
BOOLEAN: Final = {"type": "boolean"}


def strict_object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties, "required": list(required)}


SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": f"TensorRT-LLM {DOCUMENTED_RELEASE} extra_llm_api_options for MiniMax-M3",
    **strict_object(
        {
            # Parallelism (TRT-YAML; pipeline_parallel_size: TRT-GUIDE). Ranks == tensor_parallel_size.
            "tensor_parallel_size": POSITIVE_INT,
            "pipeline_parallel_size": POSITIVE_INT,
            "moe_expert_parallel_size": POSITIVE_INT,
            "enable_attention_dp": BOOLEAN,  # DEP when true, TEP otherwise (TRT-GUIDE)
            # Batching (TRT-YAML). max_seq_len must be set: the checkpoint default breaks CUDA-graph capture.
            "max_batch_size": POSITIVE_INT,
            "max_num_tokens": POSITIVE_INT,
            "max_seq_len": {"type": "integer", "minimum": 1, "maximum": BF16_NATIVE_CONTEXT},
            # A TorchLlmArgs field (not in the M3 guide): prompts longer than max_num_tokens need it.
            "enable_chunked_prefill": BOOLEAN,
            "trust_remote_code": {"const": True},  # TRT-GUIDE: required to load the M3 config
            "kv_cache_config": strict_object(
                {
                    "free_gpu_memory_fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                    "enable_block_reuse": {"const": False},  # TRT-GUIDE: no reuse on the sparse path
                },
                required=("enable_block_reuse",),
            ),
            "cuda_graph_config": strict_object({"enable_padding": BOOLEAN, "max_batch_size": NON_NEGATIVE_INT}),
            "sparse_attention_config": strict_object(
                {"algorithm": {"const": "minimax_m3"}},  # TRT-GUIDE: required, no dense fallback
                required=("algorithm",),
            ),
            # Prometheus on /prometheus/metrics and its queue/KV gauges (TRT-MET, AIPERF).
            "return_perf_metrics": BOOLEAN,
            "enable_iter_perf_stats": BOOLEAN,
            "stream_interval": POSITIVE_INT,
            "num_postprocess_workers": NON_NEGATIVE_INT,
        },
        required=(
            "tensor_parallel_size",
            "max_seq_len",
            "trust_remote_code",
            "kv_cache_config",
            "sparse_attention_config",
        ),
    ),
}


def validator() -> Draft202012Validator:
    return Draft202012Validator(SCHEMA)


def errors(options: Any) -> list[str]:
    """Every schema violation in `options`, as "path: message" (empty when valid)."""
    found = sorted(validator().iter_errors(options), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in found]

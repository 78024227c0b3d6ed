"""spec.speculativeDecoding: the draft's weights and KV counted by the planner, each engine's spelling, the refusals.

The engines' own parsers take the rendered flags in tests/engine_parsers (the samples with a draft are in the grid);
the negative controls there show the checker refuses an unknown method or key.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.api.models import MiniMaxM3DeploymentSpec, Plan
from m3fleet.catalog.speculative import DRAFTS, RECIPES
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan
from m3fleet.render import render
from tests.support.engines import grid
from tests.support.samples import resource


def document(engine: str = "vllm", accelerator: str = "h200", variant: str = "bf16", **spec: Any) -> dict[str, Any]:
    return resource(engine, accelerator, variant, name="spec", **{"parallelism": {"tensorParallelSize": 8}, **spec})


def planned(doc: dict[str, Any]) -> Plan:
    return plan(parse_resource(doc).spec)


def argv(doc: dict[str, Any]) -> list[str]:
    """The engine container's argv (as its own parser would receive it)."""
    rendered = grid.render_document("spec", doc)
    return next(c.argv for c in grid.commands(rendered) if c.role in ("single", "leader"))


@pytest.mark.parametrize(("engine", "method"), [("vllm", "eagle3"), ("vllm", "mtp"), ("sglang", "eagle3")])
def test_the_draft_costs_weights_and_kv_on_every_gpu(engine: str, method: str) -> None:
    accelerator, variant = ("h200", "bf16") if engine == "vllm" else ("gb200", "mxfp8")
    if engine == "sglang":
        plain_doc = document(engine, accelerator, variant, parallelism={"tensorParallelSize": 4})
    else:
        plain_doc = document(engine, accelerator, variant)
    plain = planned(plain_doc)
    drafted = planned({**plain_doc, "spec": {**plain_doc["spec"], "speculativeDecoding": {"method": method}}})
    draft = drafted.speculative_decoding
    assert draft is not None and plain.speculative_decoding is None
    assert draft.draft_weights_gib_per_gpu > 0 and draft.draft_kv_bytes_per_token_per_gpu > 0
    assert drafted.weights_gib_per_gpu == pytest.approx(
        plain.weights_gib_per_gpu + draft.draft_weights_gib_per_gpu, 0.1
    )
    assert (
        drafted.kv_bytes_per_token_per_gpu == plain.kv_bytes_per_token_per_gpu + draft.draft_kv_bytes_per_token_per_gpu
    )
    assert drafted.kv_cache_tokens_per_replica < plain.kv_cache_tokens_per_replica
    assert draft.acceptance_length_prior == DRAFTS[draft.method].acceptance_length_prior
    assert drafted.validated is (plain.validated and (engine, method) in RECIPES)


def test_eagle3_draft_is_the_model_card_size_sharded_over_tp() -> None:
    # EAGLE3-CARD: ~3.3B parameters (BF16) and one MHA layer of 48 heads x 128, sharded over TP 8 on H200.
    draft = planned(document(speculativeDecoding={"method": "eagle3"})).speculative_decoding
    assert draft is not None
    assert draft.draft_model == "Inferact/MiniMax-M3-EAGLE3" and draft.num_speculative_tokens == 3
    assert draft.draft_weights_gib_per_gpu == round(3.3e9 * 2 / 8 / 2**30, 1)
    assert draft.draft_kv_bytes_per_token_per_gpu == 1 * 2 * (48 // 8) * 128 * 2
    assert draft.acceptance_length_prior == 2.7


def test_mtp_counts_every_module_as_a_sparse_moe_layer() -> None:
    # VLLM-MTP builds all 7 modules (num_mtp_modules) whatever numSpeculativeTokens is: per token each keeps its
    # K/V (4 heads, one per rank at TP 8) and its unsharded index-K vector, like a target sparse layer.
    bf16 = planned(document(speculativeDecoding={"method": "mtp", "numSpeculativeTokens": 1}))
    draft = bf16.speculative_decoding
    assert draft is not None and draft.draft_model == "MiniMaxAI/MiniMax-M3" and draft.num_speculative_tokens == 1
    assert draft.draft_kv_bytes_per_token_per_gpu == 7 * (2 * 1 * 128 * 2 + 128 * 2)
    # The modules' experts are quantized with the checkpoint: MXFP8's MTP weighs less than BF16's.
    mxfp8 = planned(document(variant="mxfp8", speculativeDecoding={"method": "mtp"})).speculative_decoding
    assert mxfp8 is not None and mxfp8.draft_weights_gib_per_gpu < draft.draft_weights_gib_per_gpu


def speculative_config(args: list[str]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(args[args.index("--speculative-config") + 1])
    return loaded


def test_vllm_spells_each_method_its_own_way() -> None:
    mtp = speculative_config(argv(document(speculativeDecoding={"method": "mtp", "numSpeculativeTokens": 2})))
    assert mtp == {"method": "minimax_m3_mtp", "num_speculative_tokens": 2}
    eagle = speculative_config(argv(document(speculativeDecoding={"method": "eagle3", "draftModel": "/drafts/e3"})))
    # VLLM-RCP-SPEC: the drafter on FLASH_ATTN on NVIDIA (FlashInfer takes block size 128 only for GQA).
    assert eagle == {
        "method": "eagle3",
        "model": "/drafts/e3",
        "num_speculative_tokens": 3,
        "attention_backend": "FLASH_ATTN",
    }
    amd = speculative_config(argv(document(accelerator="mi355x", speculativeDecoding={"method": "eagle3"})))
    assert "attention_backend" not in amd and amd["model"] == "Inferact/MiniMax-M3-EAGLE3"
    assert "--speculative-config" not in argv(document())


def test_sglang_spells_eagle3_as_a_chain_of_draft_steps() -> None:
    doc = document("sglang", "gb200", "mxfp8", parallelism={"tensorParallelSize": 4})
    doc["spec"]["speculativeDecoding"] = {"method": "eagle3", "numSpeculativeTokens": 4}
    args = argv(doc)
    pairs = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--speculative-")}
    assert pairs == {
        "--speculative-algorithm": "EAGLE3",
        "--speculative-draft-model-path": "Inferact/MiniMax-M3-EAGLE3",
        "--speculative-num-steps": "4",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "5",
    }


REFUSED = [
    ("sglang", "h200", "mtp", "no MTP (NextN) module"),
    ("trtllm", "gb200", "eagle3", "1.3.0rc20"),
    ("trtllm", "gb200", "mtp", "no MTP on the sparse-attention path"),
]


def refused_document(engine: str, accelerator: str, method: str) -> dict[str, Any]:
    doc = document(engine, accelerator, speculativeDecoding={"method": method})
    doc["spec"]["parallelism"] = {"strategy": "tp-ep"} if engine == "trtllm" else {}
    return doc


@pytest.mark.parametrize(("engine", "accelerator", "method", "needle"), REFUSED)
def test_admission_refuses_a_method_the_engine_does_not_serve(
    engine: str, accelerator: str, method: str, needle: str
) -> None:
    # The CRD's CEL (what kubectl apply, the webhook and m3fleet plan evaluate): one line, the field and the fix.
    with pytest.raises(SpecErrors) as refused:
        parse_resource(refused_document(engine, accelerator, method))
    (error,) = refused.value.errors
    assert error.field.startswith("spec.speculativeDecoding") and needle in error.problem and "vllm" in error.fix


@pytest.mark.parametrize(("engine", "accelerator", "method", "needle"), REFUSED)
def test_the_planner_refuses_it_too(engine: str, accelerator: str, method: str, needle: str) -> None:
    # A spec that skipped admission (the pure models without CEL) meets the same refusal in the planner.
    spec = MiniMaxM3DeploymentSpec.model_validate(refused_document(engine, accelerator, method)["spec"])
    with pytest.raises(SpecError) as refused:
        plan(spec)
    assert refused.value.field == "spec.speculativeDecoding.method"
    assert needle in refused.value.problem and "vllm" in refused.value.fix


def test_the_engine_flags_for_the_draft_are_owned() -> None:
    doc = document(engine="vllm")
    doc["spec"]["engine"]["extraArgs"] = ["--speculative-config", '{"method":"ngram"}']
    with pytest.raises(SpecError) as refused:
        render(parse_resource(doc), planned(doc))
    assert "spec.speculativeDecoding" in refused.value.fix

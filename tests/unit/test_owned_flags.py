"""The owned-flag and environment guards on spec.engine (pure: the checked-in parser table, no engine venvs).

The engine-parser tier (tests/engine_parsers/test_option_table.py) proves the table equals the pinned parsers and
that each refused spelling really sets the owned option there; these tests pin the user-facing behaviour.
"""

from __future__ import annotations

from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.engines import flags, sglang, trtllm, vllm
from m3fleet.errors import SpecError
from m3fleet.planner import plan
from m3fleet.render import render


def resource(engine: str, accelerator: str = "h200", **engine_fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "m3", "namespace": "llm"},
        "spec": {
            "model": {"source": {"pvc": {"claimName": "w"}}},
            "engine": {"name": engine, **engine_fields},
            "accelerator": accelerator,
        },
    }


def refusal(doc: dict[str, Any]) -> SpecError:
    parsed = parse_resource(doc)
    with pytest.raises(SpecError) as info:
        render(parsed, plan(parsed.spec))
    return info.value


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_owned_flag_is_in_the_pinned_parser(engine: str) -> None:
    table = flags.parser_table(engine)
    owned = {"vllm": vllm.OWNED, "sglang": sglang.OWNED}[engine]
    assert [f.flag for f in owned if f.flag not in table.options] == []


# (engine, extraArgs, index of the refused token, the owned flag named)
REFUSED = [
    ("vllm", ["-tp", "4"], 0, "--tensor-parallel-size"),
    ("vllm", ["-tp=4"], 0, "--tensor-parallel-size"),
    ("vllm", ["-dp", "2"], 0, "--data-parallel-size"),
    ("vllm", ["--disable-expert-parallel"], 0, "--enable-expert-parallel"),
    ("vllm", ["--no-enable-expert-parallel"], 0, "--enable-expert-parallel"),
    ("vllm", ["-ep"], 0, "--enable-expert-parallel"),
    ("vllm", ["--max-num-seqs", "8", "--hf-overrides.text_config.rope_scaling.factor", "2"], 2, "--hf-overrides"),
    ("vllm", ["--hf_overrides.a+=x,y"], 0, "--hf-overrides"),
    ("vllm", ["--tensor_parallel_size=4"], 0, "--tensor-parallel-size"),
    ("vllm", ["--tensor-parallel-si", "8"], 0, "--tensor-parallel-size"),
    ("vllm", ["--max-model", "8192"], 0, "--max-model-len"),
    ("vllm", ["--api-key", "sk"], 0, "--api-key"),
    ("vllm", ["--config", "/models/x.yaml"], 0, "--config"),
    ("vllm", ["--model=other"], 0, "--model"),
    ("sglang", ["--tensor-parallel-size", "4"], 0, "--tp-size"),
    ("sglang", ["--ep", "8"], 0, "--ep-size"),
    ("sglang", ["--model", "x"], 0, "--model-path"),
    ("sglang", ["--admin-api-key=k"], 0, "--admin-api-key"),
    ("sglang", ["--mem-frac", "0.9"], 0, "--mem-fraction-static"),
    # spellings of dests the plan owns that the issue found admitted (issue 42): each is refused through its dest
    ("vllm", ["-pcp", "2"], 0, "--prefill-context-parallel-size"),
    ("vllm", ["--prefill-context-parallel-size=2"], 0, "--prefill-context-parallel-size"),
    ("vllm", ["-dcp", "2"], 0, "--decode-context-parallel-size"),
    ("vllm", ["-dpl", "4"], 0, "--data-parallel-size-local"),
    ("vllm", ["--kv-cache-memory-bytes", "8000000000"], 0, "--kv-cache-memory-bytes"),
    ("vllm", ["--num-gpu-blocks-override", "64"], 0, "--num-gpu-blocks-override"),
    ("sglang", ["--max-total-tokens", "4096"], 0, "--max-total-tokens"),
    ("sglang", ["--base-gpu-id=4"], 0, "--base-gpu-id"),
    ("sglang", ["--attention-context-parallel-size", "2"], 0, "--attn-cp-size"),
    ("trtllm", ["--tp_size", "4"], 0, "--tp_size"),
    ("trtllm", ["--max-seq-len=4096"], 0, "--max-seq-len"),
]


@pytest.mark.parametrize(("engine", "args", "index", "flag"), REFUSED, ids=[" ".join(r[1]) for r in REFUSED])
def test_any_spelling_of_an_owned_flag_is_refused_naming_field_flag_and_fix(
    engine: str, args: list[str], index: int, flag: str
) -> None:
    accelerator = "gb200" if engine == "trtllm" else "h200"
    error = refusal(resource(engine, accelerator, extraArgs=args))
    assert error.field == f"spec.engine.extraArgs[{index}]"
    assert f"sets {flag}, which m3fleet derives from the plan for {engine}" in error.problem
    assert error.fix.startswith("remove it from spec.engine.extraArgs; ")


def test_the_fix_names_the_spec_field_to_use_instead() -> None:
    error = refusal(resource("vllm", extraArgs=["-tp", "4"]))
    assert "spec.parallelism.tensorParallelSize" in error.fix
    assert "-tp" in error.problem and "--tensor-parallel-size" in error.problem  # the spellings vLLM reads


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        ("vllm", ["--max-num-seqs", "64", "--enable-prefix-caching", "--limit-mm-per-prompt.image", "2"]),
        ("sglang", ["--max-running-requests", "64", "--chunked-prefill-size", "-1"]),
        ("trtllm", ["--log_level", "info"]),
    ],
)
def test_flags_the_plan_does_not_own_pass(engine: str, args: list[str]) -> None:
    table = flags.parser_table(engine) if engine != "trtllm" else trtllm.OPTION_TABLE
    owned = {"vllm": vllm.OWNED, "sglang": sglang.OWNED, "trtllm": trtllm.OWNED}[engine]
    flags.check_extra_args(args, table, owned)  # no SpecError


@pytest.mark.parametrize(
    ("engine", "args", "index", "suggestion"),
    [
        ("vllm", ["--max-num-seqs", "8", "--max-num-seq", "8"], 2, None),  # a unique prefix: vLLM takes it
        ("vllm", ["--enable-prefix-cachin"], 0, None),
        ("vllm", ["--enable-prefix-cashing"], 0, "--enable-prefix-caching"),
        ("vllm", ["--max-num-seqs", "8", "--no-such-flag"], 2, ""),
        ("sglang", ["--tp-size-typo-is-not-a-prefix", "8"], 0, ""),
        ("sglang", ["--max-runing-requests", "64"], 0, "--max-running-requests"),
    ],
)
def test_a_flag_the_pinned_parser_does_not_know_is_refused_with_a_suggestion(
    engine: str, args: list[str], index: int, suggestion: str | None
) -> None:
    """The engine would exit at start on an unknown flag and the pod crash-loop: refused at plan/admission, with
    the closest option of the pinned parser (difflib) when there is one. None: the token is a valid spelling."""
    owned = {"vllm": vllm.OWNED, "sglang": sglang.OWNED}[engine]
    if suggestion is None:
        flags.check_extra_args(args, flags.parser_table(engine), owned)
        return
    error = refusal(resource(engine, extraArgs=args))
    assert error.field == f"spec.engine.extraArgs[{index}]"
    assert f"{args[index]!r} is not an option of {engine}" in error.problem, error.problem
    assert (f"did you mean {suggestion}?" in error.fix) if suggestion else "did you mean" not in error.fix, error.fix


def test_an_owned_flag_is_refused_wherever_it_stands() -> None:
    # Conservative: vLLM folds dotted flags into JSON args even after `--`, so no position is exempt.
    error = refusal(resource("vllm", extraArgs=["--max-num-batched-tokens=16384", "--", "-tp", "2"]))
    assert error.field == "spec.engine.extraArgs[2]"


# --- spec.engine.env ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("BASH_ENV", "bash runs the file"),
        ("ENV", "runs the file it names"),
        ("LD_PRELOAD", "dynamic loader"),
        ("LD_LIBRARY_PATH", "dynamic loader"),
        ("PATH", "which program runs"),
        ("PYTHONPATH", "imports modules"),
        ("PYTHONSTARTUP", "Python runs the file"),
        ("BASH_FUNC_python3%%", "exported functions"),
        ("SHELLOPTS", "shell options"),
        ("VLLM_LOGGING_CONFIG_PATH", "dictConfig"),
        ("SGLANG_LOGGING_CONFIG_PATH", "dictConfig"),
        ("VLLM_PLUGINS", "plugins"),
        ("SGLANG_PLUGINS", "plugins"),
        ("VLLM_NCCL_SO_PATH", "shared library"),
        ("VLLM_RUST_FRONTEND_PATH", "runs the program"),
        ("SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE", "imports the Python package"),
        ("OMPI_MCA_plm_rsh_agent", "launch agent"),
        ("HOME", "set by m3fleet"),
        ("HF_TOKEN", "tokenSecretRef"),
        ("VLLM_API_KEY", "apiKeySecretRef"),
        ("CUDA_VISIBLE_DEVICES", "device plugin"),
        ("HIP_VISIBLE_DEVICES", "device plugin"),
        ("LWS_LEADER_ADDRESS", "LeaderWorkerSet"),
        ("M3FLEET_API_KEY", "launchers"),
        ("VLLM_USE_BREAKABLE_CUDAGRAPH", "renders it for this vllm plan on mi355x"),
    ],
)
def test_env_that_changes_execution_or_that_m3fleet_sets_is_refused(name: str, reason: str) -> None:
    env = [{"name": "NCCL_IB_HCA", "value": "mlx5_0"}, {"name": name, "value": "x"}]
    error = refusal(resource("vllm", "mi355x", env=env))
    assert error.field == "spec.engine.env[1].name"
    assert error.problem.startswith(name) and reason in error.problem, error.problem
    assert error.fix == "remove it from spec.engine.env"


def test_tuning_env_passes_through() -> None:
    env = [{"name": "NCCL_IB_HCA", "value": "mlx5_0"}, {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]
    parsed = parse_resource(resource("vllm", env=env))
    deployment = next(o for o in render(parsed, plan(parsed.spec)) if o["kind"] == "Deployment")
    names = [e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert {"NCCL_IB_HCA", "VLLM_LOGGING_LEVEL"} <= set(names)

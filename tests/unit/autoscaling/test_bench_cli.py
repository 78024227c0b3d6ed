"""The autoscaling benchmark's command line: `-f FILE` runs a resource of one's own, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.autoscaling.__main__ import main as bench_main
from tests.support.samples import SAMPLES_DIR

RUN = ["--scenario", "steady-chat", "--minutes", "3", "--no-sweep", "-o", "json"]


def test_a_resource_of_ones_own_is_what_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The SGLang H200 sample (BF16, 109k KV tokens a replica) against the built-in vLLM one (about 480k): the same
    chat needs more of SGLang's replicas, and its KV capacity is what the engines report."""
    assert bench_main(RUN) == 0
    (built_in,) = json.loads(capsys.readouterr().out)
    assert bench_main([*RUN, "-f", str(SAMPLES_DIR / "sglang-h200-bf16-tp8.yaml")]) == 0
    (sglang,) = json.loads(capsys.readouterr().out)
    ours = "context-aware"
    assert sglang["policies"][ours]["gpuHours"] > built_in["policies"][ours]["gpuHours"]
    assert sglang["policies"]["oracle"]["gpuHours"] > built_in["policies"]["oracle"]["gpuHours"]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--gateway"], "with -f, set spec.autoscaling.gateway and spec.speculativeDecoding in the file"),
        (["--speculative", "mtp"], "with -f, set spec.autoscaling.gateway and spec.speculativeDecoding in the file"),
    ],
    ids=["gateway", "speculative"],
)
def test_options_that_shape_the_built_in_resource_are_refused_with_a_file(
    extra: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_main([*RUN, "-f", str(SAMPLES_DIR / "vllm-h200-tp8.yaml"), *extra])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_a_file_that_is_no_resource_says_which_and_why(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(SystemExit) as exited:
        bench_main([*RUN, "-f", str(missing)])
    assert str(exited.value.code).startswith(f"-f {missing}: ")
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: m3fleet.dev/v1alpha1\nkind: MiniMaxM3Deployment\nmetadata: {name: x}\nspec: {}\n")
    with pytest.raises(SystemExit) as exited:
        bench_main([*RUN, "-f", str(bad)])
    message = str(exited.value.code)
    assert message.startswith(f"-f {bad}: ") and "spec" in message and "Traceback" not in message

"""`m3fleet simulate --throughput-from`: an `m3fleet bench` result replaces the simulator's assumed speeds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from m3fleet.api import parse_resource
from m3fleet.bench import results
from m3fleet.cli import main
from m3fleet.errors import SpecError
from m3fleet.planner import plan
from m3fleet_simulator.calibration import calibrate
from m3fleet_simulator.fleet import PerfModel
from tests.support.bench_results import SAMPLE, measured, measured_from_fixture, run
from tests.support.samples import SAMPLES_DIR, load_sample


def test_measured_speed_replaces_the_assumed_one() -> None:
    p = plan(parse_resource(load_sample(SAMPLE)).spec)
    model = PerfModel.from_plan(p)
    context = 2048 + 512
    assumed_itl = model.decode_step + 10 * (model.decode_per_sequence + model.decode_per_context_token * context)
    assumed_ttft = 2048 * model.token_cost(2048)
    result = measured([run(10, tpot_ms=2000 * assumed_itl, ttft_ms=500 * assumed_ttft)])  # 2x slower, 2x faster
    calibrated, described = calibrate(model, p, result, "r.json")
    assert described["decodeScale"] == pytest.approx(2.0) and described["prefillScale"] == pytest.approx(0.5)
    assert calibrated.decode_step == pytest.approx(2 * model.decode_step)
    assert calibrated.prefill_linear == pytest.approx(0.5 * model.prefill_linear)
    assert calibrated.capacity_tokens == model.capacity_tokens  # KV capacity stays the plan's
    # Two replicas were serving: each engine saw half the concurrency, so the same TPOT means a slower engine.
    two = calibrate(model, p, measured([run(10, 2000 * assumed_itl, 1.0)], replicas=2), "r.json")[1]
    assert two["decodeScale"] > described["decodeScale"]


def test_prefill_is_read_at_the_lowest_concurrency() -> None:
    p = plan(parse_resource(load_sample(SAMPLE)).spec)
    model = PerfModel.from_plan(p)
    base = 1000 * 2048 * model.token_cost(2048)
    _, described = calibrate(model, p, measured([run(64, 30, 40 * base), run(8, 30, base)]), "r.json")
    assert described["prefillFromConcurrency"] == 8 and described["prefillScale"] == pytest.approx(1.0)


def test_another_shape_is_refused() -> None:
    p = plan(parse_resource(load_sample(SAMPLES_DIR / "sglang-h200-bf16-tp8.yaml")).spec)
    with pytest.raises(SpecError, match=r"--throughput-from: r\.json was measured on vllm on h200 bf16, TP8"):
        calibrate(PerfModel.from_plan(p), p, measured([run(10, 30, 300)]), "r.json")


def simulate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any] | None, str]:
    code = main(["simulate", "--scenario", "steady-chat", "--minutes", "3", "-o", "json", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out)[0] if out else None, err


def test_simulate_takes_a_result_from_the_real_client(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    runs = list(measured_from_fixture().runs)
    document = measured(runs).to_document()
    path = tmp_path / "result.json"
    path.write_text(json.dumps(document))
    code, report, err = simulate_json(capsys, "--throughput-from", str(path))
    assert (code, err) == (0, "") and report is not None
    prior = report["parameters"]["throughputPrior"]
    assert prior["measured"]["job"] == "m3-vllm-h200-tp8-bench-1" and prior["decodeScale"] < 1  # 4 ms/token, fast
    assumed = PerfModel.from_plan(plan(parse_resource(load_sample(SAMPLE)).spec))
    assert report["parameters"]["perfModel"]["decodeStepSeconds"] == pytest.approx(
        assumed.decode_step * prior["decodeScale"], rel=1e-3
    )
    # The ConfigMap m3fleet bench creates works as well, and so does -f with the same deployment.
    configmap = tmp_path / "cm.yaml"
    owner = {"apiVersion": "m3fleet.dev/v1alpha1", "kind": "MiniMaxM3Deployment", "name": "x", "uid": "u"}
    configmap.write_text(yaml.safe_dump(results.config_map(measured(runs), owner, {})))
    code, again, _ = simulate_json(capsys, "--throughput-from", str(configmap), "-f", str(SAMPLE))
    assert (
        code == 0
        and again is not None
        and again["parameters"]["throughputPrior"]["decodeScale"] == prior["decodeScale"]
    )
    code, text_out, _ = main(["simulate", "--scenario", "steady-chat", "--minutes", "2",
                              "--throughput-from", str(path)]), *capsys.readouterr()  # fmt: skip
    assert code == 0 and "throughput: measured by m3fleet bench" in text_out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{}", "is not an m3fleet benchmark result"),
        ("[unclosed", "is neither JSON nor YAML"),
        (None, "No such file or directory"),
    ],
)
def test_bad_results_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    code, report, err = simulate_json(capsys, "--throughput-from", str(path))
    assert (code, report) == (2, None) and message in err and err.count("\n") == 1


def test_a_result_from_another_deployment_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(measured([run(10, 30, 300)]).to_document()))
    code, _, err = simulate_json(
        capsys, "--throughput-from", str(path), "-f", str(SAMPLES_DIR / "sglang-h200-bf16-tp8.yaml")
    )
    assert code == 2 and "was measured on vllm on h200" in err and "fix: benchmark this deployment" in err

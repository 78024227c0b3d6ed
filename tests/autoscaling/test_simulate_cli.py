"""`m3fleet simulate`: output formats and the exit-code contract (0 ok, 2 invalid input, 1 internal)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from m3fleet.cli import main
from tests.conftest import SAMPLES_DIR


def simulate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["simulate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_report_is_the_contracts_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = simulate(capsys, "--scenario", "steady-chat", "--seed", "7", "--minutes", "3", "-o", "json")
    assert (code, err) == (0, "")
    (report,) = json.loads(out)
    assert (report["scenario"], report["seed"], report["coldStartSeconds"]) == ("steady-chat", 7, None)
    assert report["plan"]["tensorParallelSize"] == 8 and report["parameters"]["durationMinutes"] == 3
    assert "one prompt at a time" in report["parameters"]["perfModel"]["prefillOrder"]  # the engine's scheduling
    assert "its queue included" in report["parameters"]["simulator"]["drain"]  # what a terminating engine serves
    assert set(report["policies"]) == {"context-aware"}  # the product simulates its own autoscaler only
    assert {"sloAttainment", "gpuHours", "preemptions", "rejected", "scaleEvents"} <= set(
        report["policies"]["context-aware"]
    )


def test_nothing_in_the_product_output_speaks_of_the_projects_aims(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["-o", "json"], []):
        _, out, _ = simulate(capsys, "--scenario", "bursty", "--minutes", "4", *argv)
        assert "aim" not in out.lower() and "oracle" not in out and "request-count" not in out


def test_several_seeds_and_a_cold_start(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = simulate(
        capsys,
        "--scenario",
        "long-context-burst",
        "--seeds",
        "1-2",
        "--minutes",
        "3",
        "--cold-start",
        "90",
        "-o",
        "json",
    )
    assert (code, err) == (0, "")
    reports = json.loads(out)
    assert [r["seed"] for r in reports] == [1, 2] and all(r["coldStartSeconds"] == 90 for r in reports)
    code, out, _ = simulate(capsys, "--scenario", "steady-chat", "--seeds", "3,5", "--minutes", "2")
    assert (
        code == 0
        and "SLO MET" in out
        and len([line for line in out.splitlines() if line.strip().startswith(("3 ", "5 "))]) == 2
    )


def test_file_resource(capsys: pytest.CaptureFixture[str]) -> None:
    sample = SAMPLES_DIR / "vllm-mi355x-1m-fp8kv.yaml"
    code, out, _ = simulate(
        capsys, "-f", str(sample), "--scenario", "long-context-burst", "--minutes", "21", "-o", "json"
    )
    (report,) = json.loads(out)
    assert code == 0 and report["plan"]["accelerator"] == "mi355x"
    assert report["parameters"]["resource"].startswith("the resource given with -f")


def test_a_resource_with_a_gateway_runs_behind_one(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    document = yaml.safe_load((SAMPLES_DIR / "vllm-h200-tp8.yaml").read_text())
    document["spec"]["autoscaling"] = {"enabled": True, "gateway": {"matchLabels": {"model_name": "MiniMax-M3"}}}
    resource = tmp_path / "gateway.yaml"
    resource.write_text(yaml.safe_dump(document))
    code, out, _ = simulate(capsys, "-f", str(resource), "--scenario", "steady-chat", "--minutes", "2")
    assert code == 0 and "gateway: request bytes at arrival" in out and "bytes a prompt token" in out
    code, out, _ = simulate(capsys, "-f", str(resource), "--scenario", "steady-chat", "--minutes", "2", "-o", "json")
    (report,) = json.loads(out)
    assert code == 0 and 2.5 <= report["parameters"]["simulator"]["gateway"]["bytesPerToken"] <= 4.5
    _, out, _ = simulate(capsys, "--scenario", "steady-chat", "--minutes", "2")
    assert "gateway" not in out  # the built-in resource has none


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--minutes", "0"], "error: --minutes: 0 is not positive; fix:"),
        (["--seeds", "1-x"], "error: --seeds: '1-x' is not a seed range; fix:"),
        (["--cold-start", "-5"], "error: --cold-start: -5 is outside 0-7200 seconds; fix:"),
        (["-f", str(SAMPLES_DIR)], "simulate takes exactly one MiniMaxM3Deployment, found"),
        (["-f", "/no/such/file.yaml"], "error: /no/such/file.yaml: (file): no such file or directory; fix:"),
    ],
)
def test_invalid_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = simulate(capsys, "--scenario", "steady-chat", *argv)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_invalid_resource_names_the_field(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: m3fleet.dev/v1alpha1\nkind: MiniMaxM3Deployment\nmetadata: {name: x}\n"
        "spec: {model: {source: {pvc: {claimName: w}}}, context: {maxModelLen: 0}}\n"
    )
    code, out, err = simulate(capsys, "--scenario", "steady-chat", "-f", str(bad))
    assert code == 2 and out == "" and "spec.context.maxModelLen" in err and "fix:" in err


def test_unknown_scenario_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, "--scenario", "nope")
    assert exc.value.code == 2

"""`m3fleet simulate`: output formats and the exit-code contract (0 ok, 2 invalid input, 1 internal)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from m3fleet.cli import main
from tests.support.samples import SAMPLES_DIR, load_sample


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
        (["--minutes", "nan"], "error: --minutes: nan is not positive; fix:"),
        (["--seeds", "1-x"], "error: --seeds: '1-x' is not a seed range or list of seeds"),
        (["--seeds", "5-1"], "error: --seeds: '5-1' runs backwards (5 > 1); fix:"),
        (["--seeds", "1-100000000"], "error: --seeds: '1-100000000' holds 100000000 seeds, more than 1000; fix:"),
        (["--cold-start", "-5"], "error: --cold-start: -5 is outside 0-7200 seconds; fix:"),
        (["-f", str(SAMPLES_DIR)], "simulate takes exactly one MiniMaxM3Deployment"),
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


def test_an_invalid_resource_is_named_by_file_document_and_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """As plan and render name it; a MiniMaxM3ModelCache beside the resource is skipped, as plan skips it."""
    document = load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml")
    document["spec"]["parallelism"] = {"tensorParallelSize": 3}
    cache = {"apiVersion": document["apiVersion"], "kind": "MiniMaxM3ModelCache", "metadata": {"name": "c"}}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([cache, document]))
    code, out, err = simulate(capsys, "--scenario", "steady-chat", "-f", str(path))
    name = document["metadata"]["name"]
    assert code == 2 and out == ""
    assert err.startswith(f"error: {path}#1 (MiniMaxM3Deployment/{name}): spec.parallelism.tensorParallelSize: 3 ")


def test_an_autoscaled_resource_is_simulated_within_its_own_bounds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """What would the autoscaler do with my resource: its own min/max, not the scenario's (which size the
    built-in resource for the scenario's traffic, and apply when the resource does not enable autoscaling)."""
    document = load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml")
    document["spec"]["autoscaling"] = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 1,
        "prometheus": {"url": "http://prometheus:9090"},
    }
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(document))
    code, out, _ = simulate(capsys, "-f", str(path), "--scenario", "bursty", "--minutes", "10", "-o", "json")
    (report,) = json.loads(out)
    replicas = report["parameters"]["replicas"]
    assert code == 0 and (replicas["min"], replicas["max"], replicas["initial"]) == (1, 1, 1)
    assert report["policies"]["context-aware"]["peakReplicas"] == 1
    _, out, _ = simulate(capsys, "--scenario", "bursty", "--minutes", "10", "-o", "json")
    (builtin,) = json.loads(out)
    assert builtin["parameters"]["replicas"]["max"] > 1 and "scenario's" in builtin["parameters"]["replicas"]["source"]


def test_seed_and_seeds_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Also --seed 1, the default (argparse tells them apart only by identity with the default)."""
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, "--scenario", "steady-chat", "--seed", "1", "--seeds", "1-2")
    assert exc.value.code == 2


def test_a_run_where_every_request_is_rejected_shows_no_attainment(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Rejected requests are outside the attainment's denominator: with none admitted there is no attainment, and
    100% would read as served."""
    document = load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml")
    document["spec"]["context"] = {"maxModelLen": 1}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(document))
    code, out, _ = simulate(capsys, "-f", str(path), "--scenario", "steady-chat", "--minutes", "1", "-o", "json")
    (report,) = json.loads(out)
    result = report["policies"]["context-aware"]
    assert code == 0 and result["rejected"] == result["requests"] > 0 and result["sloAttainment"] is None
    _, out, _ = simulate(capsys, "-f", str(path), "--scenario", "steady-chat", "--minutes", "1")
    assert out.splitlines()[-1].split()[2] == "n/a"


def test_unknown_scenario_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, "--scenario", "nope")
    assert exc.value.code == 2

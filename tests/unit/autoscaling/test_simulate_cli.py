"""`m3fleet simulate`: output formats and the exit-code contract (0 ok, 2 invalid input, 1 internal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from m3fleet.cli import main
from tests.support.samples import SAMPLES_DIR, load_sample

REPO = Path(__file__).resolve().parents[3]


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


def test_the_resources_slo_is_what_requests_are_scored_against(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The same fleet of one replica (no autoscaling decision differs), scored against the default SLO and a
    user's absolute one of 0.1 s TTFT and 10 ms ITL: the stricter SLO meets fewer requests, and says so."""
    document = load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml")
    document["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 1}
    reports = []
    for slo in (
        {},
        {
            "percentile": 99,
            "ttft": {"seconds": 0.1, "unloadedPrefillFactor": 0},
            "itl": {"seconds": 0.01, "unloadedFactor": 0},
        },
    ):
        document["spec"]["autoscaling"]["slo"] = slo
        path = tmp_path / "one.yaml"
        path.write_text(yaml.safe_dump(document))
        code, out, _ = simulate(capsys, "-f", str(path), "--scenario", "steady-chat", "--minutes", "10", "-o", "json")
        assert code == 0
        reports.append(json.loads(out)[0])
    default, strict = reports
    assert default["parameters"]["slo"].startswith("TTFT <= 2 s + 1.5 x unloaded prefill time on one replica")
    assert (
        strict["parameters"]["slo"]
        == "TTFT <= 0.1 s, and mean inter-token latency <= 0.01 s; objective: 99% of requests"
    )
    ours, theirs = default["policies"]["context-aware"], strict["policies"]["context-aware"]
    assert theirs["requests"] == ours["requests"] and theirs["gpuHours"] == ours["gpuHours"]
    assert theirs["metSlo"] < ours["metSlo"]


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


def _write_trace(path: Path, rows: list[tuple[float, int, int]], jsonl: bool) -> Path:
    if jsonl:
        lines = [json.dumps({"time": t, "promptTokens": p, "outputTokens": o}) for t, p, o in rows]
    else:
        lines = ["time,promptTokens,outputTokens", *(f"{t},{p},{o}" for t, p, o in rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


TRACE_ROWS = [(0.5 * i, 2000 + 37 * i, 100 + i) for i in range(400)] + [(30.0, 200_000, 10)]  # one too long


def test_a_trace_is_replayed_as_given_in_csv_or_json_lines(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Every row a request (the one longer than the built-in resource's maxModelLen rejected); CSV and JSON Lines
    the same run; the requests do not depend on the seed, the cold starts do."""
    reports = []
    for jsonl in (False, True):
        trace = _write_trace(tmp_path / f"trace.{'jsonl' if jsonl else 'csv'}", TRACE_ROWS, jsonl)
        code, out, err = simulate(capsys, "--trace", str(trace), "-o", "json")
        assert (code, err) == (0, ""), err
        (report,) = json.loads(out)
        reports.append(report)
    csv_report, jsonl_report = reports
    assert csv_report["policies"] == jsonl_report["policies"]
    result = csv_report["policies"]["context-aware"]
    assert (result["requests"], result["rejected"]) == (len(TRACE_ROWS), 1)
    assert csv_report["trace"].endswith("trace.csv") and "scenario" not in csv_report
    assert csv_report["parameters"]["workload"][0]["requests"] == len(TRACE_ROWS)
    assert csv_report["parameters"]["durationMinutes"] == 4  # the last arrival (199.5 s) within the 4th minute
    code, out, _ = simulate(capsys, "--trace", str(tmp_path / "trace.csv"), "--seeds", "1,2", "-o", "json")
    assert code == 0 and {r["policies"]["context-aware"]["requests"] for r in json.loads(out)} == {len(TRACE_ROWS)}
    code, out, _ = simulate(capsys, "--trace", str(tmp_path / "trace.csv"))
    assert code == 0 and out.startswith(f"trace {tmp_path / 'trace.csv'}: {len(TRACE_ROWS)} requests over 4 minutes")


def test_epoch_times_set_the_simulated_clock(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A scheduled window (spec.autoscaling.schedule) sees the trace's own hour: 10:00 UTC, inside 09:00-17:00."""
    document = load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml")
    document["spec"]["autoscaling"] = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 4,
        "prometheus": {"url": "http://prometheus:9090"},
        "schedule": [{"name": "office", "start": "09:00", "end": "17:00", "minReplicas": 3}],
    }
    resource = tmp_path / "scheduled.yaml"
    resource.write_text(yaml.safe_dump(document))
    ten_o_clock = 1799056800.0  # 2027-01-04T10:00:00Z
    peaks = []
    for start in (0.0, ten_o_clock):
        trace = _write_trace(tmp_path / "t.csv", [(start + 2.0 * i, 1000, 50) for i in range(90)], jsonl=False)
        code, out, err = simulate(capsys, "-f", str(resource), "--trace", str(trace), "-o", "json")
        assert code == 0, err
        peaks.append(json.loads(out)[0]["policies"]["context-aware"]["peakReplicas"])
    assert peaks[0] < 3 <= peaks[1], peaks


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("time,promptTokens\n0,10\n", "t.csv:1: header: the header lacks outputTokens; fix:"),
        ("time,promptTokens,outputTokens\n0,10,5\n1,ten,5\n", "t.csv:3: promptTokens: 'ten' is not a whole number"),
        ("time,promptTokens,outputTokens\n-1,10,5\n", "t.csv:2: time: '-1' is not seconds, 0 or more; fix:"),
        ("time,promptTokens,outputTokens\n0,10,0\n", "t.csv:2: outputTokens: '0' is not a whole number from 1"),
        ("time,promptTokens,outputTokens\n", "t.csv: (file): holds no request; fix:"),
        ('{"time": 0, "promptTokens": 10, "outputTokens": 5}\n{"time": 1,\n', "t.csv:2: (row): is not a JSON object"),
        ('{"time": 0, "promptTokens": 1.5, "outputTokens": 5}\n', "t.csv:1: promptTokens: 1.5 is not a whole number"),
    ],
)
def test_a_bad_trace_is_one_line_naming_the_row_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(content)
    code, out, err = simulate(capsys, "--trace", str(trace))
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def recorded_resource(tmp_path: Path, needs: list[float | None], status: bool = True) -> Path:
    """A resource as `kubectl get m3d NAME -o yaml` prints it: server fields, and the demand its autoscaler
    recorded (status.autoscaling.demand, DemandRecord.to_status's dense form) from 10:00 UTC on."""
    document = load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml")
    document["metadata"] |= {"uid": "0b5e", "resourceVersion": "42", "generation": 3, "managedFields": []}
    document["spec"]["autoscaling"] = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 6,
        "prometheus": {"url": "http://prometheus:9090"},
    }
    demand = {"bucketSeconds": 60, "start": 1799056800 // 60, "needs": needs, "open": [], "samples": None}
    if status:
        document["status"] = {"observedGeneration": 3, "autoscaling": {"desiredReplicas": 2, "demand": demand}}
    path = tmp_path / "recorded.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_the_resources_recorded_demand_is_replayed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The need it recorded rises from 1 to 3.4 replicas for 12 minutes: the autoscaler follows it within the
    resource's own bounds; a minute with nothing recorded has no requests."""
    path = recorded_resource(tmp_path, [1.0] * 8 + [None] * 2 + [3.4] * 12 + [1.0] * 8)
    code, out, err = simulate(capsys, "-f", str(path), "--recorded", "-o", "json")
    assert (code, err) == (0, ""), err
    (report,) = json.loads(out)
    name = load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml")["metadata"]["name"]
    assert report["trace"] == f"llm/{name}" and "status.autoscaling.demand" in report["parameters"]["trace"]
    assert report["parameters"]["durationMinutes"] == 30
    replicas = report["parameters"]["replicas"]
    assert replicas == {"min": 1, "max": 6, "initial": 1, "source": "the resource's spec.autoscaling"}
    result = report["policies"]["context-aware"]
    assert 3 <= result["peakReplicas"] <= replicas["max"] and result["scaleEvents"] >= 2, result


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        ([], True, "error: --recorded: replays the -f resource's status.autoscaling.demand; fix: give -f FILE"),
        (["-f", "FILE"], False, "status.autoscaling.demand: holds no recorded demand; fix: give the resource as"),
    ],
)
def test_recorded_without_a_record_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], status: bool, message: str
) -> None:
    path = recorded_resource(tmp_path, [1.0], status=status)
    code, out, err = simulate(capsys, "--recorded", *[str(path) if a == "FILE" else a for a in argv])
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_scenario_trace_and_recorded_are_one_choice(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for argv in ([], ["--scenario", "bursty", "--trace", str(tmp_path / "t.csv")]):
        with pytest.raises(SystemExit) as exc:
            simulate(capsys, *argv)
        assert exc.value.code == 2


def test_without_the_simulator_installed_simulate_says_what_is_missing_and_the_fix(tmp_path: Path) -> None:
    """m3fleet installed without the extra: this environment's packages minus the m3fleet-simulator distribution
    (no site processing, so no editable-install hook adds it back). `m3fleet simulate`, with any flags or --help, is
    one line with the fix and exit 2; every other command still works."""
    site = Path(sysconfig.get_paths()["purelib"])
    packages = tmp_path / "site-packages"
    packages.mkdir()
    for entry in site.iterdir():
        if "m3fleet_simulator" not in entry.name and not entry.name.endswith(".pth"):
            (packages / entry.name).symlink_to(entry)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{packages}{os.pathsep}{REPO / 'operator'}"}

    def m3fleet(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-S", "-m", "m3fleet.cli", *argv]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)

    probe = subprocess.run(
        [sys.executable, "-S", "-c", "import m3fleet_simulator"], capture_output=True, env=env, check=False
    )
    assert probe.returncode == 1 and b"No module named 'm3fleet_simulator'" in probe.stderr  # the premise holds
    for argv in (["--scenario", "steady-chat", "-o", "json"], ["--help"], []):
        result = m3fleet("simulate", *argv)
        assert (result.returncode, result.stdout) == (2, ""), (argv, result)
        assert result.stderr == (
            "error: m3fleet simulate needs the autoscaling simulator (m3fleet-simulator), not installed; "
            "fix: pip install 'm3fleet[simulate]'\n"
        )
    listed = m3fleet("--help")
    assert listed.returncode == 0 and "pip install 'm3fleet[simulate]'" in listed.stdout
    planned = m3fleet("plan", "-f", str(SAMPLES_DIR / "vllm-h200-tp8.yaml"), "-o", "json")
    assert planned.returncode == 0 and json.loads(planned.stdout)[0]["tensorParallelSize"] == 8

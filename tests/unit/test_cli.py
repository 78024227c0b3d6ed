"""`m3fleet plan` and `m3fleet crd`: output formats and the exit-code/error contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from m3fleet.api.crd import crd_yaml
from m3fleet.cli import main
from tests.support.samples import SAMPLE_FILES, SAMPLES_DIR

GOOD = """apiVersion: m3fleet.dev/v1alpha1
kind: MiniMaxM3Deployment
metadata: {name: good}
spec:
  model: {source: {pvc: {claimName: w}}}
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "in.yaml"
    path.write_text(text)
    return str(path)


def test_plan_json_is_a_list_with_one_plan_per_resource(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "-f", str(SAMPLES_DIR), "-o", "json")
    assert code == 0 and err == ""
    plans = json.loads(out)
    assert isinstance(plans, list) and len(plans) == len(list(SAMPLES_DIR.rglob("*.yaml")))  # and disaggregated/
    required = {
        "engine", "accelerator", "variant", "checkpoint", "strategy", "tensorParallelSize", "dataParallelSize",
        "expertParallelSize", "gpusPerNode", "gpusPerReplica", "nodesPerReplica", "gpuMemoryUtilization",
        "maxModelLen", "kvCacheDtype", "ropeScalingFactor", "weightsGiBPerGPU", "kvCacheTokensPerRank",
        "kvCacheTokensPerReplica", "maxSequencesAtMaxLen", "validated", "notes",
    }  # fmt: skip
    for p in plans:
        assert required <= set(p)


def test_plan_single_resource_json_is_still_a_list(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "plan", "-f", write(tmp_path, GOOD), "-o", "json")
    assert code == 0 and len(json.loads(out)) == 1


def test_plan_table_and_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "plan", "-f", write(tmp_path, GOOD))
    assert code == 0 and out.splitlines()[0].split()[:3] == ["NAME", "ENGINE", "ACCEL"]
    assert out.splitlines()[1].split()[0] == "good"
    code, out, _ = run(capsys, "plan", "-f", write(tmp_path, GOOD), "-o", "yaml")
    assert code == 0 and yaml.safe_load(out)["tensorParallelSize"] == 8


AUTOSCALED = (
    GOOD
    + """  autoscaling:
    enabled: true
    slo: {percentile: 99, ttft: {seconds: 1, perPromptTokenSeconds: 0.0001, unloadedPrefillFactor: 0}}
"""
)


def test_plan_shows_the_slo_of_an_autoscaled_resource(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, AUTOSCALED + "---\n" + GOOD.replace("name: good", "name: fixed"))
    code, out, _ = run(capsys, "plan", "-f", path, "-o", "json")
    scaled, fixed = json.loads(out)
    assert code == 0 and "autoscaling" not in fixed  # a fixed fleet's plan is as before
    assert scaled["autoscaling"] == {
        "minReplicas": 1,
        "maxReplicas": 4,
        "slo": {
            "percentile": 99.0,
            "ttft": {"seconds": 1.0, "perPromptTokenSeconds": 0.0001, "unloadedPrefillFactor": 0.0},
            "itl": {"seconds": 0.0, "unloadedFactor": 1.5},  # the defaults the apiserver fills in
        },
    }
    code, out, _ = run(capsys, "plan", "-f", path, "-o", "yaml")
    assert next(yaml.safe_load_all(out))["autoscaling"]["slo"]["percentile"] == 99.0
    code, out, _ = run(capsys, "plan", "-f", path)
    header, scaled_row, fixed_row = (line.split() for line in out.splitlines())
    assert header[-2:] == ["REPLICAS", "SLO"]
    assert out.splitlines()[1].endswith("1-4       p99 TTFT<=1s+0.0001s/tok ITL<=1.5xidle")
    assert fixed_row[-2:] == ["-", "-"] and scaled_row[0] == "good"


def test_plan_refuses_an_slo_that_allows_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = GOOD + "  autoscaling: {enabled: true, slo: {ttft: {seconds: 0, unloadedPrefillFactor: 0}}}\n"
    code, out, err = run(capsys, "plan", "-f", write(tmp_path, bad))
    assert code != 0 and out == "" and len(err.strip().splitlines()) == 1
    assert "spec.autoscaling.slo.ttft.seconds" in err and "allows no time to first token" in err and "fix:" in err


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("foo: [bar\n", ["invalid YAML", "line "]),
        ("apiVersion: v1\nkind: MiniMaxM3Deployment\nmetadata: {name: c}\n", ["apiVersion", "m3fleet.dev/v1alpha1"]),
        (GOOD + "  replicas: -3\n", ["spec.replicas", "from 0 to 1024"]),
        (GOOD + "  contxt: {}\n", ["spec.contxt", "did you mean `context`?"]),
        (
            GOOD + "  context: {maxModelLen: 1048576}\n  parallelism: {tensorParallelSize: 8}\n",
            ["spec.context.maxModelLen", "fix:"],
        ),
        (
            GOOD.replace("model: {source: {pvc: {claimName: w}}}", "engine: {name: vllm}"),
            ["spec.model: is required", "add model"],
        ),
        (GOOD.replace("metadata: {name: good}", "metadata: {}"), ["metadata.name"]),
        (
            GOOD.replace("name: good", "name: Good.v2"),
            ['metadata.name: "Good.v2" must start with a lowercase letter', "DNS-1035", "fix:"],
        ),
        (GOOD.replace("name: good", "name: " + "g" * 46), ["metadata.name", "controller-revision-hash", "fix:"]),
        (GOOD.replace("name: good", "name: good, namespace: 7"), ["metadata.namespace", "string"]),
        (GOOD + "  rollout: {maxSurge: 0, maxUnavailable: 0}\n", ["spec.rollout.maxUnavailable", "at least 1"]),
    ],
    ids=[
        "yaml",
        "kind",
        "schema",
        "unknown-field",
        "infeasible",
        "missing",
        "no-name",
        "bad-name",
        "long-name",
        "bad-namespace",
        "stuck-rollout",
    ],
)
def test_bad_input_exits_2_with_one_message_and_no_stdout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, fragments: list[str]
) -> None:
    code, out, err = run(capsys, "plan", "-f", write(tmp_path, text), "-o", "json")
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


def test_one_message_per_failing_resource(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = GOOD.replace("good", "bad") + "  accelerator: a100\n"
    worse = GOOD.replace("good", "worse") + "  replicas: -1\n"
    code, out, err = run(capsys, "plan", "-f", write(tmp_path, "---\n".join([GOOD, bad, worse])))
    assert code == 2 and out == ""
    assert err.count("error: ") == 2 and "(MiniMaxM3Deployment/bad): spec.accelerator: " in err
    assert "(MiniMaxM3Deployment/worse): spec.replicas: " in err


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "-f", "/nonexistent.yaml")
    assert code == 2 and out == "" and "no such file" in err


def test_every_file_given_with_a_repeated_f_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    """As kubectl apply -f a.yaml -f b.yaml: every file, not the last one."""
    first, second = sorted(SAMPLE_FILES)[:2]
    code, out, _ = run(capsys, "plan", "-f", str(first), "-f", str(second), "-o", "json")
    assert code == 0 and len(json.loads(out)) == 2
    code, out, _ = run(capsys, "render", "-f", str(first), "-f", str(second), "-o", "json")
    names = {o["metadata"]["name"] for o in json.loads(out)["items"] if o["kind"] == "Service"}
    assert code == 0 and len(names) == 2


def test_an_empty_filename_is_an_error_not_the_current_directory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "-f", "")
    assert code == 2 and out == "" and err == "error: -f '': (file): is empty; fix: give a file, a directory or -\n"


def test_crd_command_prints_the_checked_in_crd(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "crd")
    assert code == 0 and out == crd_yaml()


def test_console_script_never_prints_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "kind: [")
    result = subprocess.run(
        [sys.executable, "-m", "m3fleet.cli", "plan", "-f", path], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stdout == ""


def test_run_with_a_webhook_port_needs_its_certificate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Said before anything starts (no cluster is needed to be told), with the flag to fix."""
    code, out, err = run(capsys, "run", "--webhook-port", "9443")
    assert (code, out) == (2, "") and "--webhook-port needs --webhook-cert-dir" in err
    code, out, err = run(capsys, "run", "--webhook-port", "9443", "--webhook-cert-dir", str(tmp_path))
    assert (code, out) == (2, "")
    assert f"--webhook-cert-dir {tmp_path}: no {tmp_path / 'tls.crt'} or {tmp_path / 'tls.key'}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("value", "why"),
    [("19", "too short for kopf to renew a record in time"), ("3601", "too long"), ("1m", "not an integer")],
)
def test_run_refuses_a_peering_lifetime_kopf_cannot_keep(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str, why: str
) -> None:
    """One line naming the variable, the reason and the range, before any cluster is looked for."""
    monkeypatch.setenv("M3FLEET_PEERING_LIFETIME_SECONDS", value)
    code, out, err = run(capsys, "run")
    assert (code, out) == (2, "") and "Traceback" not in err
    assert f"M3FLEET_PEERING_LIFETIME_SECONDS={value!r} is {why}; set a whole number of seconds from 20 to 3600" in err


def test_run_refuses_a_peering_priority_that_is_not_a_number(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M3FLEET_PEERING_PRIORITY", "high")
    code, out, err = run(capsys, "run")
    assert (code, out) == (2, "") and "Traceback" not in err
    assert "M3FLEET_PEERING_PRIORITY='high' is not an integer; set a whole number, or unset it" in err


CACHE_SAMPLE = SAMPLES_DIR.parent / "cache" / "h200-bf16.yaml"


def test_plan_and_render_take_a_model_cache_in_the_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "plan", "-f", str(CACHE_SAMPLE), "-o", "json")
    [planned] = json.loads(out)
    assert code == 0 and (planned["modelCache"], planned["modelCacheNodeAffinity"]) == ("m3-bf16", "Preferred")
    assert "m3-bf16" in err and "MiniMaxM3ModelCache, validated; not planned" in err
    code, out, _ = run(capsys, "plan", "-f", str(CACHE_SAMPLE))
    assert code == 0 and "CACHE" in out.splitlines()[0] and "m3-bf16 (Preferred)" in out
    code, out, _ = run(capsys, "render", "-f", str(CACHE_SAMPLE))
    [workload] = [d for d in yaml.safe_load_all(out) if d["kind"] == "Deployment"]
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "model-cache",
        "hostPath": {"path": "/mnt/nvme/m3fleet/minimax-m3-bf16", "type": "DirectoryOrCreate"},
    } in volumes
    # Without the cache in the input, render cannot know its path: a clear error, nothing on stdout.
    deployment_only = CACHE_SAMPLE.read_text().split("---\n", 1)[1]
    code, out, err = run(capsys, "render", "-f", write(tmp_path, deployment_only))
    assert code == 2 and out == "" and "spec.model.cacheRef.name" in err and "same input" in err
    # An invalid cache is reported like any invalid resource.
    bad = CACHE_SAMPLE.read_text().replace("path: /mnt/nvme", "path: mnt/nvme")
    code, out, err = run(capsys, "plan", "-f", write(tmp_path, bad))
    assert code == 2 and out == "" and "spec.path" in err and "absolute" in err


def test_every_subcommand_shares_one_error_handling(capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input is exit 2 with one line, a bug exit 1 with one line and no traceback (M3FLEET_DEBUG unset)."""
    import os

    from m3fleet.documents import guarded
    from m3fleet.errors import SpecError

    def bad_input() -> int:
        raise SpecError("spec.replicas", "is negative", "give 0 or more")

    def bug() -> int:
        raise RuntimeError("boom")

    assert "M3FLEET_DEBUG" not in os.environ
    assert guarded(bad_input) == 2
    assert guarded(bug) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: spec.replicas: is negative; fix: give 0 or more",
        "internal error: RuntimeError: boom (set M3FLEET_DEBUG=1 for a traceback)",
    ]

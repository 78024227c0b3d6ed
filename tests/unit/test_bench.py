"""`m3fleet bench`: the Job (recipe defaults, client command lines, placement, Secrets), the checks that turn
bad input into exit 2, the result extraction and the summary table, and the dry run through the CLI.

The client command lines and the parsing are run against the real vLLM and SGLang clients in
tests/engine_parsers/test_bench_clients.py; this module holds the pure, fast part.
"""

from __future__ import annotations

import base64
import itertools
import json
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from m3fleet.api import parse_resource
from m3fleet.api.models import EngineName, MiniMaxM3Deployment, SecretKeyRef
from m3fleet.bench import job as bench_job
from m3fleet.bench import results, watch
from m3fleet.bench.job import BEGIN, END, Dataset, Prompts
from m3fleet.cli import main
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan
from m3fleet.render import labels, render, service_name
from tests.support.samples import K8S_VERSION, SAMPLE_FILES, SAMPLES_DIR, load_sample

# Real logs of the Job's script running vLLM's and SGLang's clients against the stand-in server, written by
# tests/engine_parsers/test_bench_clients.py --update-goldens (input 32, output 8, concurrency 1,4, 8 prompts).
FIXTURES = Path(__file__).resolve().parent.parent / "bench" / "fixtures"


def resource(path: Path) -> MiniMaxM3Deployment:
    return parse_resource(load_sample(path))


def sample(name: str) -> MiniMaxM3Deployment:
    return resource(SAMPLES_DIR / f"{name}.yaml")


def command_lines(job: dict[str, Any]) -> list[list[str]]:
    """The client invocations in the Job's script, as argv lists."""
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    return [shlex.split(line) for line in script.splitlines() if "--base-url" in line]


# --- the Job ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def test_every_sample_gets_a_valid_job_aimed_at_its_service(path: Path) -> None:
    r = resource(path)
    p = plan(r.spec)
    options = bench_job.options_for(EngineName(p.engine))
    job = bench_job.render_job(r, p, options, "20260101-120000")
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == p.image  # the engine's own image: the client ships in it
    env = {e["name"]: e.get("value") for e in container["env"]}
    # The engines' Service (a gatewayed fleet also has its endpoint picker's, which serves ext-proc, not the API).
    (service,) = [
        o for o in render(r, p) if o["kind"] == "Service" and "m3fleet.dev/endpoint-picker" not in o["spec"]["selector"]
    ]
    port = service["spec"]["ports"][0]["port"]
    assert service["metadata"]["name"] == service_name(r.metadata.name)
    assert env[bench_job.URL_ENV] == f"http://{service_name(r.metadata.name)}.{r.metadata.namespace}.svc:{port}"
    # Same pool as the engine pods: the image is pulled there and built for that architecture; no GPU asked for.
    deployment = next(o for o in render(r, p) if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    engine_pod = deployment["spec"].get("template") or deployment["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    for key in ("nodeSelector", "tolerations"):
        assert pod[key] == engine_pod["spec"][key], key
    engine_affinity = engine_pod["spec"].get("affinity", {})
    assert pod.get("affinity", {}).get("nodeAffinity") == engine_affinity.get("nodeAffinity")
    # Not the engine group's NVLink-domain pod affinity: the client needs no GPU, so any node of the pool will do.
    assert "podAffinity" not in pod.get("affinity", {})
    assert not any("gpu" in k for k in container["resources"]["limits"])
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    assert len(command_lines(job)) == len(options.concurrency)


def test_the_operator_never_prunes_bench_objects() -> None:
    """The operator prunes children by `owned_selector`; the Job and ConfigMap must not match it."""
    bench_labels = bench_job.labels("chat", "1")
    owned = dict(pair.split("=") for pair in labels.owned_selector("chat").split(","))
    assert not owned.items() <= bench_labels.items()
    assert bench_labels["m3fleet.dev/name"] == "chat"


def test_vllm_defaults_are_the_recipe_benchmark() -> None:
    r = sample("vllm-h200-tp8")
    job = bench_job.render_job(r, plan(r.spec), bench_job.options_for(EngineName.VLLM), "x")
    (argv,) = command_lines(job)
    assert argv[:3] == ["vllm", "bench", "serve"]
    flags = dict(itertools.pairwise(argv))
    assert flags["--backend"] == "vllm" and flags["--endpoint"] == "/v1/completions"
    assert flags["--model"] == "MiniMaxAI/MiniMax-M3" and flags["--dataset-name"] == "random"
    assert (flags["--random-input-len"], flags["--random-output-len"]) == ("2048", "1024")
    assert (flags["--max-concurrency"], flags["--num-prompts"]) == ("10", "100")
    assert "--save-result" in argv and flags["--result-filename"] == "concurrency-10.json"


def test_trtllm_defaults_are_the_guide_sweep() -> None:
    r = sample("trtllm-gb200-2x4-tep")
    options = bench_job.options_for(EngineName.TRTLLM)
    assert options.concurrency == (32, 64, 128, 256, 512, 1024)
    job = bench_job.render_job(r, plan(r.spec), options, "x")
    lines = command_lines(job)
    assert [line[line.index("--num-prompts") + 1] for line in lines] == ["160", "320", "640", "1280", "2560", "5120"]
    first = lines[0]
    assert first[:3] == ["python3", "-m", "tensorrt_llm.serve.scripts.benchmark_serving"]
    for flag in ("--random-ids", "--tokenize-on-client", "--ignore-eos"):
        assert flag in first
    assert first[first.index("--model") + 1] == "/models"  # trtllm-serve serves the model under its path
    assert first[first.index("--percentile-metrics") + 1] == "ttft,tpot,itl,e2el"


def test_sglang_uses_random_token_ids_of_exact_length() -> None:
    r = sample("sglang-h200-bf16-tp8")
    (argv,) = command_lines(bench_job.render_job(r, plan(r.spec), bench_job.options_for(EngineName.SGLANG), "x"))
    assert argv[:3] == ["python3", "-m", "sglang.benchmark.serving"]
    assert argv[argv.index("--backend") + 1] == "sglang-oai"
    assert argv[argv.index("--dataset-name") + 1] == "random-ids"  # "random" would download ShareGPT
    assert argv[argv.index("--random-range-ratio") + 1] == "1.0"
    assert argv[argv.index("--output-file") + 1] == "${M3FLEET_BENCH_RESULTS}/concurrency-10.jsonl"


def test_api_key_and_hugging_face_token_come_from_secrets() -> None:
    body = load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml")
    body["spec"]["model"]["source"] = {
        "huggingFace": {"tokenSecretRef": {"name": "hf", "key": "token"}, "cacheClaimName": "hf-cache"}
    }
    r = parse_resource(body)
    options = bench_job.options_for(EngineName.VLLM, api_key=SecretKeyRef(name="m3-key", key="api"))
    job = bench_job.render_job(r, plan(r.spec), options, "x")
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["OPENAI_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "m3-key", "key": "api"}}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env[bench_job.TOKENIZER_ENV]["value"] == "MiniMaxAI/MiniMax-M3"  # from the shared HF cache
    assert {"name": "hf-cache", "mountPath": "/hf-cache"} in container["volumeMounts"]
    assert "m3-key" not in json.dumps(job["metadata"]["labels"])


def test_job_names_fit_a_label_value() -> None:
    name = bench_job.job_name("a" * 253, "20260101-120000")
    assert len(name) <= 63 and name.endswith("-bench-20260101-120000")


def test_sharegpt_takes_a_path_and_no_input_length() -> None:
    options = bench_job.options_for(EngineName.VLLM, dataset=Dataset.SHAREGPT, dataset_path="/models/sg.json")
    assert (options.input_len, options.output_len) == (None, None)
    r = sample("vllm-h200-tp8")
    (argv,) = command_lines(bench_job.render_job(r, plan(r.spec), options, "x"))
    assert argv[argv.index("--dataset-path") + 1] == "/models/sg.json" and "--random-input-len" not in argv
    with pytest.raises(SpecErrors, match="--dataset-path: is required"):
        bench_job.options_for(EngineName.VLLM, dataset=Dataset.SHAREGPT)
    with pytest.raises(SpecErrors, match="--input-len: applies to --dataset random only"):
        bench_job.options_for(EngineName.VLLM, dataset=Dataset.SHAREGPT, dataset_path="p", input_len=5)


@pytest.mark.parametrize("text", ["0", "-1", "a", "10,0", "", "1.5"])
def test_bad_concurrency_is_refused(text: str) -> None:
    with pytest.raises(SpecError, match=r"--concurrency: .* is not a positive integer"):
        bench_job.parse_concurrency(text)


def test_prompts() -> None:
    assert Prompts.parse("100").at(32) == 100 and Prompts.parse("5x").at(32) == 160 and str(Prompts.parse("5X")) == "5x"
    for bad in ("0", "x", "0x", "-3", "five"):
        with pytest.raises(SpecError, match="--num-prompts"):
            Prompts.parse(bad)


def test_input_beyond_max_model_len_is_refused() -> None:
    r = sample("vllm-h200-tp8")
    options = bench_job.options_for(EngineName.VLLM, input_len=131072)
    with pytest.raises(
        SpecError, match=r"131072 \+ --output-len 1024 = 132096 tokens exceeds spec.context.maxModelLen"
    ):
        bench_job.check(r, plan(r.spec), options)


def test_api_key_secret_option() -> None:
    assert bench_job.parse_secret_ref("m3-key/token") == SecretKeyRef(name="m3-key", key="token")
    for bad in ("m3-key", "/k", "Bad_Name/k", "n/"):
        with pytest.raises(SpecError, match="--api-key-secret"):
            bench_job.parse_secret_ref(bad)


# --- results ---------------------------------------------------------------------------------------


def block(concurrency: int, payload: str) -> str:
    encoded = base64.encodebytes(payload.encode()).decode()
    return f"{BEGIN.format(concurrency=concurrency)}\n{encoded}{END}\n"


VLLM_RAW = {
    "completed": 100,
    "failed": 0,
    "num_prompts": 100,
    "duration": 50.0,
    "total_input_tokens": 204800,
    "total_output_tokens": 102400,
    "request_throughput": 2.0,
    "output_throughput": 2048.0,
    "total_token_throughput": 6144.0,
    "latencies": [0.5] * 100,
    **{
        f"{s}_{m}_ms": v
        for m in ("ttft", "tpot", "itl", "e2el")
        for s, v in (("mean", 1.0), ("median", 2.0), ("p99", 3.0))
    },
}


def test_extract_survives_progress_bars_and_split_lines() -> None:
    log = (
        "m3fleet-bench: run 1/1: concurrency 10, 100 prompts\n"
        "  0%|          | 0/100 [00:00<?, ?it/s]\r 50%|#####     | 50/100\r100%|##########| 100/100\n"
        + block(10, json.dumps(VLLM_RAW))
    )
    found = results.extract(log)
    assert found == {10: VLLM_RAW}
    runs, raw = results.runs_from_log(log, bench_job.options_for(EngineName.VLLM))
    assert runs[0].ttft == results.Stat(1.0, 2.0, 3.0) and runs[0].completed == 100
    assert "latencies" not in raw["10"] and raw["10"]["m3fleetDroppedPerRequestFields"] == ["latencies"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_real_client_logs_parse(engine: str) -> None:
    log = (FIXTURES / f"{engine}-standin.log").read_text()
    options = bench_job.options_for(
        EngineName(engine), input_len=32, output_len=8, concurrency=(1, 4), prompts=Prompts(8)
    )
    runs, raw = results.runs_from_log(log, options)
    assert raw.keys() == {"1", "4"} and raw["4"]["max_concurrency"] == 4
    assert [(r.concurrency, r.completed, r.failed, r.input_tokens, r.output_tokens) for r in runs] == [
        (1, 8, 0, 256, 64),
        (4, 8, 0, 256, 64),
    ]
    assert all(4.0 <= r.tpot.median < 40 for r in runs)  # the stand-in streams a token every 4 ms
    assert watch.progress(log) == "run 2/2: concurrency 4, 8 prompts: 100% (8/8)"
    assert "<<<" not in results.without_results(log) and "Serving Benchmark Result" in results.without_results(log)


def test_sglang_jsonl_and_its_key_names() -> None:
    raw = {k: v for k, v in VLLM_RAW.items() if k not in ("failed", "num_prompts", "total_token_throughput")}
    raw = {k.replace("e2el", "e2e_latency"): v for k, v in raw.items()} | {"total_throughput": 6144.0}
    log = block(10, json.dumps({"old": "line"}) + "\n" + json.dumps(raw) + "\n")  # appended JSON lines: the last wins
    (run,) = [results.summarize(10, 120, results.extract(log)[10])]
    assert (run.requests, run.failed, run.total_token_throughput, run.e2el.p99) == (120, 20, 6144.0, 3.0)


def test_malformed_results_are_reported() -> None:
    with pytest.raises(results.ResultError, match="not base64"):
        results.extract(f"{BEGIN.format(concurrency=1)}\n!!!\n{END}\n")
    with pytest.raises(results.ResultError, match="no mean_ttft_ms"):
        results.summarize(1, 1, {k: v for k, v in VLLM_RAW.items() if k != "mean_ttft_ms"})
    assert results.extract(f"{BEGIN.format(concurrency=1)}\nAAAA\n") == {}  # unfinished block: no run


def test_table_has_the_seeds_rows_per_concurrency() -> None:
    a = results.summarize(32, 160, VLLM_RAW)
    b = results.summarize(64, 320, VLLM_RAW | {"mean_ttft_ms": 12345.678})
    table = results.format_table([a, b]).splitlines()
    assert table[0] == "============ Serving Benchmark Result ============"
    assert table[1].split() == ["Max", "concurrency:", "32", "64"]
    for label in (
        "Successful requests:",
        "Benchmark duration (s):",
        "Total input tokens:",
        "Total generated tokens:",
        "Request throughput (req/s):",
        "Output token throughput (tok/s):",
        "Total Token throughput (tok/s):",
        "Mean TTFT (ms):",
        "Median TPOT (ms):",
        "P99 ITL (ms):",
        "P99 E2EL (ms):",
    ):
        assert any(line.startswith(label) for line in table), label
    assert "12345.68" in next(line for line in table if line.startswith("Mean TTFT"))
    assert "---------------Time to First Token----------------" in table


def test_document_round_trip_and_configmap() -> None:
    run = results.summarize(10, 100, VLLM_RAW)
    result = results.BenchResult(
        resource={"name": "chat", "namespace": "llm", "uid": "u"},
        job="chat-bench-1",
        target={"engine": "vllm"},
        parameters={},
        spec={},
        plan={},
        ready_replicas=1,
        started="t0",
        finished="t1",
        complete=True,
        runs=(run,),
        raw={"10": results.trim_raw(VLLM_RAW)},
    )
    owner = {"apiVersion": "m3fleet.dev/v1alpha1", "kind": "MiniMaxM3Deployment", "name": "chat", "uid": "u"}
    cm = results.config_map(result, owner, bench_job.labels("chat", "1"))
    kubernetes_validate.validate(cm, K8S_VERSION, strict=True)
    assert results.load(yaml.safe_dump(cm), "cm.yaml") == result
    assert results.load(json.dumps(result.to_document()), "r.json") == result
    with pytest.raises(SpecError, match="is not an m3fleet benchmark result"):
        results.load("{}", "x.json")


# --- watching ---------------------------------------------------------------------------------------


def test_progress_from_the_log_tail() -> None:
    tail = (
        "m3fleet-bench: run 1/2: concurrency 32, 160 prompts\n"
        " 10%|#         | 16/160 [00:10<01:30]\r 45%|####5     | 72/160\n"
        "m3fleet-bench: run 2/2: concurrency 64, 320 prompts\n"
    )
    assert watch.progress(tail) == "run 2/2: concurrency 64, 320 prompts: starting"
    assert (
        watch.progress(tail.rsplit("m3fleet-bench: run 2", 1)[0])
        == "run 1/2: concurrency 32, 160 prompts: 45% (72/160)"
    )
    assert watch.progress("Starting initial single prompt test run...") is None


def test_pod_that_cannot_start_is_fatal() -> None:
    missing = {
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"state": {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "k" not found'}}}
            ],
        }
    }
    assert watch.pod_state(missing).fatal == 'CreateContainerConfigError: secret "k" not found'
    pulling = {
        "status": {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}
    }
    assert watch.pod_state(pulling) == watch.PodState("Pending: ContainerCreating")


def test_ready_check() -> None:
    def m3d(status: str, observed: int = 2, generation: int = 2) -> dict[str, Any]:
        condition = {"type": "Ready", "status": status, "reason": "Progressing", "observedGeneration": observed}
        return {"metadata": {"generation": generation}, "status": {"conditions": [condition]}}

    assert watch.ready(m3d("True")) is None
    assert "not Ready (Progressing)" in (watch.ready(m3d("False")) or "")
    assert "generation 1 but the spec is at 2" in (watch.ready(m3d("True", observed=1)) or "")
    assert "no Ready condition" in (watch.ready({"status": {}}) or "")
    done = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}
    assert watch.job_outcome(done) == ("Failed", "DeadlineExceeded") and watch.job_outcome({}) is None


# --- the CLI, offline -------------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_prints_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys,
        "bench",
        "-f",
        str(SAMPLES_DIR / "vllm-h200-tp8.yaml"),
        "--dry-run",
        "--concurrency",
        "4,8",
        "-o",
        "json",
    )
    assert (code, err) == (0, "")
    listed = json.loads(out)  # a v1 List, as render prints: `kubectl apply -f -` reads it
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    (job,) = listed["items"]
    assert job["kind"] == "Job" and job["metadata"]["namespace"] == "llm"
    assert len(command_lines(job)) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "0"], "error: --concurrency: '0' is not a positive integer; fix: give one or more"),
        (["--input-len", "131072"], "error: --input-len: 131072 + --output-len 1024 = 132096 tokens exceeds"),
        (["--num-prompts", "0"], "error: --num-prompts: '0' is not a positive count"),
        (["--api-key-secret", "nokey"], "error: --api-key-secret: 'nokey' is not NAME/KEY"),
        (["-n", "other"], "error: -n: other differs from the file's metadata.namespace llm"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    # Without --dry-run too: every one of these is refused before any cluster is contacted.
    for dry in ([], ["--dry-run"]):
        code, out, err = run_cli(capsys, "bench", "-f", str(SAMPLES_DIR / "vllm-h200-tp8.yaml"), *argv, *dry)
        assert (code, out) == (2, "") and err.startswith(message) and err.count("\n") == 1, err


def test_bench_takes_one_resource(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "bench", "-f", str(SAMPLES_DIR), "--dry-run")
    assert (code, out) == (2, "") and "bench takes exactly one MiniMaxM3Deployment" in err

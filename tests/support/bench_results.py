"""`m3fleet bench` results for the tests: made up (`run`, `measured`) or parsed from the real vLLM client's output
against the stand-in server (tests/bench/fixtures)."""

from __future__ import annotations

from pathlib import Path

from m3fleet.api import parse_resource
from m3fleet.api.models import EngineName
from m3fleet.bench import job as bench_job
from m3fleet.bench import results
from m3fleet.planner import plan
from tests.support.samples import ROOT, SAMPLES_DIR, load_sample

FIXTURES = ROOT / "tests" / "bench" / "fixtures"
SAMPLE = SAMPLES_DIR / "vllm-h200-tp8.yaml"


def stat(mean: float, median: float, p99: float) -> results.Stat:
    return results.Stat(mean, median, p99)


def run(concurrency: int, tpot_ms: float, ttft_ms: float, prompt: int = 2048, output: int = 1024) -> results.RunSummary:
    n = 100
    return results.RunSummary(
        concurrency=concurrency,
        requests=n,
        completed=n,
        failed=0,
        duration_s=100.0,
        input_tokens=n * prompt,
        output_tokens=n * output,
        request_throughput=1.0,
        output_throughput=1024.0,
        total_token_throughput=3072.0,
        ttft=stat(ttft_ms, ttft_ms, 2 * ttft_ms),
        tpot=stat(tpot_ms, tpot_ms, 2 * tpot_ms),
        itl=stat(tpot_ms, tpot_ms, 2 * tpot_ms),
        e2el=stat(1.0, 1.0, 1.0),
    )


def measured(runs: list[results.RunSummary], path: Path = SAMPLE, replicas: int = 1) -> results.BenchResult:
    resource = parse_resource(load_sample(path))
    p = plan(resource.spec)
    return results.BenchResult(
        resource={"name": resource.metadata.name, "namespace": resource.metadata.namespace, "uid": "u"},
        job=f"{resource.metadata.name}-bench-1",
        target={"client": bench_job.CLIENTS[EngineName(p.engine)]},
        parameters={},
        spec=resource.spec.model_dump(by_alias=True, mode="json"),
        plan=p.model_dump(by_alias=True, mode="json"),
        ready_replicas=replicas,
        started="2026-01-01T00:00:00+00:00",
        finished="2026-01-01T00:10:00+00:00",
        complete=True,
        runs=tuple(runs),
        raw={},
    )


def measured_from_fixture() -> results.BenchResult:
    """The figures vLLM's client measured against the stand-in server (fixture), as `m3fleet bench` keeps them."""
    log = (FIXTURES / "vllm-standin.log").read_text()
    options = bench_job.options_for(
        EngineName.VLLM, input_len=32, output_len=8, concurrency=(1, 4), prompts=bench_job.Prompts(8)
    )
    runs, _ = results.runs_from_log(log, options)
    return measured(runs)

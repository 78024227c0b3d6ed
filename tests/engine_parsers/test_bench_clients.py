"""`m3fleet bench` against the engines' real benchmark clients: the pinned vLLM's `vllm bench serve` and
SGLang's `sglang.benchmark.serving`, run on the CPU from the engine-parser tier's venvs.

Each test renders the benchmark Job for a sample and runs the Job's own shell script, unchanged, against a
stand-in OpenAI-compatible server on 127.0.0.1 (standin.py) that streams tokens with known delays, with the
container's environment except the URL, the tokenizer (a tiny word-level one made offline) and the result
directory. Its output, stdout and stderr interleaved as a container log is, goes through the same parsing
`m3fleet bench` applies to the Job's log. Like the rest of this tier, these tests fail (never skip) when the
venvs are missing, and `M3FLEET_SKIP_ENGINE_PARSERS=1` skips them.

`--update-goldens` rewrites tests/bench/fixtures/<engine>-standin.log from these runs: real client output
that tests/unit/test_bench.py parses without the venvs.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from m3fleet.api import parse_resource
from m3fleet.api.models import EngineName, SecretKeyRef
from m3fleet.bench import job as bench_job
from m3fleet.bench import results
from m3fleet.planner import plan
from tests.support.engines import runner
from tests.support.engines.standin import StandIn, Timing
from tests.support.engines.tier import needs_engines, require_engines
from tests.support.samples import ROOT, SAMPLES_DIR, load_sample

pytestmark = [pytest.mark.engine_parsers, needs_engines]

SAMPLES = {"vllm": "vllm-h200-tp8", "sglang": "sglang-h200-bf16-tp8"}
FIXTURES = ROOT / "tests" / "bench" / "fixtures"
TINY_TOKENIZER = Path(runner.__file__).with_name("tiny_tokenizer.py")
INPUT_LEN, OUTPUT_LEN, CONCURRENCY, PROMPTS = 32, 8, (1, 4), 8
KEY = "m3fleet-test-key"
TIMING = Timing(first_token_s=0.010, per_prompt_token_s=0.0001, inter_token_s=0.004)
TIMEOUT_S = 600  # importing vLLM alone takes 7-30 s per run on a loaded 2-core box
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def pythons() -> dict[str, str]:
    require_engines()
    found = runner.find_engine_pythons()
    assert found is not None
    return found


@pytest.fixture(scope="module")
def tokenizer(pythons: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    env = {**os.environ, **OFFLINE}
    subprocess.run([pythons["vllm"], str(TINY_TOKENIZER), str(directory)], check=True, env=env, timeout=TIMEOUT_S)
    return directory


@dataclass
class JobRun:
    returncode: int
    log: str
    server: StandIn
    options: bench_job.BenchOptions


def run_job_script(
    engine: str,
    python: str,
    tokenizer: Path,
    tmp_path: Path,
    client_key: str,
    prompts: int = PROMPTS,
    concurrency: tuple[int, ...] = CONCURRENCY,
) -> JobRun:
    """Render the sample's benchmark Job and run its container command against the stand-in server."""
    resource = parse_resource(load_sample(SAMPLES_DIR / f"{SAMPLES[engine]}.yaml"))
    p = plan(resource.spec)
    options = bench_job.options_for(
        EngineName(engine),
        input_len=INPUT_LEN,
        output_len=OUTPUT_LEN,
        concurrency=concurrency,
        prompts=bench_job.Prompts(prompts),
        api_key=SecretKeyRef(name="m3-api-key", key="token"),
    )
    (container,) = bench_job.render_job(resource, p, options, "test")["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    # The image's `vllm` and `python3`, here the engine venv's interpreter (console scripts in these venvs
    # hold the build directory's path).
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "vllm").write_text(f'#!/bin/sh\nexec {python} -m vllm.entrypoints.cli.main "$@"\n')
    (shims / "python3").write_text(f'#!/bin/sh\nexec {python} "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    job_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert {e["name"] for e in container["env"] if "valueFrom" in e} == {bench_job.API_KEY_ENV}
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}  # loopback, never a proxy
    with StandIn(p.checkpoint, api_key=KEY, timing=TIMING) as server:
        env.update(job_env)
        env.update(OFFLINE)
        env.update(
            {
                "PATH": f"{shims}:{os.environ['PATH']}",
                "NO_PROXY": "127.0.0.1,localhost",
                "VLLM_TARGET_DEVICE": "cpu",  # vLLM's import needs a device; CPU here, the image's GPU in a cluster
                bench_job.URL_ENV: server.url,
                bench_job.TOKENIZER_ENV: str(tokenizer),
                bench_job.RESULTS_ENV: str(tmp_path / "results"),
                bench_job.API_KEY_ENV: client_key,  # what the Secret holds, as the kubelet would set it
            }
        )
        proc = subprocess.run(
            container["command"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # one stream, as a container log is
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    return JobRun(proc.returncode, proc.stdout, server, options)


@pytest.mark.parametrize("engine", sorted(SAMPLES))
def test_real_client_output_parses_into_the_table(
    engine: str, pythons: dict[str, str], tokenizer: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run = run_job_script(engine, pythons[engine], tokenizer, tmp_path, KEY)
    assert run.returncode == 0, run.log[-5000:]
    runs, raw = results.runs_from_log(run.log, run.options)
    assert [r.concurrency for r in runs] == list(CONCURRENCY), run.log[-5000:]
    stats = run.server.stats
    assert stats.unauthorized == [] and stats.most_in_flight <= max(CONCURRENCY)
    assert set(stats.prompt_tokens) == {INPUT_LEN}  # the random dataset's prompts are exactly --input-len tokens
    for r in runs:
        assert (r.requests, r.completed, r.failed) == (PROMPTS, PROMPTS, 0)
        assert (r.input_tokens, r.output_tokens) == (PROMPTS * INPUT_LEN, PROMPTS * OUTPUT_LEN)
        # The stand-in's delays, measured by the client (upper bounds loose: a shared 2-core machine).
        itl_ms, ttft_ms = (
            1000 * TIMING.inter_token_s,
            1000 * (TIMING.first_token_s + TIMING.per_prompt_token_s * INPUT_LEN),
        )
        # A CPU-starved client reads the first token late and the tokens buffered meanwhile at once, so its TPOT and
        # ITL may fall under the stand-in's delay (3.5 ms against 4 seen on a loaded machine): the lower bound
        # catches a unit error, the whole request carries the delays (it cannot end before the stand-in has slept).
        assert itl_ms * 0.25 <= r.tpot.median <= itl_ms * 10
        assert itl_ms * 0.25 <= r.itl.median <= itl_ms * 10
        assert r.e2el.median >= 0.9 * (ttft_ms + (OUTPUT_LEN - 1) * itl_ms)
        assert ttft_ms * 0.9 <= r.ttft.median <= ttft_ms * 20
        # A request's latency is its TTFT plus (outputs - 1) x its TPOT; that holds for the means, not the medians.
        assert r.ttft.median <= r.ttft.p99 and r.e2el.mean >= r.ttft.mean + (OUTPUT_LEN - 1) * r.tpot.mean * 0.9
        assert r.request_throughput == pytest.approx(r.completed / r.duration_s, rel=0.01)
        assert r.output_throughput == pytest.approx(r.output_tokens / r.duration_s, rel=0.01)
    assert raw.keys() == {str(c) for c in CONCURRENCY}
    assert results.problems(runs) == []
    table = results.format_table(runs)
    assert "Mean TTFT (ms):" in table and table.splitlines()[1].split()[-2:] == ["1", "4"]
    if request.config.getoption("--update-goldens"):
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / f"{engine}-standin.log").write_text(run.log)


def test_a_wrong_api_key_is_reported_not_tabled(pythons: dict[str, str], tokenizer: Path, tmp_path: Path) -> None:
    """vLLM's client exits 0 when every request was refused; m3fleet bench must not present that as a result.
    One run (concurrency 1) shows it: a second would import vLLM again (20-60 s) to refuse the same requests."""
    run = run_job_script("vllm", pythons["vllm"], tokenizer, tmp_path, "not-the-key", prompts=2, concurrency=(1,))
    runs, _ = results.runs_from_log(run.log, run.options)
    assert [r.concurrency for r in runs] == [1], run.log[-5000:]
    assert run.server.stats.unauthorized and all(r.completed == 0 for r in runs)
    problems = results.problems(runs)
    assert problems and problems[0].startswith("concurrency 1: all 2 requests failed")

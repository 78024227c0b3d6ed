"""The adapters against a real Prometheus scraping engine-format metrics, and the decisions they lead to.

One Prometheus for the module scrapes every scripted scenario at once (1 s interval), each target
labelled with its `scenario` and `pod`; the adapters read them back through their own HTTP client.
The exposition text follows each pinned engine's own metrics code (see prom.py), in the shapes that
matter for combining per-rank series: vLLM TP8 (one engine) and DP8 (eight engines, one pod),
SGLang TP8 with every scheduler reporting (eight repeats of one pool) and DP8 with DP attention
(eight pools), TensorRT-LLM with and without its block size. Plus steady chat, a long-context
burst, a metrics outage (targets answer 503) and Prometheus itself unreachable. And an inference gateway's
endpoint picker (Gateway API Inference Extension) recording request sizes per model as requests arrive.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from m3fleet.api.models import SloSpec
from m3fleet.autoscaling import slo
from m3fleet.autoscaling.policy import Action, Decision, PolicyConfig, PolicyState, decide
from m3fleet.autoscaling.prometheus import PrometheusAdapter, PrometheusHttp
from m3fleet.autoscaling.promql import Gateway
from m3fleet.autoscaling.signals import FleetState, MetricsSnapshot
from tests.support.autoscaling.plans import config
from tests.support.autoscaling.prom import (
    GIE_REQUEST_SIZES,
    EngineState,
    GatewayLoad,
    MetricsServer,
    prometheus,
    sglang_text,
    trtllm_text,
    vllm_text,
    wait_for,
)
from tests.support.ports import free_port

pytestmark = pytest.mark.prometheus

WINDOW = 4.0  # rate and histogram window: a few 1 s scrapes fit in it

STEADY = EngineState(
    running=32,
    waiting=0,
    kv_usage=0.7,
    capacity_tokens=480_000,
    prompt_tokens_rate=16_000,
    generation_tokens_rate=1_600,
    request_rate=4,
    prompt_tokens=4_000,
)
BURST = EngineState(
    running=4,
    waiting=40,
    kv_usage=0.95,
    capacity_tokens=1_600_000,
    prompt_tokens_rate=60_000,
    generation_tokens_rate=80,
    request_rate=0.2,
    prompt_tokens=300_000,
    ttft_seconds=30,
)
POOLED = EngineState(  # a replica of eight KV pools (or one pool repeated by eight ranks)
    running=16,
    waiting=8,
    kv_usage=0.5,
    capacity_tokens=800_000,
    prompt_tokens_rate=8_000,
    generation_tokens_rate=900,
    request_rate=3,
    prompt_tokens=2_500,
)
TRTLLM = EngineState(
    running=20,
    waiting=1,
    kv_usage=0.25,
    capacity_tokens=1_320_192,
    prompt_tokens_rate=12_000,
    generation_tokens_rate=1_000,
    request_rate=2,
    prompt_tokens=6_000,
)

M3, OTHER, BURSTING = "MiniMaxAI/MiniMax-M3", "another-model", "MiniMaxAI/MiniMax-M3-burst"
GATEWAY = GatewayLoad({M3: (0.5, 40_000), OTHER: (3.0, 2_000), BURSTING: (0.5, 20_000)})

# (scenario, pod) -> route; every route is one scrape job.
TARGETS = {
    ("steady", "steady-0"): lambda t: (200, vllm_text(STEADY, t)),
    ("steady", "steady-1"): lambda t: (200, vllm_text(STEADY, t)),
    ("vllm-dp8", "vllm-dp8-0"): lambda t: (200, vllm_text(POOLED, t, dp=8)),
    ("burst", "burst-0"): lambda t: (200, vllm_text(BURST, t)),
    ("outage", "outage-0"): lambda t: (503, "engine restarting\n"),
    ("outage", "outage-1"): lambda t: (503, "engine restarting\n"),
    ("sglang-tp8", "sglang-tp8-0"): lambda t: (200, sglang_text(POOLED, t, tp=8, dp=1)),
    ("sglang-dp8", "sglang-dp8-0"): lambda t: (200, sglang_text(POOLED, t, tp=8, dp=8)),
    # One DP8 replica over two nodes (a LeaderWorkerSet group): the leader pod m3-0 and its worker m3-0-1 each
    # export their own four DP ranks; only the leader runs the tokenizer.
    ("sglang-2n", "m3-0"): lambda t: (200, sglang_text(POOLED, t, tp=8, dp=8, nodes=2, node_rank=0)),
    ("sglang-2n", "m3-0-1"): lambda t: (200, sglang_text(POOLED, t, tp=8, dp=8, nodes=2, node_rank=1)),
    ("sglang-2n-down", "m3x-0"): lambda t: (200, sglang_text(POOLED, t, tp=8, dp=8, nodes=2, node_rank=0)),
    ("sglang-2n-down", "m3x-0-1"): lambda t: (503, "worker restarting\n"),
    ("trtllm", "trtllm-0"): lambda t: (200, trtllm_text(TRTLLM, t, tokens_per_block=64)),
    ("trtllm-noblock", "trtllm-noblock-0"): lambda t: (200, trtllm_text(TRTLLM, t, export_block_size=False)),
    ("gateway", "epp-0"): lambda t: (200, GATEWAY.text()),
}


def _config(port: int) -> str:
    jobs = []
    for scenario, pod in TARGETS:
        jobs.append(
            f"  - job_name: {pod}\n"
            f"    metrics_path: /{scenario}/{pod}/metrics\n"
            f"    static_configs:\n"
            f"      - targets: ['127.0.0.1:{port}']\n"
            f"        labels: {{scenario: {scenario}, pod: {pod}}}\n"
        )
    return "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n" + "".join(jobs)


def adapter(
    url: str, engine: str, scenario: str, gateway: Gateway | None = None, workers_of: str | None = None
) -> PrometheusAdapter:
    return PrometheusAdapter.for_engine(
        engine,
        url,
        selector={"scenario": scenario},
        rate_window=WINDOW,
        histogram_window=WINDOW,
        gateway=gateway,
        workers_of=workers_of,
    )


def gateway_for(model: str) -> Gateway:
    return Gateway(GIE_REQUEST_SIZES, (("model_name", model),))


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    routes = {f"/{scenario}/{pod}/metrics": route for (scenario, pod), route in TARGETS.items()}
    with MetricsServer(routes) as server, prometheus(tmp_path_factory.mktemp("prom"), _config(server.port)) as url:
        client = PrometheusHttp(url)
        covered = f"count(count_over_time(up[{WINDOW + 1:g}s]) >= {WINDOW + 1:g})"

        def scraped_long_enough() -> bool:
            # rate() under-reports until a series spans its whole window (extrapolation at series start),
            # so wait for every target to have been scraped for longer than the window. Prometheus's
            # first scrape lands ~5 s after start.
            result = client.custom_query(covered)
            return bool(result) and int(float(result[0]["value"][1])) == len(TARGETS)

        wait_for(scraped_long_enough, timeout=40, what="Prometheus to scrape every target for a whole window")
        yield url


def _decide(
    snapshot: MetricsSnapshot,
    current: int,
    max_model_len: int = 131072,
    policy: PolicyConfig | None = None,
    state: PolicyState | None = None,
) -> tuple[Action, int, Decision]:
    fleet = FleetState(now=snapshot.time, current_replicas=current, ready_replicas=current)
    decision, _ = decide(policy or config(max_model_len), state or PolicyState(), snapshot, fleet)
    return decision.action, decision.desired_replicas, decision


def test_steady_chat_reads_every_signal_and_holds(prom: str) -> None:
    snapshot = adapter(prom, "vllm", "steady").read()
    assert snapshot.error is None
    assert [r.replica for r in snapshot.replicas] == ["steady-0", "steady-1"]
    for r in snapshot.replicas:
        assert r.up and r.running == 32 and r.waiting == 0 and r.kv_usage == pytest.approx(0.7)
        assert r.kv_capacity_tokens == 480_000 and r.kv_ranks == 1  # kv_cache_size_tokens of its one engine
        assert r.prompt_tokens_rate == pytest.approx(16_000, rel=0.2)
        assert r.first_token_rate == pytest.approx(4, rel=0.2)
        assert r.finished_rate == pytest.approx(4, rel=0.2)
        assert r.prompt_tokens is not None and r.prompt_tokens.mean() == pytest.approx(4_000)
        assert r.sample_time is not None and snapshot.time - r.sample_time < 5
    action, desired, decision = _decide(snapshot, current=2, policy=config(kv_tokens_per_replica=480_000))
    assert (action, desired) == (Action.HOLD, 2), decision
    assert decision.warnings == ()


def test_vllm_dp8_sums_engines_and_counts_the_summed_blocks_once(prom: str) -> None:
    (r,) = adapter(prom, "vllm", "vllm-dp8").read().replicas
    assert (r.running, r.waiting, r.kv_ranks) == (16, 8, 8)
    # Eight engines of 100k tokens each: kv_cache_size_tokens per engine, summed once per engine. (Summing
    # num_gpu_blocks x block_size over the eight series would read 64x, as the frontend already summed it.)
    assert r.kv_capacity_tokens == 8 * 100_000 and r.kv_capacity_tokens_per_rank == 100_000
    assert r.kv_used_tokens == pytest.approx(400_000) and r.kv_usage == pytest.approx(0.5)


def test_long_context_burst_scales_up_at_once(prom: str) -> None:
    snapshot = adapter(prom, "vllm", "burst").read()
    (r,) = snapshot.replicas
    assert r.waiting == 40 and r.kv_capacity_tokens == 1_600_000
    assert r.prompt_tokens is not None and r.prompt_tokens.mean() == pytest.approx(300_000)
    action, desired, decision = _decide(snapshot, current=1, max_model_len=1_048_576)
    assert action == Action.SCALE_UP and desired >= 3, decision
    assert decision.panic  # need >= 2x the one ready replica: no waiting for the step limit
    assert decision.terms["prefillReplicas"] >= 2.0


def test_slo_attainment_is_read_from_the_engines_per_request_histograms(prom: str) -> None:
    # Steady: 4k-token prompts, every TTFT 0.5 s. At 40k tokens/s the default bound is 2 + 1.5 x 0.1 = 2.15 s,
    # counted up to vLLM's 1.0 s boundary: every request.
    steady = slo.measure(SloSpec(), adapter(prom, "vllm", "steady").read().replicas, 40_000, WINDOW)
    assert steady.mean_prompt_tokens == pytest.approx(4_000)
    assert steady.ttft.bound_seconds == pytest.approx(2.15) and steady.ttft.bucket_seconds == 1.0
    assert steady.requests == pytest.approx(2 * 4 * WINDOW, rel=0.3)  # two replicas at 4 requests/s
    assert steady.ttft.attainment == pytest.approx(1.0) and steady.to_status()["ttft"]["met"] is True
    assert steady.itl == slo.ITL_RELATIVE  # the default ITL bound: relative to an idle decode step
    # The burst: 300k-token prompts waiting 30 s. Bound 2 + 1.5 x 7.5 = 13.25 s, counted to 10 s: none met.
    burst = adapter(prom, "vllm", "burst").read().replicas
    missed = slo.measure(SloSpec(), burst, 40_000, WINDOW)
    assert missed.ttft.bucket_seconds == 10.0 and missed.ttft.attainment == 0.0
    assert missed.to_status()["ttft"]["met"] is False
    # A user who allows 45 s whatever the prompt and 40 ms per token: TTFT counted to the 40 s boundary, every
    # request; each request's 30 ms per output token (vllm:request_time_per_output_token_seconds) counted to 25 ms:
    # none; at 50 ms, all.
    patient = {"ttft": {"seconds": 45, "unloadedPrefillFactor": 0}, "itl": {"seconds": 0.04, "unloadedFactor": 0}}
    met = slo.measure(SloSpec.model_validate(patient), burst, 40_000, WINDOW)
    assert met.ttft.bucket_seconds == 40.0 and met.ttft.attainment == pytest.approx(1.0)
    assert not isinstance(met.itl, str) and (met.itl.bucket_seconds, met.itl.attainment) == (0.025, 0.0)
    loose = SloSpec.model_validate({**patient, "itl": {"seconds": 0.05, "unloadedFactor": 0}})
    itl = slo.measure(loose, burst, 40_000, WINDOW).itl
    assert not isinstance(itl, str) and (itl.bucket_seconds, itl.attainment) == (0.05, pytest.approx(1.0))


def test_the_engines_prefill_time_is_read_per_replica(prom: str) -> None:
    # vllm:request_prefill_time_seconds and SGLang's sglang:per_stage_req_latency_seconds{stage="prefill_forward"}:
    # each steady request's 0.1 s from first scheduling to first token, summed over the DP engines' series like the
    # other histograms (SGLang's TP ranks repeat their pool's, and its decode stage's 2 s must not count); the chat
    # cap of the prefill throughput reads its mean.
    cases = [("vllm", "steady"), ("vllm", "vllm-dp8"), ("sglang", "sglang-tp8"), ("sglang", "sglang-dp8")]
    for engine, scenario in cases:
        for r in adapter(prom, engine, scenario).read().replicas:
            assert r.prefill_seconds is not None and r.prefill_seconds.count > 0, (scenario, r.replica)
            assert r.prefill_seconds.mean() == pytest.approx(0.1), (scenario, r.replica)
            assert r.prompt_tokens is not None
            assert r.prefill_seconds.count == pytest.approx(r.prompt_tokens.count), scenario  # the same requests
    # TensorRT-LLM exports no per-request prefill time: the signal is absent, not zero.
    assert {r.prefill_seconds for r in adapter(prom, "trtllm", "trtllm").read().replicas} == {None}


def test_metrics_outage_holds_and_never_scales_down(prom: str) -> None:
    snapshot = adapter(prom, "vllm", "outage").read()
    assert snapshot.error is None
    assert {r.replica: r.up for r in snapshot.replicas} == {"outage-0": False, "outage-1": False}
    action, desired, decision = _decide(snapshot, current=3)
    assert (action, desired) == (Action.HOLD, 3)
    assert "no fresh metrics" in decision.reason


def test_sglang_tp8_reads_one_pool_not_eight(prom: str) -> None:
    # --enable-metrics-for-all-schedulers: eight TP ranks repeat one pool's gauges.
    (r,) = adapter(prom, "sglang", "sglang-tp8").read().replicas
    assert (r.running, r.waiting, r.kv_ranks) == (16, 8, 1)
    assert (r.kv_used_tokens, r.kv_capacity_tokens, r.kv_capacity_tokens_per_rank) == (400_000, 800_000, 800_000)
    assert r.finished_rate == pytest.approx(3, rel=0.2)  # from e2e_request_latency_seconds_count
    assert r.prompt_tokens is not None and r.prompt_tokens.mean() == pytest.approx(2_500)


def test_sglang_dp8_sums_the_dp_ranks(prom: str) -> None:
    snapshot = adapter(prom, "sglang", "sglang-dp8").read()
    (r,) = snapshot.replicas
    assert (r.running, r.waiting, r.kv_ranks) == (16, 8, 8)
    assert (r.kv_capacity_tokens, r.kv_capacity_tokens_per_rank) == (800_000, 100_000)
    assert r.kv_used_tokens == 400_000 and r.kv_usage == pytest.approx(0.5)
    # The policy takes it as the plan's DP8 shape: no capacity mismatch.
    policy = config(kv_tokens_per_replica=800_000, kv_tokens_per_rank=100_000, ranks_per_replica=8)
    assert _decide(snapshot, current=1, policy=policy)[2].warnings == ()


def test_sglang_dp8_over_two_nodes_reads_the_workers_ranks_as_the_leaders_replica(prom: str) -> None:
    snapshot = adapter(prom, "sglang", "sglang-2n", workers_of="m3").read()
    (r,) = snapshot.replicas
    assert r.replica == "m3-0" and r.up
    assert (r.running, r.waiting, r.kv_ranks) == (16, 8, 8)
    assert (r.kv_capacity_tokens, r.kv_capacity_tokens_per_rank) == (800_000, 100_000)
    assert r.kv_used_tokens == 400_000
    assert r.finished_rate == pytest.approx(3, rel=0.2)  # the tokenizer's, on the leader only
    assert r.prompt_tokens is not None and r.prompt_tokens.mean() == pytest.approx(2_500)
    policy = config(kv_tokens_per_replica=800_000, kv_tokens_per_rank=100_000, ranks_per_replica=8)
    assert _decide(snapshot, current=1, policy=policy)[2].warnings == ()
    # Read as pods, the leader holds half the replica and the worker looks like a replica of its own.
    by_pod = {x.replica: x for x in adapter(prom, "sglang", "sglang-2n").read().replicas}
    assert set(by_pod) == {"m3-0", "m3-0-1"} and by_pod["m3-0"].kv_capacity_tokens == 400_000


def test_a_replica_whose_worker_pod_fails_its_scrape_is_not_up(prom: str) -> None:
    (r,) = adapter(prom, "sglang", "sglang-2n-down", workers_of="m3x").read().replicas
    assert r.replica == "m3x-0" and not r.up  # half its DP ranks unseen: the policy holds rather than misread it


def test_trtllm_adapter_counts_blocks_of_the_size_the_engine_exports(prom: str) -> None:
    (r,) = adapter(prom, "trtllm", "trtllm").read().replicas
    assert (r.running, r.waiting) == (20, 1)
    assert r.kv_capacity_tokens == pytest.approx(1_320_192)  # 20,628 blocks x 64 tokens
    assert r.kv_used_tokens == pytest.approx(0.25 * 1_320_192)
    assert r.first_token_rate == pytest.approx(2, rel=0.2)


def test_trtllm_without_a_block_size_has_no_token_capacity(prom: str) -> None:
    (r,) = adapter(prom, "trtllm", "trtllm-noblock").read().replicas
    assert r.kv_capacity_tokens is None and r.kv_used_tokens is None  # never a guessed block size
    assert r.kv_usage == pytest.approx(0.25)


def test_prometheus_unreachable_holds() -> None:
    snapshot = PrometheusAdapter.for_engine("vllm", f"http://127.0.0.1:{free_port()}", timeout_seconds=1).read()
    assert snapshot.error is not None and "prometheus at" in snapshot.error
    action, desired, decision = _decide(snapshot, current=2)
    assert (action, desired) == (Action.HOLD, 2)
    assert "metrics unavailable" in decision.reason


def test_no_series_means_no_replicas(prom: str) -> None:
    snapshot = adapter(prom, "vllm", "does-not-exist").read()
    assert snapshot.error is None and snapshot.replicas == ()
    action, desired, _ = _decide(snapshot, current=2)
    assert (action, desired) == (Action.HOLD, 2)


def test_gateway_request_sizes_are_read_for_the_fleets_model_only(prom: str) -> None:
    snapshot = adapter(prom, "vllm", "steady", gateway_for(M3)).read()
    g = snapshot.gateway
    assert g is not None and g.request_rate is not None and g.bytes_rate is not None
    assert g.request_rate == pytest.approx(0.5, rel=0.2)  # another model's 3 requests/s are not this fleet's
    assert g.bytes_rate == pytest.approx(0.5 * 40_000, rel=0.2)
    assert g.recent_bytes_rate == pytest.approx(0.5 * 40_000, rel=0.3)
    assert adapter(prom, "vllm", "steady").read().gateway is None  # none configured: none read
    missing = adapter(prom, "vllm", "steady", gateway_for("no-such-model")).read()
    assert missing.gateway is not None and missing.gateway.request_rate is None  # unknown, not zero
    # A label value is quoted, never PromQL: one written to close the selector matches nothing.
    injected = adapter(prom, "vllm", "steady", gateway_for('x"} or vector(7) or {a="')).read()
    assert injected.error is None and injected.gateway == missing.gateway
    policy = config(kv_tokens_per_replica=480_000)
    decision = _decide(snapshot, current=2, policy=policy)[2]  # the operator's first tick: not used yet
    assert decision.prefill["gateway"]["window"].startswith("not yet used: its series have answered for 0s")
    decision = _decide(snapshot, current=2, policy=policy, state=answering(snapshot))[2]
    assert decision.prefill["gateway"]["source"] == "measured"  # 40k bytes a request over 4k tokens a first token
    assert decision.prefill["gateway"]["bytesPerToken"] == pytest.approx(10.0, rel=0.2)


def answering(snapshot: MetricsSnapshot) -> PolicyState:
    """The state of an operator that has read this gateway for ten minutes (its series cover the rate window)."""
    return PolicyState(gateway_since=snapshot.time - 600)


def test_a_burst_at_the_gateway_scales_up_before_any_engine_sees_it(prom: str) -> None:
    source = adapter(prom, "vllm", "steady", gateway_for(BURSTING))
    GATEWAY.set(BURSTING, 0.6, 1_200_000)  # 0.6 requests/s of 300k-token prompts (at 4 bytes a token) start now

    def jumped() -> bool:
        # The last two samples show the jump, and most of the burst's bytes (the first sample after it can
        # hold a fraction of them, a need within the tolerance band of a busy machine's scrape timing).
        g = source.read().gateway
        return bool(
            g
            and g.recent_bytes_rate
            and g.bytes_rate
            and g.recent_bytes_rate >= max(2 * g.bytes_rate, 0.5 * 0.6 * 1_200_000)
        )

    wait_for(jumped, timeout=15, what="the gateway's last two samples to show the burst")
    snapshot = source.read()
    policy = config(kv_tokens_per_replica=480_000)
    action, desired, decision = _decide(snapshot, current=2, policy=policy, state=answering(snapshot))
    assert decision.prefill["gateway"]["window"] == "last two samples (a jump)"
    assert action == Action.SCALE_UP and desired > 2, decision.reason
    # The engines alone still say steady chat: no scale-up.
    without = _decide(adapter(prom, "vllm", "steady").read(), current=2, policy=config(kv_tokens_per_replica=480_000))
    assert without[0] == Action.HOLD

"""Disaggregated prefill/decode in the engine model: the KV transfer's cost and the hand-over to decode."""

from __future__ import annotations

from m3fleet.api.models import SloSpec
from m3fleet_simulator.disagg import (
    LINK_EFFICIENCY,
    LINKS,
    TRANSFER_SETUP_SECONDS,
    DecodeEngine,
    DisaggregatedSimulation,
    KvTransfer,
    aggregated,
    kv_bytes_per_token,
)
from m3fleet_simulator.fleet import PerfModel
from m3fleet_simulator.scenarios import Request
from tests.support.autoscaling.plans import sample_plan


def test_a_token_moves_its_whole_kv_and_the_index() -> None:
    assert (
        kv_bytes_per_token() == 60 * 2 * 4 * 128 * 2 + 57 * 128 * 2 == 137_472
    )  # BF16: K/V of 60 layers + the MSA index K


def test_transfer_time_is_bytes_over_the_workers_links() -> None:
    transfer = KvTransfer(137_472, "ib", gpus=8)
    assert transfer.bytes_per_second == 8 * 50e9 * LINK_EFFICIENCY
    assert abs(transfer.seconds(32_768) - (TRANSFER_SETUP_SECONDS + 32_768 * 137_472 / 280e9)) < 1e-12
    nvlink = KvTransfer(137_472, "nvlink", gpus=8).seconds(32_768) - TRANSFER_SETUP_SECONDS
    assert abs((transfer.seconds(32_768) - TRANSFER_SETUP_SECONDS) / nvlink - 18.0) < 1e-9  # 900 vs 50 GB/s per GPU
    assert LINKS["nvlink"][0] == 900e9


def simulate(requests: list[Request], link: str = "ib") -> DisaggregatedSimulation:
    plan = sample_plan()
    model = PerfModel.from_plan(plan)
    sim = DisaggregatedSimulation(
        (plan, model), (plan, model, 1), (plan, model, 1), requests, KvTransfer(137_472, link, 8), 60.0, SloSpec()
    )
    sim.begin()
    sim.advance(3600.0)
    return sim


def test_a_request_is_prefilled_sent_and_decoded_without_prefill_interference() -> None:
    plan = sample_plan()
    model = PerfModel.from_plan(plan)
    sim = simulate([Request(0, 0.0, 32_768, 100)])
    (done,) = sim.finished
    assert done.first_token is not None and done.finish is not None
    prefill = model.unloaded_prefill_seconds(32_768)
    transfer = KvTransfer(137_472, "ib", 8).seconds(32_768)
    assert abs(done.first_token - (prefill + transfer)) < 1e-6
    decode = sim.decode_workers[0].engines[0]
    assert isinstance(decode, DecodeEngine)
    assert decode.P == 0.0  # the decode worker never prefilled
    assert abs((done.finish - done.first_token) / 99 - model.unloaded_itl(32_768 + 0)) < 2e-4


def test_transfers_from_one_prefill_worker_queue_on_its_links() -> None:
    # two prompts prefilled one after the other; the second's transfer cannot start before the first's ends
    sim = simulate([Request(0, 0.0, 8_192, 10), Request(1, 0.0, 16, 10)], link="ib")
    first, second = sorted(sim.finished, key=lambda r: r.spec.rid)
    assert first.first_token is not None and second.first_token is not None
    assert second.first_token >= first.first_token + TRANSFER_SETUP_SECONDS - 1e-9


def test_aggregated_decoding_slows_while_a_prompt_is_prefilled_and_disaggregated_does_not() -> None:
    plan = sample_plan()
    model = PerfModel.from_plan(plan)
    # a long answer in flight while long prompts arrive behind it
    requests = [Request(0, 0.0, 1_000, 400)] + [Request(i, 0.5 + i, 60_000, 2) for i in range(1, 6)]
    agg = aggregated(plan, model, requests, 1, 60.0, SloSpec(), model)
    split = simulate(requests)
    long_answer = next(r for r in split.finished if r.spec.rid == 0)
    assert long_answer.first_token is not None and long_answer.finish is not None
    split_itl = (long_answer.finish - long_answer.first_token) / 399
    assert max(agg.itl) > 1.5 * split_itl

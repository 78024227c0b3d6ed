"""Disaggregated prefill/decode serving on the simulator's engine model, and its KV transfer cost. Pure, seeded.

A disaggregated fleet has `prefill` workers and `decode` workers (each a replica of its role's plan). A request is
prefilled on the prefill worker with the least prompt work queued, its KV is then sent to the decode worker with the
most free KV net of its queue, and decoded there:

* **prefill worker**: the engine model (fleet.Engine) given only the prompt: it prefills one prompt at a time,
  first come first served, in chunks of `token_budget`, with no decode to interleave.
* **KV transfer**: starts when the prompt's prefill is done (TensorRT-LLM and Dynamo hand the context's KV over after
  the context phase; no layer-by-layer streaming is assumed) and takes `KvTransfer.seconds(tokens)`: the token's
  whole KV (`KvTransfer.bytes_per_token`, from the catalog's KV layout) over the prefill worker's links, one transfer
  after another on them (FIFO). It does not stop the prefill worker computing the next prompt (the copy is done by
  the NIC / NVLink engines, not the SMs). The first token reaches the user when the KV has arrived: TTFT counts the
  transfer (conservative: TensorRT-LLM may return the context phase's token sooner).
* **decode worker**: admits a request once its KV has arrived and the whole sequence (prompt and output) fits in its
  pool (TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler), and decodes every admitted request each step, with
  no prefill chunk in its iterations: that is the interference disaggregation removes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from m3fleet.api.models import Plan, SloSpec
from m3fleet.autoscaling.signals import quantile
from m3fleet.catalog.facts import KV_LAYOUT
from m3fleet_simulator.fleet import PREFILL, Engine, PerfModel, Replica, SimRequest, SimSettings, Simulation, meets_slo
from m3fleet_simulator.scenarios import Request

GB: Final = 1e9


def kv_bytes_per_token(dtype_bytes: int = 2) -> int:
    """One token's whole KV (every layer's K and V for all KV heads, plus the MSA index K): what moves from a
    prefill worker to a decode worker whatever either side's TP. 137,472 B in BF16, from the catalog's KvLayout
    (MiniMax-M3's config.json and vLLM's M3 attention and indexer code)."""
    k = KV_LAYOUT
    return k.layers * 2 * k.kv_heads * k.head_dim * dtype_bytes + k.index_layers * k.index_dim * k.index_dtype_bytes


# Per-GPU one-direction link bandwidth, bytes/s (the vendors' published figures):
LINKS: Final[dict[str, tuple[float, str]]] = {
    # ConnectX-7: 400 Gb/s per port, one port per GPU in GB200 NVL72 and HGX systems (NVIDIA ConnectX-7 datasheet)
    "ib": (400e9 / 8, "InfiniBand / RoCE, ConnectX-7 400 Gb/s per GPU (NVIDIA ConnectX-7 datasheet)"),
    # NVLink 5: 1.8 TB/s per GPU, both directions together (NVIDIA GB200 NVL72 specifications)
    "nvlink": (1.8e12 / 2, "NVLink 5 within one NVL72 domain, 1.8 TB/s per GPU both ways (NVIDIA GB200 NVL72 specs)"),
}
LINK_EFFICIENCY: Final = 0.7  # achieved share of the line rate for large RDMA / NIXL writes (an assumption)
TRANSFER_SETUP_SECONDS: Final = 0.002  # per request: the decode side's allocation and the NIXL handshake (assumed)


@dataclass(frozen=True)
class KvTransfer:
    bytes_per_token: int
    link: str
    gpus: int  # the prefill worker's GPUs: each sends its own shard of every token over its own link

    @property
    def bytes_per_second(self) -> float:
        return LINKS[self.link][0] * self.gpus * LINK_EFFICIENCY

    def seconds(self, tokens: int) -> float:
        return TRANSFER_SETUP_SECONDS + tokens * self.bytes_per_token / self.bytes_per_second

    def describe(self) -> dict[str, Any]:
        return {
            "bytesPerToken": self.bytes_per_token,
            "bytesPerTokenSource": "the catalog's KvLayout (MiniMax-M3 config.json, vLLM's M3 code): 60 layers x K,V "
            "x 4 heads x 128 x 2 B + 57 index layers x 128 x 2 B, BF16",
            "link": LINKS[self.link][1],
            "linkGpus": self.gpus,
            "efficiency": LINK_EFFICIENCY,
            "effectiveGBPerSecond": round(self.bytes_per_second / GB, 1),
            "setupSecondsPerRequest": TRANSFER_SETUP_SECONDS,
            "overlap": "starts when the prompt's prefill ends (no layer-wise streaming); one transfer at a time per "
            "prefill worker; does not block the prefill worker's compute; counted in TTFT",
            "secondsAt": {f"{n // 1024}k": round(self.seconds(n), 4) for n in (8192, 32768, 131072)},
        }


class DecodeEngine(Engine):
    """A decode-only engine: requests arrive prefilled (their KV transferred) and join the batch when the whole
    sequence fits in the pool; no prefill chunk ever shares an iteration."""

    def _admit(self) -> None:
        limit = self.cap * (1.0 - self.m.watermark)
        while self.waiting and len(self.running) < self.m.max_num_seqs:
            r = self.waiting[0]
            if self.running and self.used() + r.spec.prompt + r.spec.output > limit:
                return  # FCFS: the head waits until its whole sequence fits
            self.waiting.popleft()
            self.queued_tokens -= r.need
            if r.admitted is None:
                r.admitted = self.t
            r.phase = PREFILL  # its prefill is done elsewhere: _start_decode puts it in the batch at once
            self.reserved += r.need
            self.running[r.spec.rid] = r
            self._start_decode(r, self.t)


@dataclass
class ServingResult:
    name: str
    gpus: int
    requests: int
    finished: int
    met: int
    ttft: list[float]
    itl: list[float]
    output_tokens: int
    makespan: float

    def to_dict(self) -> dict[str, Any]:
        def pct(values: list[float], q: float, digits: int) -> float | None:
            return round(quantile(values, q), digits) if values else None

        itl50 = pct(self.itl, 0.5, 5)
        return {
            "name": self.name,
            "gpus": self.gpus,
            "requests": self.requests,
            "finished": self.finished,
            "ttftP50": pct(self.ttft, 0.5, 3),
            "ttftP90": pct(self.ttft, 0.9, 3),
            "ttftP99": pct(self.ttft, 0.99, 3),
            "itlP50": itl50,
            "itlP90": pct(self.itl, 0.9, 5),
            "itlP99": pct(self.itl, 0.99, 5),
            "tokensPerSecondPerUser": round(1 / itl50, 1) if itl50 else None,
            "tokensPerSecondPerGpu": round(self.output_tokens / self.makespan / self.gpus, 1) if self.makespan else 0.0,
            "sloAttainment": round(self.met / self.requests, 4) if self.requests else None,
        }


def serving_result(name: str, sim: Simulation, gpus: int, requests: int, reference: PerfModel) -> ServingResult:
    """What the users saw; the SLO judged against `reference`'s unloaded times, the same for every fleet compared."""
    done = [r for r in sim.finished if r.first_token is not None and r.finish is not None]
    return ServingResult(
        name=name,
        gpus=gpus,
        requests=requests,
        finished=len(done),
        met=sum(1 for r in done if meets_slo(r, sim.slo, reference)),
        ttft=[r.first_token - r.spec.arrival for r in done if r.first_token is not None],
        itl=[(r.finish - r.first_token) / (r.spec.output - 1) for r in done if r.finish and r.first_token],
        output_tokens=sum(r.spec.output for r in done),
        makespan=max((r.finish or 0.0 for r in done), default=0.0),
    )


def aggregated(
    plan: Plan,
    model: PerfModel,
    requests: Sequence[Request],
    replicas: int,
    duration: float,
    slo: SloSpec,
    reference: PerfModel,
    name: str = "aggregated",
) -> ServingResult:
    """`replicas` aggregated replicas, fixed, with the fleet's router (most free KV net of the queue); the SLO is
    judged against `reference`'s unloaded times."""
    sim = Simulation(
        plan,
        model,
        requests,
        None,
        duration=duration,
        initial_replicas=replicas,
        cold_starts=(0.0,),
        measured_cold_starts=(0.0,),
        settings=SimSettings(scrape_seconds=600.0),
        slo=slo,
    )
    sim.run()
    return serving_result(name, sim, replicas * plan.gpus_per_replica, len(requests), reference)


class DisaggregatedSimulation(Simulation):
    """`prefill` workers of `prefill_plan` and `decode` workers of `decode_plan`; SLOs judged against `reference`
    (the aggregated replica's unloaded times, so both fleets answer to the same SLO)."""

    def __init__(
        self,
        reference: tuple[Plan, PerfModel],
        prefill: tuple[Plan, PerfModel, int],
        decode: tuple[Plan, PerfModel, int],
        requests: Sequence[Request],
        transfer: KvTransfer,
        duration: float,
        slo: SloSpec,
    ) -> None:
        plan, model = reference
        super().__init__(
            plan,
            model,
            requests,
            None,
            duration=duration,
            initial_replicas=0,
            cold_starts=(0.0,),
            measured_cold_starts=(0.0,),
            settings=SimSettings(scrape_seconds=600.0),
            slo=slo,
        )
        self.transfer = transfer
        self.prefill_plan, prefill_model, prefill_count = prefill
        self.decode_plan, decode_model, decode_count = decode
        self.prefill_workers = [
            self._worker(f"prefill-{i}", prefill_model, self.prefill_plan) for i in range(prefill_count)
        ]
        self.decode_workers = [
            self._worker(f"decode-{i}", decode_model, self.decode_plan, DecodeEngine) for i in range(decode_count)
        ]
        self.link_free = {w.name: 0.0 for w in self.prefill_workers}
        self.prompts: dict[int, tuple[Request, str]] = {}  # a prompt's id -> the user's request, its prefill worker

    def _worker(self, name: str, model: PerfModel, plan: Plan, kind: type[Engine] = Engine) -> Replica:
        replica = self._new_replica(0.0, name)
        replica.ready = True
        replica.engines = [kind(model, self, replica) for _ in range(max(1, plan.data_parallel_size))]
        return replica

    def _route(self, request: SimRequest) -> None:
        spec = request.spec
        prompt_only = SimRequest(Request(spec.rid, spec.arrival, spec.prompt, 1))
        engines = [e for w in self.prefill_workers for e in w.engines]
        # the prefill worker with the least prompt work ahead (Dynamo's KV router with nothing cached to reuse)
        engine = min(engines, key=lambda e: e.queued_tokens + e.prefill_left())
        self.prompts[spec.rid] = (spec, engine.replica.name)
        self._send(engine, prompt_only)

    def on_finish(self, r: SimRequest) -> None:
        prompt = self.prompts.pop(r.spec.rid, None)
        if prompt is None or prompt[0].output == 1:  # decoded, or nothing left to decode
            super().on_finish(r)
            return
        spec, worker = prompt
        start = max(self.now, self.link_free[worker])
        arrived = start + self.transfer.seconds(spec.prompt)
        self.link_free[worker] = arrived
        self._push(arrived, self.CALL, lambda: self._hand_over(spec, arrived))

    def _hand_over(self, spec: Request, arrived: float) -> None:
        request = SimRequest(spec)
        request.first_token = arrived
        request.produced = 1
        request.need = spec.prompt + 1
        engines = [e for w in self.decode_workers for e in w.engines]
        engine = max(engines, key=lambda e: e.cap - e.used() - e.queued_tokens)
        self._send(engine, request)

    def serving(self, name: str) -> ServingResult:
        gpus = len(self.prefill_workers) * self.prefill_plan.gpus_per_replica
        gpus += len(self.decode_workers) * self.decode_plan.gpus_per_replica
        return serving_result(name, self, gpus, len(self.requests), self.model)

"""Builders of engine signals for policy tests: round numbers, one replica at a time."""

from __future__ import annotations

from m3fleet.autoscaling.policy import PolicyConfig, PolicyState
from m3fleet.autoscaling.signals import FleetState, Histogram, MetricsSnapshot, ReplicaSignals, one_two_five_buckets

NOW = 1_800_000_000.0
MILLION = 1_000_000

# The state of a fleet the policy found a day ago: the found fleet's standing (policy/floors.py) has lapsed, so a
# test of another rule starts from it. `PolicyState()` is the policy's very first tick, where the fleet as found stands.
SETTLED = PolicyState(found=(NOW - 86_400.0, 1))

# A replica of one million KV tokens that prefills 100k prompt tokens/s; fixed prefill target 0.5.
ROUND = PolicyConfig(
    kv_tokens_per_replica=MILLION,
    kv_tokens_per_rank=MILLION,
    ranks_per_replica=1,
    max_model_len=MILLION,
    prefill_tokens_per_second=100_000,
    min_replicas=1,
    max_replicas=16,
    prefill_target=0.5,
    cold_start_seconds=585,  # + the 15 s interval = a 600 s horizon
)


def prompt_histogram(prompt_tokens: float, count: float, max_model_len: int = MILLION) -> Histogram:
    """`count` finished requests, every one with this prompt length (vLLM's 1-2-5 buckets)."""
    bounds = (*one_two_five_buckets(max_model_len), float("inf"))
    return Histogram(
        bounds=bounds,
        cumulative=tuple(count if prompt_tokens <= b else 0.0 for b in bounds),
        total=prompt_tokens * count,
        count=count,
    )


def replica(
    name: str = "r-0",
    *,
    running: float = 0,
    waiting: float = 0,
    kv_usage: float = 0.0,
    capacity: float | None = None,
    prompt_tokens: float | None = None,  # mean prompt length of recent requests
    request_rate: float = 0.0,  # first tokens / finished requests per second
    output_tokens: float = 200,
    sample_time: float = NOW,
    up: bool = True,
) -> ReplicaSignals:
    prompt_rate = None if prompt_tokens is None else prompt_tokens * request_rate
    histogram = (
        None if prompt_tokens is None or not request_rate else prompt_histogram(prompt_tokens, 60 * request_rate)
    )
    return ReplicaSignals(
        replica=name,
        up=up,
        sample_time=sample_time,
        kv_usage=kv_usage,
        kv_capacity_tokens=capacity,
        running=running,
        waiting=waiting,
        prompt_tokens_rate=prompt_rate,
        generation_tokens_rate=output_tokens * request_rate,
        first_token_rate=request_rate,
        finished_rate=request_rate,
        prompt_tokens=histogram,
    )


def replicas(n: int, **kwargs: object) -> tuple[ReplicaSignals, ...]:
    """`n` identical replicas (each with the given per-replica load)."""
    return tuple(replica(f"r-{i}", **kwargs) for i in range(n))  # type: ignore[arg-type]


def snapshot(*replicas: ReplicaSignals, queued: tuple[int, ...] = (), time: float = NOW) -> MetricsSnapshot:
    return MetricsSnapshot(engine="vllm", time=time, replicas=replicas, queued_request_tokens=queued)


def fleet(current: int, ready: int | None = None, starting: tuple[float, ...] = (), now: float = NOW) -> FleetState:
    return FleetState(
        now=now,
        current_replicas=current,
        ready_replicas=current - len(starting) if ready is None else ready,
        starting_ages=starting,
    )

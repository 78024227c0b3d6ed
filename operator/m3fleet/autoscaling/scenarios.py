"""Simulator workloads: seeded request streams and the scenarios built from them. Pure data + `random`.

Each scenario is sized so the perfect-foresight oracle meets the SLO for >= 99% of requests within
its `maxReplicas` (a test holds every scenario to that). Arrivals are Poisson per phase; prompt and
output lengths come from the distributions below. All draws use `random.Random` seeded from the
scenario seed plus a stream name, so every policy in one run sees the same requests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

MINUTE = 60.0


class Length(Protocol):
    def draw(self, rng: random.Random) -> int: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class LogNormal:
    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return int(min(self.high, max(self.low, round(rng.lognormvariate(math.log(self.median), self.sigma)))))

    def describe(self) -> str:
        return f"lognormal(median {self.median:g}, sigma {self.sigma:g}) in [{self.low}, {self.high}]"


@dataclass(frozen=True)
class LogUniform:
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return round(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))

    def describe(self) -> str:
        return f"log-uniform [{self.low}, {self.high}]"


@dataclass(frozen=True)
class Uniform:
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def describe(self) -> str:
        return f"uniform [{self.low}, {self.high}]"


@dataclass(frozen=True)
class Mixture:
    parts: tuple[tuple[float, Length], ...]

    def draw(self, rng: random.Random) -> int:
        x = rng.random()
        for weight, dist in self.parts:
            if x < weight:
                return dist.draw(rng)
            x -= weight
        return self.parts[-1][1].draw(rng)

    def describe(self) -> str:
        return " + ".join(f"{w:.0%} {d.describe()}" for w, d in self.parts)


@dataclass(frozen=True)
class Phase:
    """Requests arriving at `rate` per second in [start, end) with these length distributions."""

    start: float
    end: float
    rate: float
    prompt: Length
    output: Length
    label: str = ""

    def describe(self) -> dict[str, Any]:
        return {
            "fromMinute": round(self.start / MINUTE, 2),
            "toMinute": round(self.end / MINUTE, 2),
            "requestsPerSecond": self.rate,
            "promptTokens": self.prompt.describe(),
            "outputTokens": self.output.describe(),
            "label": self.label,
        }


@dataclass(frozen=True)
class Request:
    rid: int
    arrival: float
    prompt: int
    output: int


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration: float
    min_replicas: int
    max_replicas: int
    initial_replicas: int
    max_model_len: int | None  # None: the resource's own; else the scenario needs this context
    build_phases: Any = field(repr=False)  # (rng) -> list[Phase]; bursts are placed by the seed

    def phases(self, seed: int) -> list[Phase]:
        phases: list[Phase] = self.build_phases(random.Random(f"{seed}:{self.name}:phases"))
        return phases

    def requests(self, seed: int, duration: float | None = None) -> list[Request]:
        end = self.duration if duration is None else min(duration, self.duration)
        rng = random.Random(f"{seed}:{self.name}:requests")
        out: list[Request] = []
        for phase in self.phases(seed):
            t = phase.start
            while True:
                t += rng.expovariate(phase.rate)
                if t >= min(phase.end, end):
                    break
                out.append(Request(0, t, phase.prompt.draw(rng), phase.output.draw(rng)))
        out.sort(key=lambda r: r.arrival)
        return [Request(i, r.arrival, r.prompt, r.output) for i, r in enumerate(out)]


CHAT_PROMPT = LogNormal(median=3000, sigma=1.0, low=16, high=100_000)
CHAT_OUTPUT = LogNormal(median=250, sigma=0.6, low=1, high=4096)
# LongBench-like heavy tail: 100k-1M tokens, 5% at or above 500k (autoscaling.md §7.6 (c)).
LONG_PROMPT = Mixture(((0.95, LogUniform(100_000, 500_000)), (0.05, Uniform(500_000, 1_000_000))))
LONG_OUTPUT = LogNormal(median=400, sigma=0.7, low=1, high=8192)


def _steady_chat(rng: random.Random) -> list[Phase]:
    return [Phase(0, 60 * MINUTE, 5.0, CHAT_PROMPT, CHAT_OUTPUT, "chat")]


LONG_RATE = 0.5


def _long_context_burst(rng: random.Random) -> list[Phase]:
    # The same request rate throughout; only the prompts change, for minutes 20-30.
    return [
        Phase(0, 20 * MINUTE, LONG_RATE, CHAT_PROMPT, CHAT_OUTPUT, "chat"),
        Phase(20 * MINUTE, 30 * MINUTE, LONG_RATE, LONG_PROMPT, LONG_OUTPUT, "long-context burst"),
        Phase(30 * MINUTE, 60 * MINUTE, LONG_RATE, CHAT_PROMPT, CHAT_OUTPUT, "chat"),
    ]


BURSTY_BASE, BURSTY_PEAK = 2.0, 8.0


def _bursty(rng: random.Random) -> list[Phase]:
    """Chat at the base rate with five 2-4 minute bursts at the peak rate, one in each 11-minute slot."""
    phases: list[Phase] = []
    cursor = 0.0
    for slot in range(5):
        start = (4 + 11 * slot) * MINUTE + rng.uniform(0, 5 * MINUTE)
        length = rng.uniform(2 * MINUTE, 4 * MINUTE)
        phases.append(Phase(cursor, start, BURSTY_BASE, CHAT_PROMPT, CHAT_OUTPUT, "chat"))
        phases.append(Phase(start, start + length, BURSTY_PEAK, CHAT_PROMPT, CHAT_OUTPUT, "burst"))
        cursor = start + length
    phases.append(Phase(cursor, 60 * MINUTE, BURSTY_BASE, CHAT_PROMPT, CHAT_OUTPUT, "chat"))
    return phases


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="steady-chat",
            description="chat at a constant 5 requests/s for an hour",
            duration=60 * MINUTE,
            min_replicas=1,
            max_replicas=8,
            initial_replicas=2,
            max_model_len=None,
            build_phases=_steady_chat,
        ),
        Scenario(
            name="long-context-burst",
            description=(
                f"{LONG_RATE:g} requests/s throughout; for minutes 20-30 the prompts jump from chat length to "
                "100k-1M tokens"
            ),
            duration=60 * MINUTE,
            min_replicas=1,
            max_replicas=12,
            initial_replicas=1,
            max_model_len=1_048_576,
            build_phases=_long_context_burst,
        ),
        Scenario(
            name="bursty",
            description=f"chat at {BURSTY_BASE:g} requests/s with five 2-4 minute bursts at {BURSTY_PEAK:g}",
            duration=60 * MINUTE,
            min_replicas=1,
            max_replicas=10,
            initial_replicas=2,
            max_model_len=None,
            build_phases=_bursty,
        ),
    )
}


def describe_phases(phases: Sequence[Phase]) -> list[dict[str, Any]]:
    return [p.describe() for p in phases]

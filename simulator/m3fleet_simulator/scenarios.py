"""Simulator workloads: seeded request streams and the scenarios built from them. Pure data + `random`.

Each scenario is sized so a perfect-foresight schedule meets the SLO for >= 99% of requests within
its `maxReplicas`. Arrivals are Poisson per phase; prompt and output lengths come from the
distributions below. All draws use `random.Random` seeded from the scenario seed plus a stream name,
so every policy in one run sees the same requests. What a seed draws (burst time, length, rate,
length mix) is the scenario's hidden truth: `describe()` shows it in reports, no policy reads it.

A recurring scenario (`days` > 1) simulates the same time-of-day window on consecutive days; the
last day is the one measured, the earlier ones are what an autoscaler with memory saw before.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Protocol

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


class Workload(Protocol):
    """What a simulation runs on: a seeded `Scenario`, or a fixed `trace.Trace` (a user's requests, or the demand a
    resource recorded). `kind` names it in reports ("scenario", "trace")."""

    kind: ClassVar[str]

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def duration(self) -> float: ...
    @property
    def min_replicas(self) -> int: ...
    @property
    def max_replicas(self) -> int: ...
    @property
    def initial_replicas(self) -> int: ...
    @property
    def max_model_len(self) -> int | None: ...
    @property
    def days(self) -> int: ...
    @property
    def clock_start(self) -> float | None: ...

    def requests(self, seed: int, duration: float | None = None, day: int | None = None) -> list[Request]: ...

    def start_of_window(self, seed: int) -> float: ...

    def describe_workload(self, seed: int) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Scenario:
    kind: ClassVar[str] = "scenario"
    name: str
    description: str
    duration: float
    min_replicas: int
    max_replicas: int
    initial_replicas: int
    max_model_len: int | None  # None: the resource's own; else the scenario needs this context
    build_phases: Any = field(repr=False)  # (rng, day rng) -> list[Phase]; bursts are placed by the seed
    days: int = 1  # > 1: the same window on consecutive days; the last is measured
    window_start: Any = field(default=None, repr=False)  # (rng) -> seconds after midnight UTC of t = 0
    clock_start: float | None = None  # a scenario's calendar is the simulator's (whatif.EPOCH)

    def phases(self, seed: int, day: int | None = None) -> list[Phase]:
        """The phases of `day` (0-based; the measured, last day by default)."""
        day = self.days - 1 if day is None else day
        base = random.Random(f"{seed}:{self.name}:phases")
        phases: list[Phase] = self.build_phases(base, random.Random(f"{seed}:{self.name}:day{day}"))
        return phases

    def start_of_window(self, seed: int) -> float:
        """Seconds after midnight UTC at which each day's window opens (00:00 unless the scenario says)."""
        if self.window_start is None:
            return 0.0
        start: float = self.window_start(random.Random(f"{seed}:{self.name}:phases"))
        return start

    def describe_workload(self, seed: int) -> list[dict[str, Any]]:
        return describe_phases(self.phases(seed))

    def requests(self, seed: int, duration: float | None = None, day: int | None = None) -> list[Request]:
        day = self.days - 1 if day is None else day
        end = self.duration if duration is None else min(duration, self.duration)
        rng = random.Random(f"{seed}:{self.name}:requests" + (f":day{day}" if day != self.days - 1 else ""))
        out: list[Request] = []
        for phase in self.phases(seed, day):
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
LONG_OUTPUT = LogNormal(median=400, sigma=0.7, low=1, high=8192)


def _steady_chat(rng: random.Random, day: random.Random) -> list[Phase]:
    return [Phase(0, 60 * MINUTE, 5.0, CHAT_PROMPT, CHAT_OUTPUT, "chat")]


# Reasoning-style answers to short prompts: a sequence holds little KV (a few thousand tokens) for many steps, so
# an engine's batch of running sequences fills before its KV cache does.
SHORT_PROMPT = LogNormal(median=400, sigma=0.8, low=16, high=8192)
LONG_ANSWER = LogNormal(median=1500, sigma=0.5, low=64, high=8192)


def _long_answers(rng: random.Random, day: random.Random) -> list[Phase]:
    """Short prompts and long answers at a seeded 2-4 requests/s for an hour, doubling for a seeded 10-20 minutes:
    decode-bound, where speculative decoding's acceptance length sets how long each sequence holds its batch slot."""
    rate = rng.uniform(2.0, 4.0)
    start = rng.uniform(15, 35) * MINUTE
    end = start + rng.uniform(10, 20) * MINUTE
    return [
        Phase(0, start, rate, SHORT_PROMPT, LONG_ANSWER, "long answers"),
        Phase(start, end, 2 * rate, SHORT_PROMPT, LONG_ANSWER, "twice the rate"),
        Phase(end, 60 * MINUTE, rate, SHORT_PROMPT, LONG_ANSWER, "long answers"),
    ]


def _long_mix(rng: random.Random) -> Mixture:
    """A LongBench-like heavy tail whose upper end and share of >= 500k-token prompts the seed draws."""
    huge = rng.uniform(0.02, 0.08)
    top = round(rng.uniform(300_000, 500_000), -3)
    return Mixture(((1.0 - huge, LogUniform(100_000, int(top))), (huge, Uniform(500_000, 1_000_000))))


def _long_context_burst(rng: random.Random, day: random.Random) -> list[Phase]:
    """Chat at a seeded rate all hour; once, at a seeded minute and for a seeded length, the prompts jump
    to 100k-1M tokens at a seeded multiple of the rate (so a flat request count can hide it)."""
    rate = rng.uniform(0.35, 0.6)
    start = rng.uniform(8, 40) * MINUTE
    length = rng.uniform(6, 14) * MINUTE
    burst_rate = rate * rng.uniform(0.8, 1.4)
    mix = _long_mix(rng)
    return [
        Phase(0, start, rate, CHAT_PROMPT, CHAT_OUTPUT, "chat"),
        Phase(start, start + length, burst_rate, mix, LONG_OUTPUT, "long-context burst"),
        Phase(start + length, 60 * MINUTE, rate, CHAT_PROMPT, CHAT_OUTPUT, "chat"),
    ]


def _repeated_long_bursts(rng: random.Random, day: random.Random) -> list[Phase]:
    """Chat at a seeded rate all hour; from a seeded minute, two or three long-context bursts of 2-5 minutes each
    with 1-8 minutes of chat between them (count, lengths, gaps, rate and mix drawn from the seed): a team re-running
    its long documents, demand that comes back within minutes. The gaps span what a fleet may bridge: shorter ones
    than the five-minute scale-down window, and all shorter than three 3-6 minute cold starts, so releasing the first
    burst's replicas and cold-starting them again may not pay (the hold once measured on it: RESULTS.md)."""
    rate = rng.uniform(0.35, 0.6)
    start = rng.uniform(8, 25) * MINUTE
    burst_rate = rate * rng.uniform(0.8, 1.4)
    mix = _long_mix(rng)
    phases: list[Phase] = []
    cursor = 0.0
    for _ in range(rng.randint(2, 3)):
        end = start + rng.uniform(2, 5) * MINUTE
        phases.append(Phase(cursor, start, rate, CHAT_PROMPT, CHAT_OUTPUT, "chat"))
        phases.append(Phase(start, end, burst_rate, mix, LONG_OUTPUT, "long-context burst"))
        cursor, start = end, end + rng.uniform(1, 8) * MINUTE
    phases.append(Phase(cursor, 60 * MINUTE, rate, CHAT_PROMPT, CHAT_OUTPUT, "chat"))
    return phases


def _sporadic_long_prompts(rng: random.Random, day: random.Random) -> list[Phase]:
    """Chat at a seeded rate all hour, with a long prompt from the long-context mix every few minutes on
    average (Poisson, a seeded mean gap): single long requests, never a burst. What a reactive policy pays
    here for taking one long prompt for the start of a burst, the burst scenarios cannot show."""
    rate = rng.uniform(0.35, 0.6)
    gap = rng.uniform(3, 12) * MINUTE
    share = 1.0 / (rate * gap)
    prompts = Mixture(((1.0 - share, CHAT_PROMPT), (share, _long_mix(rng))))
    return [Phase(0, 60 * MINUTE, rate, prompts, CHAT_OUTPUT, "chat with sporadic long prompts")]


def _idle_gaps(rng: random.Random, day: random.Random) -> list[Phase]:
    """Two hours of sporadic use: 3-5 episodes of chat, each 3-8 minutes at a seeded rate, with 10-30 idle
    minutes between them (all drawn from the seed). What a fleet idling at zero saves, and what its cold starts cost."""
    rate = rng.uniform(0.3, 0.6)
    phases: list[Phase] = []
    start = rng.uniform(0, 2) * MINUTE
    for _ in range(rng.randint(3, 5)):
        end = start + rng.uniform(3, 8) * MINUTE
        if end > IDLE_GAPS_DURATION:
            break
        phases.append(Phase(start, end, rate, CHAT_PROMPT, CHAT_OUTPUT, "chat episode"))
        start = end + rng.uniform(10, 30) * MINUTE
    return phases


def _recurring_window(rng: random.Random) -> float:
    """The daily window opens between 07:00 and 17:00 UTC (whole minutes)."""
    return float(rng.randint(7 * 60, 17 * 60) * 60)


def _recurring_burst(rng: random.Random, day: random.Random) -> list[Phase]:
    """A 90-minute window of chat, the same every day, with a long-context burst about 40 minutes in:
    time, length, rate and mix are drawn once per seed (the daily habit), and each day moves the start
    by up to 4 minutes and scales length and rate by up to 15%."""
    rate = rng.uniform(0.35, 0.6)
    nominal = rng.uniform(35, 45) * MINUTE
    length = rng.uniform(8, 14) * MINUTE
    burst_rate = rate * rng.uniform(0.9, 1.4)
    mix = _long_mix(rng)
    start = nominal + day.uniform(-4, 4) * MINUTE
    length *= day.uniform(0.85, 1.15)
    burst_rate *= day.uniform(0.85, 1.15)
    return [
        Phase(0, start, rate, CHAT_PROMPT, CHAT_OUTPUT, "chat"),
        Phase(start, start + length, burst_rate, mix, LONG_OUTPUT, "long-context burst"),
        Phase(start + length, 90 * MINUTE, rate, CHAT_PROMPT, CHAT_OUTPUT, "chat"),
    ]


BURSTY_BASE, BURSTY_PEAK = 2.0, 8.0


def _bursty(rng: random.Random, day: random.Random) -> list[Phase]:
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


IDLE_GAPS_DURATION: Final = 120 * MINUTE

# The long-context scenarios' resource: one replica to start, room for a burst, the whole 1M-token context.
LONG_CONTEXT_FLEET: Final[dict[str, Any]] = {
    "min_replicas": 1,
    "max_replicas": 24,
    "initial_replicas": 1,
    "max_model_len": 1_048_576,
}

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
                "chat at 0.35-0.6 requests/s for an hour; once, at minute 8-40 for 6-14 minutes, the prompts jump "
                "to 100k-1M tokens at 0.8-1.4x the rate (time, length, rate and mix drawn from the seed)"
            ),
            duration=60 * MINUTE,
            **LONG_CONTEXT_FLEET,
            build_phases=_long_context_burst,
        ),
        Scenario(
            name="repeated-long-bursts",
            description=(
                "chat at 0.35-0.6 requests/s for an hour; from minute 8-25, two or three bursts of 100k-1M-token "
                "prompts at 0.8-1.4x the rate, each 2-5 minutes long with 1-8 minutes of chat between them (count, "
                "lengths, gaps, rate and mix drawn from the seed): long-context demand that comes back within minutes"
            ),
            duration=60 * MINUTE,
            **LONG_CONTEXT_FLEET,
            build_phases=_repeated_long_bursts,
        ),
        Scenario(
            name="sporadic-long-prompts",
            description=(
                "chat at 0.35-0.6 requests/s for an hour with one 100k-1M-token prompt every 3-12 minutes on "
                "average (rate, mean gap and mix drawn from the seed): long prompts that are no burst"
            ),
            duration=60 * MINUTE,
            **LONG_CONTEXT_FLEET,
            build_phases=_sporadic_long_prompts,
        ),
        Scenario(
            name="recurring-burst",
            description=(
                "a 90-minute window at the same time every day (opening 07:00-17:00 UTC): chat at 0.35-0.6 "
                "requests/s and a long-context burst about 40 minutes in, moved by up to 4 minutes and scaled by "
                "up to 15% from day to day; two earlier days are simulated first, the third is measured"
            ),
            duration=90 * MINUTE,
            **LONG_CONTEXT_FLEET,
            build_phases=_recurring_burst,
            days=3,
            window_start=_recurring_window,
        ),
        Scenario(
            name="long-answers",
            description=(
                "short prompts (median 400 tokens) and long answers (median 1,500) at 2-4 requests/s for an hour, "
                "twice that for 10-20 minutes (rate and timing drawn from the seed): the batch fills before the KV"
            ),
            duration=60 * MINUTE,
            min_replicas=1,
            max_replicas=8,
            initial_replicas=1,
            max_model_len=None,
            build_phases=_long_answers,
        ),
        Scenario(
            name="idle-gaps",
            description=(
                "two hours of 3-5 chat episodes of 3-8 minutes at 0.3-0.6 requests/s with 10-30 idle minutes between "
                "them (count, lengths, gaps and rate drawn from the seed): a fleet that could idle at zero"
            ),
            duration=IDLE_GAPS_DURATION,
            min_replicas=1,
            max_replicas=4,
            initial_replicas=1,
            max_model_len=None,
            build_phases=_idle_gaps,
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

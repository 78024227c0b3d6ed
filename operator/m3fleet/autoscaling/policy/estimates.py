"""What the fresh replicas report, summed (`Load`), and the arrival estimates made from it: smoothed, except that a
burst and the end of long prompts are taken at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from m3fleet.autoscaling.signals import Histogram, ReplicaSignals

SMOOTHING_SECONDS: Final = 120.0  # EWMA time constant of the arrival estimates
LEVEL_JUMP: Final = 2.0  # a rate this many times the estimate is a burst, a prompt length this many times less its end
SHIFT: Final = 4.0  # resident tokens per request this many times the prompt estimate: long prompts arrived
SHIFT_EVIDENCE: Final = 3  # running requests needed before their resident tokens can signal a shift
# Prefills within the rate window needed before a rise in the prompt estimate is taken at once just after a
# burst: the mean of fewer heavy-tailed long prompts is noise (one 1M-token prompt among three doubles it), and
# taking every noisy rise at once ratchets the estimate up to its largest sample.
RISE_EVIDENCE: Final = 5


RISE_WINDOWS: Final = 4  # rate windows after a burst's start in which rises are taken at once, queue or not


class Shift(StrEnum):
    """How the arriving prompt mix changed this tick (see `prompt_estimate`)."""

    NONE = "none"
    BURST = "burst"  # long prompts started arriving
    ENDED = "ended"  # far shorter prompts arrive and no long request is resident: long prompts stopped


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def sum_known(values: Sequence[float | None]) -> float:
    return sum(v for v in values if v is not None)


def positive_ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 and numerator > 0 else None


def output_per_request(generation_rate: float, finished_rate: float, arrival_rate: float) -> float | None:
    """Output tokens per request: the tokens decoded in the window over the requests they belong to. Those are the
    requests finishing only while the population in flight is steady (arrivals = finishes, by conservation). While
    it grows, most tokens go to requests still decoding: over the finishes alone (the few short answers that ended
    first) the ratio is many times any answer; over the arrivals it is what each has decoded so far, rising to the
    answer's length within a lifetime. While it shrinks, the finishes are the larger count. So: over the larger of
    the two, exact when steady and never inflated by a transient's lag. None before anything is decoded."""
    return positive_ratio(generation_rate, max(finished_rate, arrival_rate))


@dataclass(frozen=True)
class Load:
    """What the fresh replicas report, summed over them."""

    resident: float  # KV tokens held
    running: float
    waiting: float
    prompt_rate: float  # prompt tokens prefilled per second
    generation_rate: float
    finished_rate: float
    histogram: Histogram | None  # prompt lengths of finished requests

    @classmethod
    def of(cls, fresh: Sequence[ReplicaSignals], plan_capacity: float) -> Load:
        return cls(
            resident=sum_known([r.used_tokens(plan_capacity) for r in fresh]),
            running=sum_known([r.running for r in fresh]),
            waiting=sum_known([r.waiting for r in fresh]),
            prompt_rate=sum_known([r.prompt_tokens_rate for r in fresh]),
            generation_rate=sum_known([r.generation_tokens_rate for r in fresh]),
            finished_rate=sum_known([r.finished_rate for r in fresh]),
            histogram=Histogram.merge(r.prompt_tokens for r in fresh),
        )


def smooth(previous: float | None, observed: float, elapsed: float | None) -> float:
    """EWMA over SMOOTHING_SECONDS (the first observation is taken as it is)."""
    if previous is None or elapsed is None:
        return observed
    return previous + min(1.0, elapsed / SMOOTHING_SECONDS) * (observed - previous)


def rate_estimate(
    previous: float | None, observed: float, elapsed: float | None, rising: bool = False
) -> tuple[float, bool]:
    """(requests/s, burst): smoothed, but a rise by LEVEL_JUMP or more is a burst, taken at once (and any
    rise while `rising`: just after a burst)."""
    if previous is not None and elapsed is not None and observed >= LEVEL_JUMP * previous:
        return observed, True
    if rising and previous is not None and observed > previous:
        return observed, False
    return smooth(previous, observed, elapsed), False


def prompt_estimate(
    previous: float | None,
    observed: float,
    arrival_side: bool,
    per_running: float | None,
    running: float,
    recent: float | None,
    elapsed: float | None,
    rising: bool = False,
) -> tuple[float, Shift]:
    """(mean prompt tokens of arriving requests, how the prompt mix changed this tick).

    `observed` is prompt tokens per first token, measured on replicas without a queue when
    `arrival_side`; `per_running` is resident tokens per running request; `recent` is a high
    quantile of the prompts finished in the histogram window. Smoothed, except:

    * a fall by LEVEL_JUMP or more is taken at once when measured on the arrival side and no
      long requests are resident any more: long prompts stopped arriving (ENDED; the stabilization
      window then forgets what they needed, see `stabilized`);
    * resident tokens per running request SHIFT times above both the estimate and what finished
      recently means long prompts started arriving: taken at once (a burst). It is length-biased and,
      with a full KV cache, one or two requests decide it, so it needs SHIFT_EVIDENCE of them.
    """
    if previous is None or elapsed is None:
        return observed, Shift.NONE
    long_resident = per_running is not None and per_running > SHIFT * observed
    shift = Shift.NONE
    if LEVEL_JUMP * observed <= previous and arrival_side and not long_resident:
        estimate, shift = observed, Shift.ENDED
    elif rising and observed > previous:
        estimate = observed
    else:
        estimate = smooth(previous, observed, elapsed)
    if (
        per_running is not None
        and running >= SHIFT_EVIDENCE
        and per_running > SHIFT * max(previous, recent or 0.0)
        and per_running > estimate
    ):
        return per_running, Shift.BURST
    return estimate, shift


def slide_window(
    history: tuple[tuple[float, float], ...], now: float, value: float, window: float
) -> tuple[tuple[float, float], ...]:
    """Append (now, value) and keep what covers the last `window` seconds (plus the entry before it)."""
    entries = [*((t, v) for t, v in history if t < now), (now, value)]
    while len(entries) > 2 and now - entries[1][0] >= window:
        entries.pop(0)
    return tuple(entries)


def warming_up(in_flight: tuple[tuple[float, float], ...], now: float, window: float) -> bool:
    """Whether there is no current estimate to jump from: a new fleet has seen less than a rate window (its
    rates are partial and the finishes lag the arrivals, so the first full window looks like a jump), and
    after a gap longer than a window (the operator down, say) the estimate is of another time."""
    return not in_flight or now - in_flight[0][0] < window or now - in_flight[-1][0] > window


def conserved_request_rate(leaving: float, in_flight: tuple[tuple[float, float], ...]) -> float:
    """Requests/s arriving = leaving + growth of those in flight over the window (conservation)."""
    (t0, n0), (t1, n1) = in_flight[0], in_flight[-1]
    return max(0.0, leaving + (n1 - n0) / (t1 - t0)) if t1 > t0 else leaving

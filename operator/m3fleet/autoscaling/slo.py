"""How well the fleet met spec.autoscaling.slo over the last histogram window, measured from the engines' own
TTFT histograms (`status.autoscaling.slo`). Pure: a snapshot in, numbers out.

A histogram only tells how many requests finished under each of its bucket boundaries, never under an arbitrary
bound: the share reported is the share at or under the largest boundary not above the bound (a lower bound on
the true share), and that boundary is reported with it. The bound depends on each request's prompt length; the
histograms do not pair a TTFT with its prompt, so the bound is taken at the window's mean prompt length, with the
prefill throughput the policy currently plans with. The ITL bound is not measured: the engines' inter-token
histograms count tokens, not requests, and its default part (a multiple of an idle decode step) is a time the
operator does not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from m3fleet.api.models import SloSpec
from m3fleet.autoscaling.signals import Histogram, ReplicaSignals

ITL_NOT_MEASURED = (
    "not measured: engines histogram inter-token latency per token, not per request, and the bound's "
    "unloadedFactor part needs an idle decode step the operator does not know"
)


@dataclass(frozen=True)
class SloAttainment:
    """The share of the window's requests whose TTFT was within the SLO's bound."""

    percentile: float  # the objective: this share of requests, in percent
    window_seconds: float
    requests: float  # first tokens counted by the TTFT histograms in the window
    mean_prompt_tokens: float | None
    ttft_bound_seconds: float  # the SLO's bound at the mean prompt
    ttft_bucket_seconds: float | None  # the histogram boundary counted; None when every boundary exceeds the bound
    ttft_attainment: float | None  # share of requests at or under that boundary; None without requests

    def to_status(self) -> dict[str, Any]:
        met = None if self.ttft_attainment is None else self.ttft_attainment * 100 >= self.percentile
        return {
            "percentile": self.percentile,
            "windowSeconds": self.window_seconds,
            "requests": round(self.requests, 1),
            **({"meanPromptTokens": round(self.mean_prompt_tokens)} if self.mean_prompt_tokens is not None else {}),
            "ttft": {
                "boundSeconds": round(self.ttft_bound_seconds, 3),
                **({"bucketSeconds": self.ttft_bucket_seconds} if self.ttft_bucket_seconds is not None else {}),
                **({"attainment": round(self.ttft_attainment, 4)} if self.ttft_attainment is not None else {}),
                **({"met": met} if met is not None else {}),
            },
            "itl": ITL_NOT_MEASURED,
        }


def mean_prompt_tokens(replicas: Sequence[ReplicaSignals]) -> float | None:
    """Mean prompt length of the window's finished requests (the prompt histograms), else of the prompt tokens
    prefilled per first token (the rates)."""
    histograms = [r.prompt_tokens for r in replicas if r.prompt_tokens is not None and r.prompt_tokens.count > 0]
    if histograms:
        return sum(h.total for h in histograms) / sum(h.count for h in histograms)
    tokens = sum(r.prompt_tokens_rate or 0.0 for r in replicas)
    firsts = sum(r.first_token_rate or 0.0 for r in replicas)
    return tokens / firsts if firsts > 0 else None


def _at_or_under(histogram: Histogram, boundary: float) -> float:
    """Observations at or under one of the histogram's own boundaries."""
    return max((c for b, c in zip(histogram.bounds, histogram.cumulative, strict=True) if b <= boundary), default=0.0)


def measure(
    slo: SloSpec,
    replicas: Sequence[ReplicaSignals],
    prefill_tokens_per_second: float,
    window_seconds: float,
) -> SloAttainment:
    """The TTFT attainment over the replicas' histograms (each of the window), against the bound at the mean
    prompt on a replica prefilling `prefill_tokens_per_second`."""
    prompt = mean_prompt_tokens(replicas)
    unloaded = (prompt or 0.0) / prefill_tokens_per_second
    bound = slo.ttft_seconds(prompt or 0.0, unloaded)
    histograms = [r.ttft_seconds for r in replicas if r.ttft_seconds is not None]
    requests = sum(h.observations() for h in histograms)
    boundaries = sorted({b for h in histograms for b in h.bounds if b <= bound})
    bucket = boundaries[-1] if boundaries else None
    attainment = None
    if requests > 0:
        attainment = 0.0 if bucket is None else sum(_at_or_under(h, bucket) for h in histograms) / requests
    return SloAttainment(
        percentile=slo.percentile,
        window_seconds=window_seconds,
        requests=requests,
        mean_prompt_tokens=prompt,
        ttft_bound_seconds=bound,
        ttft_bucket_seconds=bucket,
        ttft_attainment=None if attainment is None else min(1.0, attainment),
    )

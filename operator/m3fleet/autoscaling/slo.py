"""How well the fleet met spec.autoscaling.slo over the last histogram window, measured from the engines' own
per-request histograms of TTFT and of time per output token (`status.autoscaling.slo`). Pure: signals in,
numbers out.

A histogram only tells how many requests finished under each of its bucket boundaries, never under an arbitrary
bound: the share reported is the share at or under the largest boundary not above the bound (a lower bound on
the true share), and that boundary is reported with it. The bound depends on each request's prompt length; the
histograms do not pair a TTFT with its prompt, so the bound is taken at the window's mean prompt length, with the
prefill throughput the policy currently plans with. The ITL bound is measured (vLLM's and SGLang's
`request_time_per_output_token_seconds`: a request's mean inter-token latency) only when it is absolute
(`unloadedFactor: 0`): its default part, a multiple of an idle decode step at the request's context, is a time the
operator does not know. TTFT and ITL are counted apart (the histograms do not pair them), so the share meeting
both may be lower than either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from m3fleet.api.models import SloSpec
from m3fleet.autoscaling.signals import Histogram, ReplicaSignals

ITL_RELATIVE = (
    "not measured: the bound is relative to an idle decode step (unloadedFactor), which the operator does not "
    "know; set slo.itl.unloadedFactor to 0 and an absolute slo.itl.seconds to have it measured"
)
ITL_NOT_EXPORTED = "not measured: this engine exports no per-request time per output token"


@dataclass(frozen=True)
class Share:
    """The share of a window's requests within one bound, as the histograms can count it."""

    bound_seconds: float
    bucket_seconds: float | None  # the histogram boundary counted; None when every boundary exceeds the bound
    requests: float  # observations in the window
    attainment: float | None  # share of requests at or under that boundary; None without requests

    def to_status(self, percentile: float) -> dict[str, Any]:
        met = None if self.attainment is None else self.attainment * 100 >= percentile
        return {
            "boundSeconds": round(self.bound_seconds, 3),
            **({"bucketSeconds": self.bucket_seconds} if self.bucket_seconds is not None else {}),
            **({"attainment": round(self.attainment, 4)} if self.attainment is not None else {}),
            **({"met": met} if met is not None else {}),
        }


@dataclass(frozen=True)
class SloAttainment:
    """The share of the window's requests whose TTFT (and, when measurable, ITL) was within the SLO's bound."""

    percentile: float  # the objective: this share of requests, in percent
    window_seconds: float
    mean_prompt_tokens: float | None
    ttft: Share  # bound at the mean prompt
    itl: Share | str  # or why it is not measured

    @property
    def requests(self) -> float:
        return self.ttft.requests

    def to_status(self) -> dict[str, Any]:
        return {
            "percentile": self.percentile,
            "windowSeconds": self.window_seconds,
            "requests": round(self.requests, 1),
            **({"meanPromptTokens": round(self.mean_prompt_tokens)} if self.mean_prompt_tokens is not None else {}),
            "ttft": self.ttft.to_status(self.percentile),
            "itl": self.itl if isinstance(self.itl, str) else self.itl.to_status(self.percentile),
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


def share(histograms: Sequence[Histogram], bound: float) -> Share:
    """The share of the histograms' observations at or under the largest of their boundaries not above `bound`."""
    requests = sum(h.observations() for h in histograms)
    boundaries = sorted({b for h in histograms for b in h.bounds if b <= bound})
    bucket = boundaries[-1] if boundaries else None
    attainment = None
    if requests > 0:
        counted = 0.0 if bucket is None else sum(_at_or_under(h, bucket) for h in histograms)
        attainment = min(1.0, counted / requests)
    return Share(bound, bucket, requests, attainment)


def measure(
    slo: SloSpec,
    replicas: Sequence[ReplicaSignals],
    prefill_tokens_per_second: float,
    window_seconds: float,
) -> SloAttainment:
    """The attainment over the replicas' histograms (each of the window): TTFT against the bound at the mean
    prompt on a replica prefilling `prefill_tokens_per_second`; ITL when its bound is absolute."""
    prompt = mean_prompt_tokens(replicas)
    ttft_bound = slo.ttft_seconds(prompt or 0.0, (prompt or 0.0) / prefill_tokens_per_second)
    ttft = share([r.ttft_seconds for r in replicas if r.ttft_seconds is not None], ttft_bound)
    itl_histograms = [r.itl_seconds for r in replicas if r.itl_seconds is not None]
    itl: Share | str = ITL_RELATIVE
    if slo.itl.unloaded_factor == 0:
        itl = share(itl_histograms, slo.itl.seconds) if itl_histograms else ITL_NOT_EXPORTED
    return SloAttainment(slo.percentile, window_seconds, prompt, ttft, itl)

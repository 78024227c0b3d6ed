"""What the policy keeps between ticks (`PolicyState`): small, JSON-serializable, and tolerant of a malformed
annotation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple


class Burst(NamedTuple):
    """The last burst the policy saw (`floors._record_burst`)."""

    start: float
    replicas: int  # what the need recommended for it
    chat: bool  # whether its prompts stayed chat-sized


@dataclass(frozen=True)
class PolicyState:
    """Stabilization history, panic deadline, the arrival estimates, the last burst; small and JSON-serializable."""

    history: tuple[tuple[float, int], ...] = ()  # (time, recommendation), only entries a window can use
    panic_until: float | None = None
    last_time: float | None = None
    in_flight: tuple[tuple[float, float], ...] = ()  # (time, running + waiting) over the last rate window
    request_rate: float | None = None  # arriving requests/s, smoothed
    prompt_tokens: float | None = None  # mean prompt length of arriving requests, smoothed
    burst: Burst | None = None  # the last burst while it is remembered (see `floors._record_burst`)
    prefill_rate: float | None = None  # learned prompt tokens/s one replica prefills (saturated)
    prefill_samples: int = 0  # saturated observations behind it
    prefill_cap_ticks: int = 0  # consecutive ticks with a chat bound from the engines' prefill time (`capacity`)
    burst_ended: float | None = None  # when long prompts last stopped arriving (None once a burst came since)
    bytes_per_token: float | None = None  # measured gateway request bytes per prompt token (spec.autoscaling.gateway)
    gateway_jump: float | None = None  # when the gateway's arrivals last jumped (a burst's start)
    gateway_since: float | None = None  # since when the gateway's series have answered (None: they do not)
    found: tuple[float, int] | None = None  # (time, replicas) of the fleet at the policy's first tick (`floors`)

    def to_dict(self) -> dict[str, Any]:
        return {
            "history": [[t, n] for t, n in self.history],
            "panicUntil": self.panic_until,
            "lastTime": self.last_time,
            "inFlight": [[t, n] for t, n in self.in_flight],
            "requestRate": self.request_rate,
            "promptTokens": self.prompt_tokens,
            "burst": None if self.burst is None else list(self.burst),
            "prefillRate": self.prefill_rate,
            "prefillSamples": self.prefill_samples,
            "prefillCapTicks": self.prefill_cap_ticks,
            "burstEnded": self.burst_ended,
            "bytesPerToken": self.bytes_per_token,
            "gatewayJump": self.gateway_jump,
            "gatewaySince": self.gateway_since,
            "found": None if self.found is None else list(self.found),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PolicyState:
        """Tolerant: anything malformed (a hand-edited annotation, an old format) starts afresh."""
        if not isinstance(data, Mapping):
            return cls()
        try:
            history = tuple((float(t), int(n)) for t, n in data.get("history") or ())
            # "bursts", a list whose last entry was the one used, until the state kept only that one
            saved = data.get("burst") or (data.get("bursts") or [None])[-1]
            return cls(
                history=history,
                panic_until=_opt_float(data.get("panicUntil")),
                last_time=_opt_float(data.get("lastTime")),
                in_flight=tuple((float(t), float(n)) for t, n in data.get("inFlight") or ()),
                request_rate=_opt_float(data.get("requestRate")),
                prompt_tokens=_opt_float(data.get("promptTokens")),
                burst=None if saved is None else _burst(saved),
                prefill_rate=_opt_float(data.get("prefillRate")),
                prefill_samples=int(data.get("prefillSamples") or 0),
                prefill_cap_ticks=int(data.get("prefillCapTicks") or 0),
                burst_ended=_opt_float(data.get("burstEnded")),
                bytes_per_token=_opt_float(data.get("bytesPerToken")),
                gateway_jump=_opt_float(data.get("gatewayJump")),
                gateway_since=_opt_float(data.get("gatewaySince")),
                found=_found(data.get("found")),
            )
        except (TypeError, ValueError):
            return cls()


def _burst(data: Sequence[Any]) -> Burst:
    """[start, replicas, chat]; a record from before the chat flag ([start, replicas]) is no chat burst."""
    start, replicas, *chat = data
    return Burst(float(start), int(replicas), bool(chat and chat[0] is True))


def _found(data: Any) -> tuple[float, int] | None:
    if data is None:
        return None
    when, replicas = data
    return float(when), int(replicas)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)

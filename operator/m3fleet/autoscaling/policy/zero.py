"""Scale to and from zero behind a gateway (spec.gateway with autoscaling.minReplicas 0). Pure: time is an input.

At zero replicas no engine exports a metric, so the rest of the policy sees nothing to scale on. The endpoint
picker's flow control holds the requests that arrive meanwhile and exports how many it holds: that count is the
signal to scale from zero. Back to zero only after the user's idle window (`scaleToZeroAfterSeconds`) in which no
request ran, waited in an engine or was held; a held-request count that cannot be read never takes a fleet to zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

SCALE_FROM_ZERO_REPLICAS: Final = 1  # what held requests order at zero: the rest of the policy takes over once serving
FROM_ZERO: Final = "scale-from-zero"
TO_ZERO: Final = "scale-to-zero"
IDLE_WAIT: Final = "idle-wait"  # the policy would go to zero, the idle window has not passed: keep one replica


@dataclass(frozen=True)
class ZeroVerdict:
    """What the zero rule makes of the policy's count: `replicas` to apply, when the fleet was last seen busy (kept in
    status.autoscaling), and why it overrode the policy (None: it did not)."""

    replicas: int
    last_busy: float
    rule: str | None = None
    reason: str | None = None


def zero_rule(
    decided: int,
    current: int,
    held: float | None,
    busy: bool,
    last_busy: float | None,
    now: float,
    idle_after_seconds: float,
) -> ZeroVerdict:
    """`decided`: the policy's count; `current`: the replicas now; `held`: requests the picker holds (None: unread);
    `busy`: an engine runs or queues a request; `last_busy`: when that was last seen (None: never recorded)."""
    active = busy or (held or 0.0) > 0
    seen = now if active or last_busy is None else last_busy
    idle = now - seen
    if current == 0 and (held or 0.0) > 0:
        replicas = max(decided, SCALE_FROM_ZERO_REPLICAS)
        reason = f"{held:g} request(s) held by the endpoint picker at zero replicas: scaling from zero to {replicas}"
        return ZeroVerdict(replicas, seen, FROM_ZERO, reason)
    if decided > 1 or active or held is None:
        if decided == 0 and current > 0:  # never to zero without the idle window and a readable held count
            return ZeroVerdict(SCALE_FROM_ZERO_REPLICAS, seen, IDLE_WAIT, _waiting(idle, idle_after_seconds))
        return ZeroVerdict(decided, seen)
    if idle >= idle_after_seconds:
        if current == 0 and decided == 0:
            return ZeroVerdict(0, seen)
        reason = f"no request ran, waited or was held for {idle:.0f} s (scaleToZeroAfterSeconds {idle_after_seconds:g})"
        return ZeroVerdict(0, seen, TO_ZERO, f"{reason}: scaling to zero")
    if decided == 0 and current > 0:
        return ZeroVerdict(SCALE_FROM_ZERO_REPLICAS, seen, IDLE_WAIT, _waiting(idle, idle_after_seconds))
    return ZeroVerdict(decided, seen)


def _waiting(idle: float, idle_after_seconds: float) -> str:
    return f"idle for {idle:.0f} s of the {idle_after_seconds:g} s scaleToZeroAfterSeconds: keeping one replica"

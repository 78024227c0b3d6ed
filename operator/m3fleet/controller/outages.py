"""Which parts of which resources cannot read their metrics, and since when: so an outage says so once when it
begins and once when it ends, not a line per tick (status says it on every tick meanwhile). Pure: the autoscaler
emits the Events and log lines `observe` returns."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import NamedTuple

from m3fleet.autoscaling.time_to_ready import rfc3339

# (namespace, name, part): the part is "" for the whole fleet, "tier long" for a context tier, "prefill workers"
# for a disaggregated role.
PartKey = tuple[str, str, str]


def tier_part(tier: str) -> str:
    """The part a context tier's metrics are reported as ("" for the spec's own tier)."""
    return f"tier {tier}" if tier else ""


class Notice(NamedTuple):
    """What to say about a change: a Warning Event when `warning`, else a Normal one."""

    reason: str
    message: str
    warning: bool


@dataclass
class Outages:
    _since: dict[PartKey, str] = field(default_factory=dict)  # unreadable parts: since (RFC 3339)

    def observe(self, key: PartKey, error: str | None, now: float) -> Notice | None:
        """What to say about this tick's read of a part's metrics (`error` None when they were readable): a notice
        when an outage begins or ends, else None."""
        which = f"{key[2]}: " if key[2] else ""
        if error is not None and key not in self._since:
            self._since[key] = rfc3339(now)
            message = f"{which}{error}; the replica count holds (never a scale-down without metrics)"
            return Notice("MetricsUnavailable", message, warning=True)
        if error is None and key in self._since:
            message = f"{which}metrics readable again (unavailable since {self._since.pop(key)})"
            return Notice("MetricsAvailable", message, warning=False)
        return None

    def forget(self, namespace: str, name: str, parts: Collection[str] | None = None) -> None:
        """Forget a resource's outages: those of `parts` (a removed context tier's, whose name may come back as a
        new tier), or all of them (the resource went away or no longer autoscales)."""
        for key in [k for k in self._since if k[:2] == (namespace, name) and (parts is None or k[2] in parts)]:
            del self._since[key]

"""The autoscaler's memory of metrics outages: one notice when an outage begins, one when it ends, and none for a
context tier that was removed while its metrics were unreadable and came back under the same name."""

from __future__ import annotations

import time

from m3fleet.controller.outages import Outages, tier_part

NOON = 1_790_000_000.0  # any fixed instant (Unix seconds)
FLEET = ("prod", "m3")


def test_an_outage_is_said_once_when_it_begins_and_once_when_it_ends() -> None:
    outages = Outages()
    key = (*FLEET, "")
    began = outages.observe(key, "Prometheus did not answer", NOON)
    assert began is not None and began.warning and began.reason == "MetricsUnavailable"
    assert began.message.startswith("Prometheus did not answer; the replica count holds")
    assert outages.observe(key, "Prometheus did not answer", NOON + 15) is None
    assert outages.observe(key, "another error", NOON + 30) is None  # still the same outage
    ended = outages.observe(key, None, NOON + 45)
    assert ended is not None and not ended.warning and ended.reason == "MetricsAvailable"
    assert ended.message.endswith(f"(unavailable since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(NOON))})")
    assert outages.observe(key, None, NOON + 60) is None


def test_each_part_has_its_own_outage_and_says_which_it_is() -> None:
    outages = Outages()
    tier = outages.observe((*FLEET, tier_part("long")), "no series", NOON)
    role = outages.observe((*FLEET, "prefill workers"), "no series", NOON)
    assert tier is not None and tier.message.startswith("tier long: no series")
    assert role is not None and role.message.startswith("prefill workers: no series")
    assert outages.observe((*FLEET, ""), None, NOON) is None  # the fleet's own metrics never failed
    assert tier_part("") == ""


def test_a_removed_tier_forgets_its_outage_and_the_others_keep_theirs() -> None:
    outages = Outages()
    for part in (tier_part("long"), tier_part("short"), ""):
        outages.observe((*FLEET, part), "no series", NOON)
    outages.observe(("prod", "other", tier_part("long")), "no series", NOON)
    outages.forget(*FLEET, parts={tier_part("long")})
    # A tier of the same name, added back and readable: nothing ended for it.
    assert outages.observe((*FLEET, tier_part("long")), None, NOON + 15) is None
    assert outages.observe((*FLEET, tier_part("short")), None, NOON + 15) is not None
    assert outages.observe(("prod", "other", tier_part("long")), None, NOON + 15) is not None
    outages.forget(*FLEET)
    assert outages.observe((*FLEET, ""), None, NOON + 30) is None

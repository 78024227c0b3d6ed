"""Foresight on the real tier: the demand record in `status.autoscaling.demand` survives an operator restart and
is read back as the forecast floor. A fleet whose record says it needed 3 replicas at this time on each of the
last two days is scaled to 3 ahead of its peak while its metrics (a stand-in per pod, a real Prometheus) say it
is quiet, and `status.autoscaling.forecast` says why.

The record is written as a previous operator process would have left it (the status subresource, before this
test's operator starts): two days of an operator cannot be waited for here; the folding of ticks into that
record is unit-tested (tests/unit/autoscaling/test_demand_record.py). It is in the form an older operator kept
(5-minute samples, `[minute, need]`), so the test also shows an upgraded operator reading it minute by minute
and keeping it in today's dense form."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.support.autoscaling.prom import prometheus
from tests.support.cluster import standins as loop
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.fleet import delete, weight_volumes

from m3fleet.api import parse_resource
from m3fleet.autoscaling.forecast import DAY, DemandRecord
from m3fleet.planner import plan as make_plan

NAME = "loop-forecast"


def recorded_peaks(now: float, need: float) -> dict[str, Any]:
    """An older operator's record: `need` in each 5-minute bucket of the hour around this time on each of the
    last two days."""
    samples = [
        [bucket // 60, need]
        for day in (2, 1)
        for bucket in range(int((now - day * DAY - 1800) // 300) * 300, int(now - day * DAY + 1800), 300)
    ]
    return {"bucketSeconds": 300, "samples": samples, "open": []}


def test_a_recorded_daily_peak_scales_a_quiet_fleet_ahead_after_an_operator_restart(
    chart: Cluster, tmp_path: Path
) -> None:
    chart.namespace(loop.NAMESPACE)
    weight_volumes(chart, loop.NAMESPACE)
    document = loop.fleet(NAME, "act")
    plan = make_plan(parse_resource(document).spec)
    workdir = tmp_path / "prom"
    workdir.mkdir()
    targets = tmp_path / "targets.json"
    with (
        loop.StandIns(chart, targets, {NAME: plan}) as standins,
        prometheus(workdir, loop.scrape_config(targets)) as url,
    ):
        try:
            document["spec"]["autoscaling"]["prometheus"]["url"] = url
            chart.apply(document)  # no operator yet: the resource waits, as after an operator's restart
            record = recorded_peaks(time.time(), 3.0)
            status = {"status": {"autoscaling": {"demand": record}}}
            chart.kubectl(
                "patch",
                "m3d",
                NAME,
                "-n",
                loop.NAMESPACE,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps(status),
            )
            with chart.operator("--all-namespaces", "--standalone", name="operator-forecast"):
                loop.eventually(
                    "the forecast floor scales the quiet fleet to 3",
                    lambda: loop.replicas(chart, NAME) == 3 and standins.up(NAME) == 3,
                    120,
                    lambda: loop.autoscaling(chart, NAME),
                )
                decided = loop.autoscaling(chart, NAME)
                assert decided["forecast"]["replicas"] == 3, decided
                reason = decided["forecast"]["reason"]
                assert "each of the last 2 recorded days" in reason and "3.0 1 day ago, 3.0 2 days ago" in reason
                assert decided["terms"]["kvReplicas"] < 1, decided  # the metrics alone say one replica
                assert any("forecast floor 3" in m for m in loop.events(chart, NAME, "Scaled"))
                # The record is kept as read (what the floor reads of it, at least) and this process adds to it.
                kept = set(DemandRecord.from_status(decided["demand"], 60).samples)
                yesterday = [(m * 60.0, n) for m, n in record["samples"] if m * 60 > time.time() - 1.5 * DAY]
                minutes = {(t + 60.0 * i, n) for t, n in yesterday for i in range(5)}
                assert yesterday and minutes <= kept, decided["demand"]
        finally:
            delete(chart, NAME, loop.NAMESPACE)

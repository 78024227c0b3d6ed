"""The fleet Grafana dashboard (manifests/dashboards/m3fleet-fleet.json).

Its m3fleet_* series must exist in the operator's registry (controller/metrics.py), the engine series
the issue names must be there, the layout must be a valid Grafana grid, and every query must parse
as PromQL (promtool, when installed: CI installs Prometheus with apt).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from m3fleet.controller.metrics import REGISTRY
from tests.support.chart import ROOT

DASHBOARD = ROOT / "manifests" / "dashboards" / "m3fleet-fleet.json"


def load() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def operator_series() -> set[str]:
    """Every series name the operator exports (counters get _total, histograms _bucket/_sum/_count)."""
    names = set()
    for family in REGISTRY.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}[family.type]
        names |= {family.name + s for s in suffixes}
    return names


def test_structure() -> None:
    board = load()
    assert board["uid"] == "m3fleet-fleet" and board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert set(variables) == {"datasource", "namespace", "name"}
    occupied: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["description"] and panel["targets"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))


def test_covers_what_a_fleet_operator_needs() -> None:
    text = "\n".join(exprs(load()))
    for series in (
        "m3fleet_desired_replicas",
        "m3fleet_ready_replicas",
        "m3fleet_autoscaler_desired_replicas",
        "m3fleet_autoscaler_decisions_total",
        "vllm:kv_cache_usage_perc",
        "sglang:token_usage",
        "trtllm_kv_cache_utilization",
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "trtllm_num_requests_waiting",
        "vllm:time_to_first_token_seconds_bucket",
        "sglang:time_to_first_token_seconds_bucket",
        "trtllm_time_to_first_token_seconds_bucket",
    ):
        assert series in text, series


def test_operator_series_exist() -> None:
    # m3fleet_dev_* are the PodMonitor's labels on engine series, not operator metrics.
    used = set(re.findall(r"\bm3fleet_(?!dev_)[a-z_]+", "\n".join(exprs(load()))))
    assert used and used <= operator_series(), used - operator_series()
    assert {"m3fleet_autoscaler_decisions_total", "m3fleet_autoscaler_desired_replicas"} <= used


def test_engine_queries_filter_on_the_pod_monitor_labels() -> None:
    for expr in exprs(load()):
        if re.search(r"\b(vllm:|sglang:|trtllm_)", expr):
            assert 'm3fleet_dev_name=~"$name"' in expr and 'namespace=~"$namespace"' in expr, expr
        elif "m3fleet_desired" in expr or "m3fleet_ready" in expr or "m3fleet_autoscaler" in expr:
            assert 'name=~"$name"' in expr, expr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    substitutions = {"$__rate_interval": "1m", "$namespace": ".*", "$name": ".*"}
    rules = []
    for i, expr in enumerate(exprs(load())):
        for var, value in substitutions.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"m3fleet:dashboard_query_{i}", "expr": expr})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr

"""The closed loop's parts on the real tier: engine stand-ins that follow kwok's pods (one per running engine pod,
exporting its fleet's engine's own metric format — vLLM 0.33, SGLang 0.5.23 with one series per TP rank, or
TensorRT-LLM — on its own loopback port, found by Prometheus through file-based service discovery with the labels
the chart's PodMonitor gives engine series), a fleet-wide demand they share, and readers of what the operator
recorded."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.autoscaling.prom import EngineState, MetricsServer, sglang_text, trtllm_text, vllm_text
from tests.cluster.cluster import Cluster, ClusterError
from tests.cluster.cluster import eventually as cluster_eventually
from tests.cluster.fleet import renamed, sample

from m3fleet.api.models import Plan

NAMESPACE = "loop"
ACT, ADVISORY = "loop-act", "loop-advisory"
QUIET, BUSY = 0.5, 2.5  # fleet-wide demand, in replicas' worth of KV at the 0.8 target
IN_FLIGHT = 12.0  # requests running in the fleet, whatever the demand
PROMPT = 8000.0
REQUEST_RATE = 0.05  # per pod: the counters grow steadily (no counter resets when the load changes)


def fleet(name: str, mode: str, stem: str = "vllm-h200-tp8") -> dict[str, Any]:
    document = renamed(sample(stem), name, NAMESPACE)
    document["spec"]["autoscaling"] = {
        "enabled": True,
        "mode": mode,
        "minReplicas": 1,
        "maxReplicas": 3,
        "intervalSeconds": 5,
        "coldStartSeconds": 30,
        "panicThreshold": 10,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}, "scaleUp": {"stabilizationWindowSeconds": 0}},
        "forecast": {"enabled": True},
        "prometheus": {"url": "http://127.0.0.1:9"},  # replaced by the test's Prometheus
    }
    return document


def exposition(plan: Plan, state: EngineState, elapsed: float) -> str:
    """One replica's /metrics in its engine's own format. SGLang repeats its gauges on every TP rank (as with
    --enable-metrics-for-all-schedulers), so the adapter must not sum them."""
    if plan.engine == "sglang":
        return sglang_text(state, elapsed, tp=plan.tensor_parallel_size, dp=plan.data_parallel_size)
    if plan.engine == "trtllm":
        return trtllm_text(state, elapsed)
    return vllm_text(state, elapsed, max_model_len=plan.max_model_len)


class StandIns:
    """One stand-in per running engine pod of the `plans`' fleets (of a multi-node replica, its leader: the
    only pod that serves metrics), exporting that fleet's plan's KV capacity, and the target list Prometheus
    reads."""

    def __init__(self, cluster: Cluster, targets: Path, plans: dict[str, Plan]) -> None:
        self.cluster, self.targets, self.plans = cluster, targets, plans
        self.demand: dict[str, float] = {}
        self.servers: dict[str, tuple[str, MetricsServer]] = {}  # pod -> (fleet, its stand-in)
        self.started: list[str] = []  # pods a stand-in was started for, in order
        self.stopped: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._write()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def state(self, fleet: str) -> EngineState:
        with self._lock:
            up = sum(1 for f, _ in self.servers.values() if f == fleet)
        up = max(1, up)
        usage = min(0.95, 0.8 * self.demand.get(fleet, QUIET) / up)
        return EngineState(
            running=IN_FLIGHT / up,
            waiting=0,
            kv_usage=usage,
            capacity_tokens=float(self.plans[fleet].kv_cache_tokens_per_replica),
            prompt_tokens_rate=REQUEST_RATE * PROMPT,
            generation_tokens_rate=REQUEST_RATE * 256,
            request_rate=REQUEST_RATE,
            prompt_tokens=PROMPT,
        )

    def up(self, fleet: str) -> int:
        with self._lock:
            return sum(1 for f, _ in self.servers.values() if f == fleet)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                running = {
                    p["metadata"]["name"]: p["metadata"]["labels"]["m3fleet.dev/name"]
                    for p in self.cluster.list("pods", NAMESPACE, "m3fleet.dev/name,m3fleet.dev/role!=worker")
                    if p["metadata"]["labels"]["m3fleet.dev/name"] in self.plans
                    and not p["metadata"].get("deletionTimestamp")
                    and (p.get("status") or {}).get("phase") == "Running"
                }
            except Exception:  # the apiserver busy for a moment: try again
                time.sleep(0.5)
                continue
            changed = False
            for pod, name in running.items():
                if pod not in self.servers:
                    server = MetricsServer(
                        {"/metrics": lambda t, f=name: (200, exposition(self.plans[f], self.state(f), t))}
                    ).__enter__()
                    with self._lock:
                        self.servers[pod] = (name, server)
                        self.started.append(pod)
                    changed = True
            for pod in [p for p in self.servers if p not in running]:
                with self._lock:
                    _, server = self.servers.pop(pod)
                    self.stopped.append(pod)
                server.__exit__(None, None, None)
                changed = True
            if changed:
                self._write()
            self._stop.wait(0.5)

    def _write(self) -> None:
        with self._lock:
            groups = [
                {
                    "targets": [f"127.0.0.1:{server.port}"],
                    "labels": {"namespace": NAMESPACE, "m3fleet_dev_name": name, "pod": pod},
                }
                for pod, (name, server) in sorted(self.servers.items())
            ]
        partial = self.targets.with_suffix(".tmp")
        partial.write_text(json.dumps(groups))
        os.replace(partial, self.targets)  # Prometheus never reads half a file

    def __enter__(self) -> StandIns:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for _, server in self.servers.values():
            server.__exit__(None, None, None)


def scrape_config(targets: Path) -> str:
    return (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: engines\n"
        "    file_sd_configs:\n"
        f"      - files: ['{targets}']\n"
        "        refresh_interval: 1s\n"
    )


def eventually(what: str, check: Callable[[], Any], timeout: float, what_now: Callable[[], Any] | None = None) -> Any:
    """tests.cluster.cluster.eventually, saying what the operator last recorded when it times out."""
    try:
        return cluster_eventually(what, check, timeout)
    except ClusterError as exc:
        if what_now is None:
            raise
        raise ClusterError(f"{exc}\nlast recorded: {json.dumps(what_now())[:3000]}") from None


def autoscaling(cluster: Cluster, name: str) -> dict[str, Any]:
    body = cluster.get("m3d", name, NAMESPACE) or {}
    return dict((body.get("status") or {}).get("autoscaling") or {})


def replicas(cluster: Cluster, name: str) -> int:
    body = cluster.get("deployment", name, NAMESPACE) or {}
    return int((body.get("spec") or {}).get("replicas") or 0)


def events(cluster: Cluster, name: str, reason: str) -> list[str]:
    return [
        str(e.get("message") or "")
        for e in cluster.list("events", NAMESPACE)
        if e.get("reason") == reason and e["involvedObject"].get("name") == name
    ]


def spec_managers(cluster: Cluster, name: str) -> set[str]:
    """The field managers owning any of the resource's spec (kubectl shows managedFields only on request)."""
    shown = cluster.kubectl("get", "m3d", name, "-n", NAMESPACE, "-o", "json", "--show-managed-fields")
    fields = json.loads(shown.stdout)["metadata"]["managedFields"]
    return {m["manager"] for m in fields if "f:spec" in (m.get("fieldsV1") or {})}

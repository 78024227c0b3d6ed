"""The closed loop's parts on the real tier: engine stand-ins that follow kwok's pods (one per running engine pod,
exporting its fleet's engine's own metric format — vLLM 0.33, SGLang 0.5.23 with one series per TP rank, or
TensorRT-LLM — on its own loopback port, found by Prometheus through file-based service discovery with the labels
the chart's PodMonitor gives engine series), the load they export (a stepped fleet-wide demand they share, or a
scenario's requests served by the simulator's engine model: tests/support/cluster/live.py), and readers of what the
operator recorded."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from m3fleet.api.models import Plan
from m3fleet.autoscaling.signals import one_two_five_buckets
from m3fleet.autoscaling.time_to_ready import epoch
from tests.support.autoscaling.prom import (
    EngineState,
    MetricsServer,
    Reading,
    sglang_exposition,
    trtllm_exposition,
    vllm_exposition,
)
from tests.support.cluster.cluster import Cluster, ClusterError
from tests.support.cluster.cluster import eventually as cluster_eventually
from tests.support.cluster.controlplane import COLD_START_ANNOTATION
from tests.support.cluster.fleet import renamed, sample

NAMESPACE = "loop"
# A disaggregated fleet's pods carry their Dynamo role; the chart's PodMonitor (a labelmap) makes it this label.
DYNAMO_ROLE = "m3fleet.dev/dynamo-role"
ROLE_SERIES_LABEL = "m3fleet_dev_dynamo_role"
ACT, ADVISORY = "loop-act", "loop-advisory"
QUIET, BUSY = 0.5, 2.5  # fleet-wide demand, in replicas' worth of KV at the 0.8 target
KV_TARGET = 0.8  # the autoscaling target the demand is counted at (the spec's default)
FULL = 0.95  # a stand-in's KV usage at most: what a replica cannot hold waits in its queue, unseen by the gauge
QUEUE_LIMIT = FULL / KV_TARGET  # the demand on one replica at which its KV is full and requests start to queue
IN_FLIGHT = 12.0  # requests running in the fleet, whatever the demand
PROMPT = 8000.0
REQUEST_RATE = 0.05  # per pod: the counters grow steadily (no counter resets when the load changes)


def fleet(name: str, mode: str, stem: str = "vllm-h200-tp8", cold_start: int = 0) -> dict[str, Any]:
    """An autoscaled fleet of the sample `stem`; kwok holds each new pod `cold_start` seconds before it is ready
    (tests/support/cluster/controlplane.py's COLD_START_ANNOTATION), 0: ready at once."""
    document = renamed(sample(stem), name, NAMESPACE)
    if cold_start:
        metadata = document["spec"].setdefault("podTemplate", {}).setdefault("metadata", {})
        metadata.setdefault("annotations", {})[COLD_START_ANNOTATION] = str(cold_start)
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


def exposition(plan: Plan, reading: Reading, node_rank: int = 0) -> str:
    """One replica's /metrics in its engine's own format, as its pod on `node_rank` exports it. SGLang repeats its
    gauges on every TP rank (as with --enable-metrics-for-all-schedulers), so the adapter must not sum them; over
    several nodes each pod has its own node's ranks (with DP attention, its DP ranks' pools)."""
    if plan.engine == "sglang":
        world = plan.tensor_parallel_size * plan.data_parallel_size  # SGLang's --tp-size with DP attention
        return sglang_exposition(
            reading, world, plan.data_parallel_size, nodes=plan.nodes_per_replica, node_rank=node_rank
        )
    if plan.engine == "trtllm":
        return trtllm_exposition(reading)
    return vllm_exposition(reading)


class Load(Protocol):
    """What the stand-ins export: told which pods of a fleet run, asked for one pod's reading."""

    def follow(self, fleet: str, pods: Collection[str]) -> None: ...

    def reading(self, fleet: str, pod: str, elapsed: float) -> Reading: ...


@dataclass(frozen=True)
class Ramp:
    """A demand rising steadily from `start`, `per_second`, from when it was made."""

    start: float
    per_second: float
    since: float = field(default_factory=time.monotonic)

    def level(self) -> float:
        return self.start + self.per_second * (time.monotonic() - self.since)


class SteppedDemand:
    """A fleet-wide demand, in replicas' worth of KV at the 0.8 target, shared by the pods up; the test steps it
    (`demand[fleet] = ...`) or ramps it (`demand[fleet] = Ramp(...)`). Each pod started later holds a quarter more
    than the one before it, so the pod a ReplicaSet deletes by default (the newest) is the busiest. A pod's KV
    gauge stops at FULL (the rest queues). Requests in flight and the arrival rate per pod stay the same, so the KV
    term decides (and the counters grow steadily: no resets when the demand changes)."""

    def __init__(self, plans: dict[str, Plan]) -> None:
        self.plans = plans
        self.demand: dict[str, float | Ramp] = {}
        self.order: dict[str, list[str]] = {}  # the fleet's pods up, oldest stand-in first

    def follow(self, fleet: str, pods: Collection[str]) -> None:
        self.order[fleet] = list(pods)

    def share(self, fleet: str, pod: str) -> float:
        order = self.order.get(fleet) or [pod]
        weights = [1 + 0.25 * i for i in range(len(order))]
        return weights[order.index(pod)] / sum(weights) if pod in order else 1 / len(order)

    def level(self, fleet: str) -> float:
        demand = self.demand.get(fleet, QUIET)
        return demand.level() if isinstance(demand, Ramp) else demand

    def reading(self, fleet: str, pod: str, elapsed: float) -> Reading:
        plan, up = self.plans[fleet], max(1, len(self.order.get(fleet) or ()))
        state = EngineState(
            running=IN_FLIGHT / up,
            waiting=0,
            kv_usage=min(FULL, KV_TARGET * self.level(fleet) * self.share(fleet, pod)),
            capacity_tokens=float(plan.kv_cache_tokens_per_replica),
            prompt_tokens_rate=REQUEST_RATE * PROMPT,
            generation_tokens_rate=REQUEST_RATE * 256,
            request_rate=REQUEST_RATE,
            prompt_tokens=PROMPT,
        )
        return state.reading(elapsed, one_two_five_buckets(plan.max_model_len))


LWS_NAME, LWS_GROUP, LWS_WORKER = (
    f"leaderworkerset.sigs.k8s.io/{key}" for key in ("name", "group-index", "worker-index")
)


TIER = "m3fleet.dev/tier"


def group_of(pod: dict[str, Any]) -> str:
    """The workload a pod belongs to, by which the stand-ins key their plans and loads: the fleet's name, or a
    context tier's `<name>-<tier>` (spec.gateway.tiers)."""
    labels = pod["metadata"]["labels"]
    return f"{labels['m3fleet.dev/name']}-{labels[TIER]}" if TIER in labels else labels["m3fleet.dev/name"]


def series_labels(pod: dict[str, Any]) -> dict[str, str]:
    """What the chart's PodMonitor (its labelmap of the pod's labels) puts on the pod's engine series."""
    labels = pod["metadata"]["labels"]
    tier = {"m3fleet_dev_tier": labels[TIER]} if TIER in labels else {}
    role = {ROLE_SERIES_LABEL: labels[DYNAMO_ROLE]} if DYNAMO_ROLE in labels else {}  # a disaggregated fleet's pods
    return {"namespace": pod["metadata"]["namespace"], "m3fleet_dev_name": labels["m3fleet.dev/name"], **tier, **role}


def replica_and_node_rank(pod: dict[str, Any]) -> tuple[str, int]:
    """The replica a pod is part of (a LeaderWorkerSet group's is its leader's name) and its node rank."""
    labels = pod["metadata"]["labels"]
    if LWS_NAME not in labels:
        return pod["metadata"]["name"], 0
    return f"{labels[LWS_NAME]}-{labels[LWS_GROUP]}", int(labels.get(LWS_WORKER) or 0)


class StandIns:
    """One stand-in per running engine pod of the `plans`' fleets (keyed by workload: a fleet, or a context tier's
    `<name>-<tier>`) that exports metrics (the pods the chart's PodMonitor keeps: annotated prometheus.io/scrape; of
    a multi-node replica, its leader, and on SGLang its workers too, once all the replica's pods run), exporting
    what the `load` says of its replica (by default a `SteppedDemand`: set `demand`) from that pod's node, and the
    target list Prometheus reads."""

    def __init__(
        self,
        cluster: Cluster,
        targets: Path,
        plans: dict[str, Plan],
        load: Load | None = None,
        namespace: str = NAMESPACE,
    ) -> None:
        self.cluster, self.targets, self.plans, self.namespace = cluster, targets, plans, namespace
        self.load: Load = load or SteppedDemand(plans)
        self.servers: dict[str, tuple[str, MetricsServer]] = {}  # pod -> (fleet, its stand-in)
        self.replicas: dict[str, tuple[str, int]] = {}  # pod -> (its replica, its node rank)
        self.labels: dict[str, dict[str, str]] = {}  # pod -> the labels its series carry
        self.started: list[str] = []  # pods a stand-in was started for, in order
        self.stopped: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._write()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    @property
    def demand(self) -> dict[str, float | Ramp]:
        assert isinstance(self.load, SteppedDemand), "only a stepped demand is set by hand"
        return self.load.demand

    def _metrics(self, fleet: str, pod: str, elapsed: float) -> tuple[int, str]:
        replica, node_rank = self.replicas[pod]
        return 200, exposition(self.plans[fleet], self.load.reading(fleet, replica, elapsed), node_rank)

    def up(self, fleet: str) -> int:
        """The fleet's replicas with a stand-in on their leader (or single pod)."""
        with self._lock:
            return sum(1 for pod, (f, _) in self.servers.items() if f == fleet and self.replicas[pod][0] == pod)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                alive = [
                    p
                    for p in self.cluster.list("pods", self.namespace, "m3fleet.dev/name")
                    if group_of(p) in self.plans
                    and not p["metadata"].get("deletionTimestamp")
                    and (p.get("status") or {}).get("phase") == "Running"
                ]
            except Exception:  # the apiserver busy for a moment: try again
                time.sleep(0.5)
                continue
            # A replica over several nodes serves once all its pods run (a group's leader waits for its workers), so
            # its ranks' series appear together: one appearing later with requests already in flight would read as
            # arrivals to the policy's conservation of requests in flight.
            pods_up = Counter(replica_and_node_rank(p)[0] for p in alive)
            listed = [
                p
                for p in alive
                if (p["metadata"].get("annotations") or {}).get("prometheus.io/scrape") == "true"
                and pods_up[replica_and_node_rank(p)[0]] >= self.plans[group_of(p)].nodes_per_replica
            ]
            running = {p["metadata"]["name"]: group_of(p) for p in listed}
            changed = False
            for p in listed:
                self.replicas.setdefault(p["metadata"]["name"], replica_and_node_rank(p))
                self.labels.setdefault(p["metadata"]["name"], series_labels(p))
            for pod in [p for p in self.servers if p not in running]:
                with self._lock:
                    _, server = self.servers.pop(pod)
                    self.stopped.append(pod)
                server.__exit__(None, None, None)
                changed = True
            for pod, name in running.items():
                if pod not in self.servers:
                    server = MetricsServer({"/metrics": lambda t, f=name, p=pod: self._metrics(f, p, t)})
                    with self._lock:
                        self.servers[pod] = (name, server.__enter__())
                        self.started.append(pod)
                    changed = True
            if changed:
                for name in self.plans:
                    members = [self.replicas[p][0] for p, (f, _) in self.servers.items() if f == name]
                    self.load.follow(name, list(dict.fromkeys(members)))
                self._write()
            self._stop.wait(0.5)

    def _write(self) -> None:
        with self._lock:
            groups = [
                {"targets": [f"127.0.0.1:{server.port}"], "labels": {**self.labels[pod], "pod": pod}}
                for pod, (_, server) in sorted(self.servers.items())
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


def scrape_config(targets: Path, gateway: str | None = None) -> str:
    """The engines found through the target list; a gateway's endpoint picker (`host:port`) as a static target."""
    config = (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: engines\n"
        "    file_sd_configs:\n"
        f"      - files: ['{targets}']\n"
        "        refresh_interval: 1s\n"
    )
    if gateway is not None:
        config += f"  - job_name: gateway\n    static_configs:\n      - targets: ['{gateway}']\n"
    return config


def eventually(what: str, check: Callable[[], Any], timeout: float, what_now: Callable[[], Any] | None = None) -> Any:
    """tests.support.cluster.cluster.eventually, saying what the operator last recorded when it times out."""
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
    """The messages of the resource's Events with this reason, oldest first."""
    return [message for _, message in timed_events(cluster, name, reason)]


def timed_events(cluster: Cluster, name: str, reason: str) -> list[tuple[float, str]]:
    """(when, in epoch seconds; message) of the resource's Events with this reason, oldest first."""
    found = []
    for event in cluster.list("events", NAMESPACE):
        if event.get("reason") == reason and event["involvedObject"].get("name") == name:
            stamp = event.get("eventTime") or event.get("firstTimestamp") or event["metadata"]["creationTimestamp"]
            when = epoch(stamp)
            assert when is not None, event
            found.append((when, str(event.get("message") or "")))
    return sorted(found, key=lambda timed: timed[0])


def spec_managers(cluster: Cluster, name: str) -> set[str]:
    """The field managers owning any of the resource's spec (kubectl shows managedFields only on request)."""
    shown = cluster.kubectl("get", "m3d", name, "-n", NAMESPACE, "-o", "json", "--show-managed-fields")
    fields = json.loads(shown.stdout)["metadata"]["managedFields"]
    return {m["manager"] for m in fields if "f:spec" in (m.get("fieldsV1") or {})}

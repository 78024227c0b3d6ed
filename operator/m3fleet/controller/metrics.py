"""The operator's own Prometheus metrics (on `m3fleet run --metrics-port`, default 9090).

Reconciles, their duration and errors; writes by kind; desired vs ready replicas per resource;
the autoscaler's decisions; whether this replica stands by (peering); how long new engine replicas took
to become ready, whole and by phase (each replica observed once, when first seen ready and not yet in
`status.timeToReady`). One registry per process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter("m3fleet_reconciles", "Reconciles by result (ok, blocked, error).", ["result"], registry=REGISTRY)
RECONCILE_SECONDS = Histogram(
    "m3fleet_reconcile_duration_seconds",
    "Wall time of one reconcile.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
CHILD_WRITES = Counter(
    "m3fleet_child_writes",
    "Children applied, pruned or created, by kind and action.",
    ["kind", "action"],
    registry=REGISTRY,
)
DESIRED_REPLICAS = Gauge(
    "m3fleet_desired_replicas", "Replicas the operator asks for.", ["namespace", "name"], registry=REGISTRY
)
READY_REPLICAS = Gauge(
    "m3fleet_ready_replicas", "Replicas whose every pod is ready.", ["namespace", "name"], registry=REGISTRY
)
AUTOSCALER_DECISIONS = Counter(
    "m3fleet_autoscaler_decisions",
    "Autoscaler decisions by direction (up, down, hold).",
    ["namespace", "name", "direction"],
    registry=REGISTRY,
)
AUTOSCALER_DESIRED = Gauge(
    "m3fleet_autoscaler_desired_replicas",
    "The autoscaler's last desired replica count.",
    ["namespace", "name"],
    registry=REGISTRY,
)
# Seconds: from pods on warm nodes with the image (seconds) to node provisioning and a cold weight read (an hour).
TIME_TO_READY_BUCKETS = (1, 5, 15, 30, 60, 90, 120, 180, 240, 300, 420, 600, 900, 1200, 1800, 3600)
TIME_TO_READY = Histogram(
    "m3fleet_replica_time_to_ready_seconds",
    "Pod created -> ready, per new engine replica (a multi-node group: all its pods ready).",
    ["namespace", "name"],
    buckets=TIME_TO_READY_BUCKETS,
    registry=REGISTRY,
)
TIME_TO_READY_PHASE = Histogram(
    "m3fleet_replica_startup_phase_seconds",
    "Each phase of a new replica's start: schedule, image (only when the kubelet's Pulled event is known), "
    "start (containers started), load (started -> ready).",
    ["namespace", "name", "phase"],
    buckets=TIME_TO_READY_BUCKETS,
    registry=REGISTRY,
)

PAUSED = Gauge(
    "m3fleet_paused",
    "1 while this replica stands by because a peer with priority is active (peering), else 0.",
    registry=REGISTRY,
)
RETRIES = Counter(
    "m3fleet_reconcile_retries",
    "Reconciles scheduled again after a failure (with backoff, or the server's Retry-After).",
    registry=REGISTRY,
)


# The series labelled with one resource: removed with it, so a deleted fleet stops exporting its last values
# (dashboards and alerts would read them as current) and the registry does not grow with every fleet ever seen.
RESOURCE_SERIES = (DESIRED_REPLICAS, READY_REPLICAS, TIME_TO_READY, TIME_TO_READY_PHASE)
AUTOSCALER_SERIES = (AUTOSCALER_DECISIONS, AUTOSCALER_DESIRED)


def forget(series: tuple[Counter | Gauge | Histogram, ...], namespace: str, name: str) -> None:
    for metric in series:
        metric.remove_by_labels({"namespace": namespace, "name": name})


def serve(port: int) -> None:
    start_http_server(port, addr="0.0.0.0", registry=REGISTRY)

"""The operator's own Prometheus metrics (on `m3fleet run --metrics-port`, default 9090).

Reconciles, their duration and errors; writes by kind; desired vs ready replicas per resource;
the autoscaler's decisions; whether this replica stands by (peering). One registry per process.
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


def serve(port: int) -> None:
    start_http_server(port, addr="0.0.0.0", registry=REGISTRY)

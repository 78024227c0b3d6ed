"""`m3fleet run`: the operator process against the current kube context (or in-cluster)."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import kopf
import kubernetes

from m3fleet.controller import metrics
from m3fleet.controller.handlers import register
from m3fleet.controller.kube import KubeApi

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def api_client() -> kubernetes.client.ApiClient:
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
    return kubernetes.client.ApiClient()


def current_namespace() -> str:
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    try:
        _, context = kubernetes.config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
        return str(context.get("context", {}).get("namespace") or "default")
    except (kubernetes.config.ConfigException, TypeError):
        return "default"


def run(namespace: str | None, all_namespaces: bool, standalone: bool, liveness_port: int, metrics_port: int) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if metrics_port:
        metrics.serve(metrics_port)
    registry = kopf.OperatorRegistry()
    register(registry, KubeApi(api_client()))
    # Peers with equal priority freeze each other; a random priority lets exactly one replica be active.
    priority = int(os.environ.get("M3FLEET_PEERING_PRIORITY", random.randint(1, 10_000)))
    kopf.run(
        registry=registry,
        clusterwide=all_namespaces,
        namespaces=[] if all_namespaces else [namespace or current_namespace()],
        standalone=standalone,
        priority=priority,
        peering_name="m3fleet",
        liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
    )
    return 0

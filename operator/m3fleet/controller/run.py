"""`m3fleet run`: the operator process against the current kube context (or in-cluster).

Both kopf and our own API client log in the way the kubernetes client does (in-cluster service account,
else the kubeconfig: $KUBECONFIG or ~/.kube/config): kopf through the default login handlers of its
`SmartOperatorRegistry` (its default registry), our client through the same loaders.
"""

from __future__ import annotations

import getpass
import logging
import os
import random
import socket
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import kopf
import kubernetes
import urllib3

from m3fleet.api.cache import allowed_image_repositories, allowed_prefixes
from m3fleet.controller import metrics
from m3fleet.controller.autoscaler import Autoscaler
from m3fleet.controller.cache import (
    DEFAULT_STAGER_IMAGE,
    PATH_PREFIXES_VARIABLE,
    STAGER_IMAGE_VARIABLE,
    STAGER_IMAGES_VARIABLE,
    CacheManager,
    CacheReconciler,
)
from m3fleet.controller.handlers import PEERING_NAME, register
from m3fleet.controller.manager import Manager
from m3fleet.controller.peering import LeaseGate, PeeringGate
from m3fleet.controller.reconcile import Reconciler
from m3fleet.controller.time_to_ready_recorder import TimeToReadyRecorder
from m3fleet.controller.webhook import Webhook, WebhookError
from m3fleet.controller.webhook import register as register_webhook
from m3fleet.errors import ClusterUnreachable
from m3fleet.kubeapi import KubeApi

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
PRIORITY_VARIABLE = "M3FLEET_PEERING_PRIORITY"
LIFETIME_VARIABLE = "M3FLEET_PEERING_LIFETIME_SECONDS"
DEFAULT_PEERING_LIFETIME = 60  # kopf's own default
# kopf renews its record 5-10 s before the record expires (kopf/_core/engines/peering.py, keepalive): below 20 s a
# renewal would have under 10 s to land, and a busy apiserver would let a live peer's record lapse.
SHORTEST_PEERING_LIFETIME = 20
LONGEST_PEERING_LIFETIME = 3600


class RunError(Exception):
    """The operator cannot start as configured (no cluster credentials, a bad setting): say what to fix."""


def api_client() -> kubernetes.client.ApiClient:
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        try:
            kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise ClusterUnreachable(
                f"no cluster to talk to: not in a pod, and no usable kubeconfig ({exc}); "
                "set KUBECONFIG or run inside the cluster"
            ) from None
    return kubernetes.client.ApiClient()


def current_namespace() -> str:
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    try:
        _, context = kubernetes.config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
        return str(context.get("context", {}).get("namespace") or "default")
    except (kubernetes.config.ConfigException, TypeError, OSError):
        return "default"


def peering_priority() -> int:
    """Peers with equal priority freeze each other (kopf's rule); a random one lets exactly one replica be
    active unless the chart pins it."""
    value = _whole_number(PRIORITY_VARIABLE, "set a whole number, or unset it")
    return random.randint(1, 10_000) if value is None else value


def peering_lifetime() -> int:
    """Seconds a peer's record stands unrenewed: how long a standby waits to take over from a peer that went
    silent (docs/high-availability.md). kopf's 60 s unless the chart's peering.lifetimeSeconds sets it."""
    fix = f"set a whole number of seconds from {SHORTEST_PEERING_LIFETIME} to {LONGEST_PEERING_LIFETIME}, or unset it"
    seconds = _whole_number(LIFETIME_VARIABLE, fix)
    if seconds is None:
        return DEFAULT_PEERING_LIFETIME
    if not SHORTEST_PEERING_LIFETIME <= seconds <= LONGEST_PEERING_LIFETIME:
        why = "too short for kopf to renew a record in time" if seconds < SHORTEST_PEERING_LIFETIME else "too long"
        raise RunError(f"{LIFETIME_VARIABLE}={os.environ[LIFETIME_VARIABLE]!r} is {why}; {fix}")
    return seconds


def _whole_number(variable: str, fix: str) -> int | None:
    """The integer an environment variable sets; None when unset or empty. Anything else names it and `fix`."""
    value = os.environ.get(variable, "")
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise RunError(f"{variable}={value!r} is not an integer; {fix}") from None


def peering_identity() -> str:
    """Who we are among peers: the pod's name (POD_ID, set by the chart), else user@host with the process."""
    pod = os.environ.get("POD_ID")
    if pod:
        return pod
    return f"{user_name()}@{socket.gethostname()}/{os.getpid()}/{random.randrange(16**4):04x}"


def user_name() -> str:
    """The login name, else the numeric uid: the image runs as uid 65532, which has no passwd entry (getpass
    raises KeyError then, as it does for any uid a container runtime picks)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def call() -> None:
        first()
        second()

    return call


def run(
    namespace: str | None,
    all_namespaces: bool,
    standalone: bool,
    liveness_port: int,
    metrics_port: int,
    webhook: Webhook | None = None,
) -> int:
    if webhook is not None:
        try:
            webhook.check()  # before anything starts: a bad setting is said at once
        except WebhookError as exc:
            raise RunError(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # not a line per watch event ("Handler succeeded")
    # Not a 400-character line per retried Prometheus query on every tick: the autoscaler says once when a fleet's
    # metrics become unreadable and once when they are back (MetricsUnavailable / MetricsAvailable Events).
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    # A kubeconfig with insecure-skip-tls-verify: say so once, not on every request.
    warnings.filterwarnings("once", category=urllib3.exceptions.InsecureRequestWarning)
    scope = None if all_namespaces else (namespace or current_namespace())
    priority, lifetime, identity = peering_priority(), peering_lifetime(), peering_identity()
    api = KubeApi(api_client())
    reconciler = Reconciler(api)
    manager = Manager(reconciler, Autoscaler(api, reconciler.events), TimeToReadyRecorder(api))
    stager_image = os.environ.get(STAGER_IMAGE_VARIABLE) or DEFAULT_STAGER_IMAGE
    try:  # the admin's rules for model caches: a bad setting is said at once, before anything starts
        prefixes = allowed_prefixes(os.environ.get(PATH_PREFIXES_VARIABLE))
        images = allowed_image_repositories(os.environ.get(STAGER_IMAGES_VARIABLE), stager_image)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    cache_reconciler = CacheReconciler(
        api, stager_image, reconciler.events, scope=scope, allowed_prefixes=prefixes, allowed_images=images
    )
    caches = CacheManager(cache_reconciler, on_change=manager.cache_changed)
    if not standalone:  # one pair of gates for both queues: a paused peer stages nothing either
        caches.queue.pause()  # until the gates have looked (as the manager's queue)
        # kopf's rule says who may run; the Lease (in the operator's own namespace) who may write.
        lease = LeaseGate(
            api,
            namespace=scope or current_namespace(),
            identity=identity,
            pause=_both(manager.queue.pause, caches.queue.pause),
            resume=_both(manager.queue.resume, caches.queue.resume),
        )
        peering = PeeringGate(
            api,
            name=PEERING_NAME,
            namespace=scope,
            identity=identity,
            priority=priority,
            pause=lease.stand_down,
            resume=lease.contend,
        )
        manager.gates = (peering, lease)
    # kopf's default registry is its SmartOperatorRegistry, the one that carries kopf's default login handlers
    # (a plain OperatorRegistry has none and ends in "LoginError: Ran out of valid credentials").
    registry = kopf.get_default_registry()
    register(registry, manager, caches, peering_lifetime=lifetime)
    if webhook is not None:
        register_webhook(registry, webhook)
    if metrics_port:
        try:
            metrics.serve(metrics_port)
        except OSError as exc:
            raise RunError(f"cannot serve metrics on port {metrics_port}: {exc}; pick a free --metrics-port") from None
    kopf.run(
        registry=registry,
        clusterwide=scope is None,
        namespaces=[] if scope is None else [scope],
        standalone=standalone,
        identity=cast(Any, identity),  # kopf's Identity is a NewType of str it does not export
        priority=priority,
        peering_name="m3fleet",  # = PEERING_NAME; the chart names its peering object so (tests/chart)
        liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
    )
    return 0

"""`m3fleet run [--namespace NS | --all-namespaces]`: the operator, against the current kube context."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from m3fleet.documents import InputError
from m3fleet.errors import ClusterUnreachable


def register(sub: Any) -> None:
    parser = sub.add_parser("run", help="the operator, against the current kube context")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="watch one namespace (default: the current context's)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument("--standalone", action="store_true", help="no peering with other operator replicas")
    parser.add_argument("--liveness-port", type=int, default=8080, help="serve /healthz here (0: off)")
    parser.add_argument("--metrics-port", type=int, default=9090, help="serve Prometheus /metrics here (0: off)")
    parser.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        help="serve the validating admission webhook (HTTPS, path /validate) on this port (0: off)",
    )
    parser.add_argument("--webhook-address", default="0.0.0.0", help="the webhook's listening address")
    parser.add_argument(
        "--webhook-cert-dir", help="directory with the webhook's serving certificate: tls.crt and tls.key"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from m3fleet.controller.run import RunError  # the operator's dependencies load only for `run`
    from m3fleet.controller.run import run as run_operator
    from m3fleet.controller.webhook import Webhook

    webhook = None
    if args.webhook_port:
        if not args.webhook_cert_dir:
            raise InputError(
                "--webhook-port needs --webhook-cert-dir: the directory holding the serving certificate "
                "(tls.crt, tls.key); or leave --webhook-port 0 to run without the webhook"
            )
        webhook = Webhook(args.webhook_port, args.webhook_address, Path(args.webhook_cert_dir))
    from aiohttp import ClientConnectionError  # kopf's HTTP client

    try:
        return run_operator(
            args.namespace, args.all_namespaces, args.standalone, args.liveness_port, args.metrics_port, webhook
        )
    except RunError as exc:
        raise InputError(str(exc)) from None
    except ClientConnectionError as exc:  # kopf gave up on the API server after its retries
        raise ClusterUnreachable(
            f"the API server does not answer ({exc}); check the kube context: kubectl cluster-info"
        ) from None

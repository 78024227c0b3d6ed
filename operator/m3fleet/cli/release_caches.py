"""`m3fleet release-caches`: before an uninstall, stop the operator, then drop model caches' finalizers and node
labels (docs/uninstall.md)."""

from __future__ import annotations

import argparse
from typing import Any

from m3fleet.documents import InputError
from m3fleet.errors import ClusterUnreachable
from m3fleet.exitcodes import EXIT_OK


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "release-caches",
        help="before an uninstall: stop the operator, then drop model caches' finalizers and node labels",
        description="What helm uninstall runs first (docs/uninstall.md): scale the operator's Deployment to 0 and "
        "wait for its pods to go, then take every model cache's label off the nodes and drop its finalizer. "
        "Files, cache objects and CRDs are kept.",
    )
    released = parser.add_mutually_exclusive_group()
    released.add_argument("-n", "--namespace", help="the caches of one namespace (default: the current context's)")
    released.add_argument("-A", "--all-namespaces", action="store_true", help="the caches of every namespace")
    parser.add_argument("--operator-deployment", required=True, help="the operator's Deployment, stopped first")
    parser.add_argument("--operator-namespace", help="its namespace (default: the current context's)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from m3fleet.controller.run import api_client, current_namespace
    from m3fleet.controller.uninstall import ReleaseError, release
    from m3fleet.kubeapi import ApiError, KubeApi, NoAnswer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    scope = None if args.all_namespaces else (args.namespace or current_namespace())
    where = args.operator_namespace or current_namespace()
    try:
        said = asyncio.run(release(KubeApi(api_client()), scope, where, args.operator_deployment))
    except ReleaseError as exc:
        raise InputError(str(exc)) from None
    except NoAnswer as exc:
        raise ClusterUnreachable(f"the API server does not answer ({exc}); check the kube context") from None
    except ApiError as exc:
        raise InputError(
            f"the API server refused ({exc}); release-caches needs what the chart grants the operator plus get/patch "
            "on its Deployment and list on pods in its namespace (docs/uninstall.md)"
        ) from None
    print(f"released {len(said)} model cache(s); their files, the cache objects and the CRDs are kept")
    return EXIT_OK

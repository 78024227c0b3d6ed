"""`m3fleet` command line: plan | render | crd | run | simulate | bench | stage | completion (docs/cli.md).

Exit status (`m3fleet.exitcodes`): 0 success; 2 invalid input or an impossible spec (one message per failing
resource on stderr, nothing on stdout); 4 no cluster to talk to; 1 an internal error; others per subcommand.
Never a traceback (set M3FLEET_DEBUG=1 to see one).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from m3fleet import __version__
from m3fleet.api import KIND, MiniMaxM3Deployment, Plan, parse_resource
from m3fleet.api.cache import CACHE_KIND, MiniMaxM3ModelCache
from m3fleet.api.crd import crd_yaml
from m3fleet.api.parse import parse_cache
from m3fleet.completion import SHELLS
from m3fleet.completion import script as completion_script
from m3fleet.documents import (
    Document,
    InputError,
    dump,
    dump_objects,
    guarded,
    in_namespace,
    is_cache,
    label,
    ours,
    read_inputs,
    report,
)
from m3fleet.errors import ClusterUnreachable, SpecError, SpecErrors
from m3fleet.exitcodes import EXIT_INVALID, EXIT_OK, MEANINGS
from m3fleet.planner import plan
from m3fleet.render import cache_mount, check, render


def process(
    args: argparse.Namespace,
    each: Callable[[MiniMaxM3Deployment, dict[tuple[str, str], MiniMaxM3ModelCache]], Any],
) -> tuple[list[Any], list[str]]:
    """Parse every resource of ours in `args.filename` (each -f), in `args.namespace` (-n) when given, and apply
    `each` (with the MiniMaxM3ModelCaches of the same input, by namespace and name); collect results and
    per-resource errors. Documents that are not ours are skipped (stderr names them). Caches are validated, not
    planned: the operator stages them on the nodes (stderr says so)."""
    results: list[Any] = []
    read, unreadable = read_inputs(args.filename)
    problems = [f"error: {e}" for e in unreadable]
    docs: list[Document] = []
    for doc in ours(read):
        try:
            docs.append(in_namespace(doc, args.namespace))
        except SpecError as exc:
            problems.append(report(doc, exc))
    if not docs and not problems:
        print(f"note: no {KIND} in the input", file=sys.stderr)
    caches: dict[tuple[str, str], MiniMaxM3ModelCache] = {}
    for doc in docs:
        if not is_cache(doc.body):
            continue
        try:
            cache = parse_cache(doc.body)
            caches[cache.metadata.namespace, cache.metadata.name] = cache
            print(
                f"note: {label(doc)}: {CACHE_KIND}, validated; not planned (the operator stages it on the nodes)",
                file=sys.stderr,
            )
        except (SpecError, SpecErrors) as exc:
            problems.append(report(doc, exc))
    for doc in docs:
        if is_cache(doc.body):
            continue
        try:
            resource = parse_resource(doc.body)
            results.append(each(resource, caches))
        except (SpecError, SpecErrors) as exc:
            problems.append(report(doc, exc))
    return results, problems


def _render(resource: MiniMaxM3Deployment, caches: dict[tuple[str, str], MiniMaxM3ModelCache]) -> list[Any]:
    ref = resource.spec.model.cache_ref
    cache = caches.get((resource.metadata.namespace, ref.name)) if ref is not None else None
    return render(resource, plan(resource.spec), cache=cache_mount(resource, cache))


def plan_dict(p: Plan) -> dict[str, Any]:
    return p.model_dump(by_alias=True, mode="json", exclude_none=True)


PLAN_COLUMNS: Sequence[tuple[str, Callable[[str, Plan], object]]] = (
    ("NAME", lambda n, p: n),
    ("ENGINE", lambda n, p: p.engine),
    ("ACCEL", lambda n, p: p.accelerator),
    ("VARIANT", lambda n, p: p.variant),
    ("STRATEGY", lambda n, p: p.strategy),
    ("TP", lambda n, p: p.tensor_parallel_size),
    ("DP", lambda n, p: p.data_parallel_size),
    ("EP", lambda n, p: p.expert_parallel_size),
    ("GPUS", lambda n, p: p.gpus_per_replica),
    ("NODES", lambda n, p: p.nodes_per_replica),
    ("CONTEXT", lambda n, p: p.max_model_len),
    ("KV", lambda n, p: p.kv_cache_dtype),
    ("KV-TOKENS", lambda n, p: p.kv_cache_tokens_per_replica),
    ("SEQS@MAX", lambda n, p: p.max_sequences_at_max_len),
    ("VALIDATED", lambda n, p: "yes" if p.validated else "no"),
)


CACHE_COLUMN: tuple[str, Callable[[str, Plan], object]] = (
    "CACHE",
    lambda n, p: f"{p.model_cache} ({p.model_cache_node_affinity})" if p.model_cache else "-",
)


def format_table(rows: list[tuple[str, Plan]]) -> str:
    columns = [*PLAN_COLUMNS, *([CACHE_COLUMN] if any(p.model_cache for _, p in rows) else [])]
    cells = [[h for h, _ in columns]] + [[str(f(n, p)) for _, f in columns] for n, p in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells) + "\n"


def _plan(resource: MiniMaxM3Deployment, caches: dict[tuple[str, str], MiniMaxM3ModelCache]) -> tuple[str, Plan]:
    """The plan, once everything `render` (and so the admission webhook) would refuse is ruled out."""
    planned = plan(resource.spec)
    ref = resource.spec.model.cache_ref
    check(resource, planned, caches.get((resource.metadata.namespace, ref.name)) if ref is not None else None)
    return resource.metadata.name, planned


def cmd_plan(args: argparse.Namespace) -> int:
    results, problems = process(args, _plan)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return EXIT_INVALID
    if args.output == "table":
        sys.stdout.write(format_table(results) if results else "")  # as kubectl: no header over nothing
    elif args.output == "json":
        sys.stdout.write(dump([plan_dict(p) for _, p in results], "json"))
    else:
        sys.stdout.write(dump([plan_dict(p) for _, p in results], "yaml"))
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    results, problems = process(args, _render)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return EXIT_INVALID
    sys.stdout.write(dump_objects([obj for objects in results for obj in objects], args.output))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from m3fleet.controller.run import RunError, run  # the operator's dependencies load only for `run`
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
        return run(args.namespace, args.all_namespaces, args.standalone, args.liveness_port, args.metrics_port, webhook)
    except RunError as exc:
        raise InputError(str(exc)) from None
    except ClientConnectionError as exc:  # kopf gave up on the API server after its retries
        raise ClusterUnreachable(
            f"the API server does not answer ({exc}); check the kube context: kubectl cluster-info"
        ) from None


def cmd_release_caches(args: argparse.Namespace) -> int:
    import asyncio

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


def cmd_crd(args: argparse.Namespace) -> int:
    sys.stdout.write(crd_yaml(args.kind))
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(build_parser(), args.shell))
    return EXIT_OK


EPILOG = "exit status:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in MEANINGS.items())
INPUT_HELP = "YAML file, directory, or - for stdin (repeatable); documents that are not ours are skipped"


def _input_flags(parser: argparse.ArgumentParser) -> None:
    """-f and -n of `plan` and `render`, as kubectl's."""
    parser.add_argument("-f", "--filename", required=True, action="append", help=INPUT_HELP)
    parser.add_argument(
        "-n",
        "--namespace",
        help="the namespace of resources that name none; one that names another is an error (as kubectl)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="m3fleet",
        description="Plan, render and run MiniMax-M3 inference fleets (docs/cli.md).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_plan = sub.add_parser("plan", help="the GPU layout of each MiniMaxM3Deployment in FILE")
    _input_flags(p_plan)
    p_plan.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    p_plan.set_defaults(func=cmd_plan)

    p_render = sub.add_parser("render", help="every Kubernetes object the operator would create, offline")
    _input_flags(p_render)
    p_render.add_argument(
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="YAML documents, or JSON as a v1 List"
    )
    p_render.set_defaults(func=cmd_render)

    p_crd = sub.add_parser("crd", help="the CustomResourceDefinition YAML")
    p_crd.add_argument("--kind", choices=(KIND, CACHE_KIND), default=KIND, help="which CRD (default: %(default)s)")
    p_crd.set_defaults(func=cmd_crd)

    from m3fleet.autoscaling.cli import register as register_simulate

    register_simulate(sub)

    from m3fleet.bench.cli import register as register_bench

    register_bench(sub)

    from m3fleet.cache.stage import register as register_stage

    register_stage(sub)

    p_run = sub.add_parser("run", help="the operator, against the current kube context")
    scope = p_run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="watch one namespace (default: the current context's)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    p_run.add_argument("--standalone", action="store_true", help="no peering with other operator replicas")
    p_run.add_argument("--liveness-port", type=int, default=8080, help="serve /healthz here (0: off)")
    p_run.add_argument("--metrics-port", type=int, default=9090, help="serve Prometheus /metrics here (0: off)")
    p_run.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        help="serve the validating admission webhook (HTTPS, path /validate) on this port (0: off)",
    )
    p_run.add_argument("--webhook-address", default="0.0.0.0", help="the webhook's listening address")
    p_run.add_argument(
        "--webhook-cert-dir", help="directory with the webhook's serving certificate: tls.crt and tls.key"
    )
    p_run.set_defaults(func=cmd_run)

    p_release = sub.add_parser(
        "release-caches",
        help="before an uninstall: stop the operator, then drop model caches' finalizers and node labels",
        description="What helm uninstall runs first (docs/uninstall.md): scale the operator's Deployment to 0 and "
        "wait for its pods to go, then take every model cache's label off the nodes and drop its finalizer. "
        "Files, cache objects and CRDs are kept.",
    )
    released = p_release.add_mutually_exclusive_group()
    released.add_argument("-n", "--namespace", help="the caches of one namespace (default: the current context's)")
    released.add_argument("-A", "--all-namespaces", action="store_true", help="the caches of every namespace")
    p_release.add_argument("--operator-deployment", required=True, help="the operator's Deployment, stopped first")
    p_release.add_argument("--operator-namespace", help="its namespace (default: the current context's)")
    p_release.set_defaults(func=cmd_release_caches)

    p_completion = sub.add_parser(
        "completion",
        help="a shell completion script",
        description="Print a completion script. bash: source <(m3fleet completion bash); "
        "zsh (in ~/.zshrc, after compinit): source <(m3fleet completion zsh).",
    )
    p_completion.add_argument("shell", choices=SHELLS)
    p_completion.set_defaults(func=cmd_completion)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return guarded(lambda: int(args.func(args)))


if __name__ == "__main__":
    sys.exit(main())

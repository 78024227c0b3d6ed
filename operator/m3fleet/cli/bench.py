"""`m3fleet bench`: benchmark a running deployment with its engine's own benchmark client.

Exit status (`m3fleet.exitcodes`): 0 the benchmark ran and its result is kept; 2 invalid input (an unknown
resource, one that is not Ready, an option the deployment cannot serve) with one line naming the option or field,
the reason and the fix, and nothing created; 4 no cluster to talk to; 5 the benchmark could not run or failed;
130 interrupted (the Job is deleted).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from typing import Any, TextIO

from m3fleet.api import MiniMaxM3Deployment, parse_resource
from m3fleet.api.models import EngineName
from m3fleet.bench import job as bench_job
from m3fleet.bench import results, watch
from m3fleet.bench.job import BenchOptions, Dataset, Prompts
from m3fleet.documents import dump, dump_objects, one_deployment, parse_one
from m3fleet.errors import SpecError
from m3fleet.exitcodes import EXIT_BENCH_FAILED, EXIT_INTERRUPTED, EXIT_OK

POLL_SECONDS = 5.0
LOG_TAIL_LINES = 40


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="benchmark a running deployment with its engine's own benchmark client",
        description="Run the engine's own benchmark client (vllm bench serve, SGLang's bench_serving, TensorRT-LLM's "
        "benchmark_serving) from the engine image as a Job against the resource's Service, wait for it, print "
        "the summary table and keep the raw results in a ConfigMap owned by the resource. Defaults are the "
        "deployment guide's benchmark (vLLM and SGLang: random 2048/1024 tokens, concurrency 10, 100 prompts; "
        "TensorRT-LLM: 1024/1024, concurrency 32..1024, 5 prompts per slot).",
    )
    parser.add_argument("-f", "--filename", required=True, help="a file with the one MiniMaxM3Deployment to benchmark")
    parser.add_argument("-n", "--namespace", help="the resource's namespace (default: the file's, else the context's)")
    parser.add_argument("--dry-run", action="store_true", help="print the Job it would create and stop (offline)")
    parser.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json"),
        help="print the Job (--dry-run), or the full result instead of the table",
    )
    parser.add_argument("--dataset", choices=[d.value for d in Dataset], default=Dataset.RANDOM.value)
    parser.add_argument("--dataset-path", default="", help="ShareGPT JSON file as the Job sees it (--dataset sharegpt)")
    parser.add_argument("--input-len", type=int, help="prompt tokens per request (random dataset)")
    parser.add_argument("--output-len", type=int, help="generated tokens per request (EOS ignored)")
    parser.add_argument("--concurrency", help="concurrent requests, or a list run in turn, e.g. 32,64,128")
    parser.add_argument("--num-prompts", help="prompts per run (e.g. 100) or per concurrency slot (e.g. 5x)")
    parser.add_argument(
        "--api-key-secret",
        metavar="NAME/KEY",
        help="the Secret key holding the endpoint's API key (sent as OPENAI_API_KEY -> Authorization: Bearer)",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=bench_job.DEFAULT_TIMEOUT_SECONDS,
        help="seconds the whole benchmark may take (the Job's activeDeadlineSeconds; default 3 h)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Bad input and internal errors are reported by `m3fleet.documents.guarded`; a failed benchmark here."""
    from m3fleet.bench.kube import BenchFailure

    try:
        return _run(args, sys.stdout, sys.stderr)
    except BenchFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BENCH_FAILED


def _one_resource(args: argparse.Namespace) -> tuple[MiniMaxM3Deployment, str | None]:
    """The one resource in -f and the namespace its file names (None when it names none)."""

    doc = one_deployment(args.filename, "bench")
    meta = doc.body.get("metadata") if isinstance(doc.body, dict) else None
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    return parse_one(doc, parse_resource), str(namespace) if namespace else None


def options_from(args: argparse.Namespace, engine: EngineName) -> BenchOptions:
    return bench_job.options_for(
        engine,
        dataset=Dataset(args.dataset),
        dataset_path=args.dataset_path,
        input_len=args.input_len,
        output_len=args.output_len,
        concurrency=bench_job.parse_concurrency(args.concurrency) if args.concurrency is not None else None,
        prompts=Prompts.parse(args.num_prompts) if args.num_prompts is not None else None,
        api_key=bench_job.parse_secret_ref(args.api_key_secret) if args.api_key_secret else None,
        timeout_seconds=args.timeout,
    )


def _with_namespace(resource: MiniMaxM3Deployment, namespace: str) -> MiniMaxM3Deployment:
    return resource.model_copy(update={"metadata": resource.metadata.model_copy(update={"namespace": namespace})})


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from m3fleet.planner import plan as make_plan

    resource, file_namespace = _one_resource(args)
    if args.namespace and file_namespace and args.namespace != file_namespace:
        raise SpecError(
            "-n",
            f"{args.namespace} differs from the file's metadata.namespace {file_namespace}",
            "drop -n, or make them agree",
        )
    options = options_from(args, EngineName(resource.spec.engine.name))
    namespace = args.namespace or file_namespace or "default"
    resource = _with_namespace(resource, namespace)
    plan = make_plan(resource.spec)
    bench_job.check(resource, plan, options)  # before any cluster is contacted; the live spec is checked again
    if args.dry_run:
        options = _with_api_key(options, resource)
        out.write(dump_objects([bench_job.render_job(resource, plan, options, "dry-run")], args.output or "yaml"))
        return EXIT_OK
    return _live(args, resource, file_namespace, options, out, err)


def _with_api_key(options: BenchOptions, resource: MiniMaxM3Deployment) -> BenchOptions:
    from dataclasses import replace

    return replace(options, api_key=bench_job.api_key_ref(resource, options.api_key))


def _live(
    args: argparse.Namespace,
    from_file: MiniMaxM3Deployment,
    file_namespace: str | None,
    options: BenchOptions,
    out: TextIO,
    err: TextIO,
) -> int:
    from m3fleet.bench.kube import Cluster
    from m3fleet.planner import plan as make_plan

    cluster = Cluster()
    namespace = args.namespace or file_namespace or cluster.namespace
    name = from_file.metadata.name
    live = cluster.resource(namespace, name)
    if live is None:
        raise SpecError(
            "-f",
            f"minimaxm3deployment {namespace}/{name} does not exist in kube context {cluster.context!r}",
            f"create it first (kubectl apply -f {args.filename}), or name the right namespace with -n",
        )
    not_ready = watch.ready(live)
    if not_ready is not None:
        raise SpecError(
            "-f",
            f"minimaxm3deployment {namespace}/{name} cannot be benchmarked: {not_ready}",
            f"wait for it: kubectl wait m3d/{name} -n {namespace} --for=condition=Ready --timeout=90m",
        )
    resource = parse_resource(live)  # what runs, which may differ from the file
    if resource.spec != from_file.spec:
        print(
            f"note: the live spec of {namespace}/{name} differs from {args.filename}; benchmarking the live one",
            file=err,
        )
    plan = make_plan(resource.spec)
    options = options_from(args, EngineName(resource.spec.engine.name))  # the live engine's recipe defaults
    options = _with_api_key(options, resource)
    bench_job.check(resource, plan, options)

    run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    job = bench_job.render_job(resource, plan, options, run_id)
    owner = bench_job.owner_reference(live)
    job["metadata"]["ownerReferences"] = [owner]
    target = bench_job.target(resource, plan)
    job_name = job["metadata"]["name"]
    prompts = ", ".join(str(options.prompts.at(c)) for c in options.concurrency)
    lengths = f"{options.input_len}/{options.output_len} tokens" if options.input_len else "ShareGPT prompts"
    print(
        f"benchmarking {namespace}/{name} ({target.engine}, image {target.image}) at {target.url}\n"
        f"  {target.client}: {options.dataset.value} {lengths}, concurrency {','.join(map(str, options.concurrency))}, "
        f"prompts {prompts}\n  Job {namespace}/{job_name}",
        file=err,
    )
    started = dt.datetime.now(dt.UTC)
    cluster.create_job(job)
    try:
        outcome, pod_name = _wait(cluster, namespace, job_name, options, err)
    except KeyboardInterrupt:
        cluster.delete_job(namespace, job_name)
        print(f"\ninterrupted: deleted Job {namespace}/{job_name}", file=err)
        return EXIT_INTERRUPTED
    log = cluster.log(namespace, pod_name) if pod_name else ""
    runs, raw = results.runs_from_log(log, options)
    finished = dt.datetime.now(dt.UTC)
    if not runs:
        raise _failure(namespace, job_name, outcome, log, "no run finished")
    trouble = results.problems(runs)
    if len(runs) < len(options.concurrency):
        trouble.append(f"{len(runs)} of {len(options.concurrency)} runs finished")
    failed = outcome[0] != "Complete" or bool(trouble)
    result = results.BenchResult(
        resource={"name": name, "namespace": namespace, "uid": str(live["metadata"].get("uid", ""))},
        job=job_name,
        target={
            "engine": str(target.engine),
            "client": target.client,
            "image": target.image,
            "service": target.service,
            "url": target.url,
            "model": target.model,
        },
        parameters=options.describe(),
        spec=resource.spec.model_dump(by_alias=True, mode="json"),
        plan=plan.model_dump(by_alias=True, mode="json"),
        ready_replicas=int((live.get("status") or {}).get("readyReplicas") or 0),
        started=started.isoformat(timespec="seconds"),
        finished=finished.isoformat(timespec="seconds"),
        complete=not failed,
        runs=tuple(runs),
        raw=raw,
    )
    cluster.create_config_map(results.config_map(result, owner, bench_job.labels(name, run_id)))
    if args.output == "json":
        out.write(json.dumps(result.to_document(), indent=2) + "\n")
    elif args.output == "yaml":
        out.write(dump([result.to_document()], "yaml"))
    else:
        out.write(results.format_table(result.runs))
    jsonpath = "'{.data.result\\.json}'"
    kept = f"configmap {namespace}/{job_name} (kubectl get configmap {job_name} -n {namespace} -o jsonpath={jsonpath})"
    if failed:
        print(f"kept the {len(runs)} finished run(s) in {kept}", file=err)
        raise _failure(namespace, job_name, outcome, log, "; ".join(trouble))
    cluster.delete_job(namespace, job_name)
    print(f"result kept in {kept}", file=err)
    return EXIT_OK


def _failure(namespace: str, job_name: str, outcome: tuple[str, str], log: str, what: str) -> Exception:
    from m3fleet.bench.kube import BenchFailure

    tail = "\n".join(results.without_results(log).rstrip().splitlines()[-15:])
    shown = f"\n--- last lines of its log ---\n{tail}" if tail else " (its log is empty)"
    return BenchFailure(
        f"Job {namespace}/{job_name} {outcome[0].lower()}{': ' + outcome[1] if outcome[1] else ''}; {what}; "
        f"the Job is kept for a day: kubectl logs job/{job_name} -n {namespace}{shown}"
    )


def _wait(
    cluster: Any, namespace: str, job_name: str, options: BenchOptions, err: TextIO
) -> tuple[tuple[str, str], str | None]:
    """Poll the Job until it finishes, showing progress; returns its outcome and its pod's name."""
    from m3fleet.bench.kube import BenchFailure

    deadline = time.monotonic() + options.timeout_seconds + 300  # the Job's own deadline fires first
    start = time.monotonic()
    shown = ""
    tty = err.isatty()
    pod_name: str | None = None
    while True:
        job = cluster.job(namespace, job_name)
        pod = cluster.job_pod(namespace, job_name)
        pod_name = (pod or {}).get("metadata", {}).get("name") or pod_name
        outcome = watch.job_outcome(job)
        if outcome is not None:
            if tty:
                err.write("\n")
            return outcome, pod_name
        state = watch.pod_state(pod)
        if state.fatal is not None:
            cluster.delete_job(namespace, job_name)
            raise BenchFailure(f"the benchmark pod cannot start: {state.fatal}; deleted Job {namespace}/{job_name}")
        text = state.text
        if state.text == "Running" and pod_name:
            text = watch.progress(cluster.log(namespace, pod_name, LOG_TAIL_LINES)) or "Running"
        elapsed = int(time.monotonic() - start)
        if tty:
            err.write(f"\r\033[K  {text} [{elapsed // 60}m{elapsed % 60:02d}s]")
            err.flush()
        elif text != shown:
            print(f"  {text} [{elapsed // 60}m{elapsed % 60:02d}s]", file=err)
        shown = text
        if time.monotonic() > deadline:
            cluster.delete_job(namespace, job_name)
            raise BenchFailure(f"the Job did not finish within --timeout {options.timeout_seconds} s; deleted it")
        time.sleep(POLL_SECONDS)

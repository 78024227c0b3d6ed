"""Benchmark: the real operator (kopf, in-process) against the apiserver emulator, N resources at once.

    python3 tests/bench/bench_operator.py [--resources 1000] [--quiet 30] [--resync 10]
                                          [--per-namespace 20] [--sample vllm-h200-tp8]

Creates N MiniMaxM3Deployments (spread over namespaces of `--per-namespace`), and measures:

* convergence: until every resource has a status for its generation;
* at rest: until kopf has also handled every creation and drained every event queue;
* writes (the emulator's counter) by kind: the operator's own (server-side applies, Secret creates,
  status patches) against the minimum of one apply per child plus one status write per resource;
  kopf's annotation patches and the Events it posts, separately;
* writes in a quiet period of at least `--quiet` seconds and at least one resync of every resource
  (must be 0: exit status 1 otherwise);
* peak RSS of the process, which the operator, kopf and the emulator share (the emulator keeps every
  version of every object: its share is estimated separately).

Not collected by pytest (bench_*.py); tests/operator/test_bench_smoke.py runs it with 20 resources.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tests.*` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp.web
import attrs
import kmock
import kopf

from m3fleet.controller import metrics
from tests.kube.emulator import ApiServerEmulator
from tests.operator.harness import (
    VLLM,
    Cluster,
    add_namespace,
    fresh_cluster,
    operator_requests,
    rbac_rule,
    rbac_violations,
    sample,
)

DRIVER_WRITES = {"POST minimaxm3deployments"}  # the benchmark's own creates
KOPF_PATCHES = "PATCH minimaxm3deployments"  # kopf's annotations (last-handled-configuration, progress)
EVENTS = "POST events"  # Events, posted by kopf (the operator's kopf.info "Applied ..." among them)
IDLE_SECONDS = 1.0  # kopf's per-object workers exit after this long without events
LAST_HANDLED = "m3fleet.dev/last-handled-configuration"  # kopf's diff-base annotation (handlers.configure)


@attrs.define(kw_only=True)
class LeanEmulator(ApiServerEmulator):
    """The emulator without its two per-request scans of everything it ever stored or served.

    * kmock matches every request against its whole request log (`request in reaction._source` walks
      it with the reaction's criteria), which makes a long run quadratic: 600 requests cost ~40 s of
      CPU. Only the last `keep` requests stay (in the log and in each reaction's own list, which would
      otherwise hold every request body in memory), plus one example per RBAC rule of the operator's.
    * The emulator adopts objects a test put into `kmock.objects` by hand, scanning every object on
      every request; the benchmark writes only through the API, so there is nothing to adopt.

    What is measured is the operator; the emulator's cost per request stays flat with N.
    """

    keep: int = 2
    rbac_examples: dict[tuple[str, str, str] | None, kmock.Request] = attrs.field(factory=dict, init=False)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if len(self._requests) > 2 * self.keep:  # a new request is matched right after it is logged
            dropped, self._requests[:] = self._requests[: -self.keep], self._requests[-self.keep :]
            for request in operator_requests(dropped):
                rule = rbac_rule(str(request.method.value), request.url.path, dict(request.params))
                self.rbac_examples.setdefault(rule, request)
            for reaction in self._payloads:  # each reaction keeps the requests it served, too
                del reaction._requests[: -self.keep]
        return await super().__call__(raw_request)

    def _adopt_foreign_objects(self) -> None:
        pass

    def rbac_violations(self) -> list[str]:
        return rbac_violations([*self.rbac_examples.values(), *operator_requests(self)])


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reconciles() -> float:
    return sum(
        metrics.REGISTRY.get_sample_value("m3fleet_reconciles_total", {"result": r}) or 0
        for r in ("ok", "blocked", "error")
    )


@dataclasses.dataclass
class BenchResult:
    resources: int
    children_per_resource: float
    converge_seconds: float
    at_rest_seconds: float
    writes: collections.Counter[str]  # "METHOD plural[/subresource]" -> count, from creation until at rest
    reconciles: float
    quiet_seconds: float
    quiet_reconciles: float
    quiet_writes: collections.Counter[str]
    rss_before_mib: float
    peak_rss_mib: float
    emulator_store_mib: float
    rbac_violations: list[str]  # requests outside kube.RBAC (must be none)

    @property
    def operator_writes(self) -> int:
        return sum(n for k, n in self.writes.items() if k not in DRIVER_WRITES | {KOPF_PATCHES, EVENTS})

    @property
    def minimum_writes(self) -> float:
        return self.resources * (self.children_per_resource + 1)  # one apply per child, one status write

    @property
    def ratio(self) -> float:
        return self.operator_writes / self.minimum_writes

    def table(self) -> str:
        n = self.resources
        rows = [
            ("resources", f"{n}"),
            ("children per resource", f"{self.children_per_resource:g}"),
            ("convergence (every status written)", f"{self.converge_seconds:.1f} s"),
            ("at rest (kopf handled every event)", f"{self.at_rest_seconds:.1f} s"),
            *((f"  writes {k}", f"{v}") for k, v in sorted(self.writes.items())),
            ("operator writes per resource", f"{self.operator_writes / n:.2f}"),
            ("minimum per resource (children + status)", f"{self.children_per_resource + 1:g}"),
            ("ratio to the minimum", f"{self.ratio:.3f}"),
            ("kopf annotation patches per resource", f"{self.writes[KOPF_PATCHES] / n:.2f}"),
            ("events posted per resource", f"{self.writes[EVENTS] / n:.2f}"),
            ("reconciles per resource (until at rest)", f"{self.reconciles / n:.2f}"),
            (
                f"writes in {self.quiet_seconds:.0f} s quiet ({self.quiet_reconciles / n:.1f} resyncs each)",
                f"{sum(self.quiet_writes.values())}",
            ),
            *((f"  quiet {k}", f"{v}") for k, v in sorted(self.quiet_writes.items())),
            ("RSS before the operator started", f"{self.rss_before_mib:.0f} MiB"),
            ("peak RSS (operator + kopf + emulator)", f"{self.peak_rss_mib:.0f} MiB"),
            ("  of which the emulator's stored objects", f"~{self.emulator_store_mib:.0f} MiB"),
            ("requests outside kube.RBAC", f"{len(self.rbac_violations)}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v:>10}" for k, v in rows)


def deep_size_mib(root: object) -> float:
    """Python's memory for a JSON-like structure (dicts, lists, strings), each object counted once."""
    seen: set[int] = set()
    stack, total = [root], 0
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total / 2**20


def stored_versions(emulator: ApiServerEmulator) -> list[object]:
    return [version.raw for _, obj in emulator.objects.items() for version in obj.history if version is not None]


def handled_by_kopf(cluster: Cluster, name: str) -> bool:
    """kopf recorded the creation as handled (its annotation patch follows the create handler)."""
    annotations = cluster.m3d(name)["metadata"].get("annotations") or {}
    return LAST_HANDLED in annotations


def quick_idle(settings: kopf.OperatorSettings) -> None:
    settings.queueing.idle_timeout = IDLE_SECONDS  # kopf's default 5 s only delays noticing the drained queues


async def kopf_drained(timeout: float, poll: float) -> None:
    """Wait until kopf has no per-object worker left: each exits when it had no event for IDLE_SECONDS."""
    deadline = time.monotonic() + timeout
    while any(t.get_name().startswith("worker for ") for t in asyncio.all_tasks()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"kopf still processing events after {timeout} s")
        await asyncio.sleep(poll)


async def wait_all(
    clusters: list[Cluster], names: list[str], done: Callable[[Cluster, str], bool], timeout: float, poll: float
) -> None:
    pending = {(cluster, name) for cluster in clusters for name in names}
    deadline = time.monotonic() + timeout
    while pending:
        pending = {(cluster, name) for cluster, name in pending if not done(cluster, name)}
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} resources not done after {timeout} s")
        await asyncio.sleep(poll)


async def run_benchmark(
    resources: int,
    *,
    per_namespace: int = 20,
    quiet: float = 30.0,
    resync: float = 10.0,
    sample_name: str = VLLM,
    timeout: float = 1800,
) -> BenchResult:
    async with fresh_cluster(LeanEmulator) as cluster:
        emulator = cluster.kmock
        assert isinstance(emulator, LeanEmulator)
        namespaces = [f"bench-{i:03d}" for i in range(-(-resources // per_namespace))]
        for namespace in namespaces:
            add_namespace(emulator, namespace)
        clusters = [Cluster(emulator, namespace) for namespace in namespaces]
        names = [f"m3-bench-{i:03d}" for i in range(per_namespace)]
        rss_before, reconciles_before = peak_rss_mib(), reconciles()
        poll = min(0.5, max(0.05, resources / 2000))  # checking every resource costs time on the shared loop
        async with cluster.operator(resync=resync, namespaces=namespaces, settings_hook=quick_idle):
            started = time.monotonic()
            created = 0
            for name in names:  # round-robin over the namespaces, as a fleet grows
                for view in clusters:
                    if created < resources:
                        doc = sample(sample_name, view.namespace)
                        doc["metadata"]["name"] = name
                        await view.create(doc)
                        created += 1
            await wait_all(clusters, names, Cluster.converged, timeout, poll)
            converged = time.monotonic() - started
            # The statuses can all be written while kopf still works through its event backlog: at rest
            # means kopf has handled every creation and processed every event, and nothing is written.
            await wait_all(clusters, names, handled_by_kopf, timeout, poll)
            await kopf_drained(timeout, poll)
            at_rest = max(converged, time.monotonic() - started - IDLE_SECONDS)
            await cluster.settled(quiet=0.5, timeout=timeout)
            writes = emulator.writes(by_method=True)
            children = len(clusters[0].children(names[0]))  # every resource has the same set
            done = reconciles() - reconciles_before

            emulator.reset_writes()
            quiet_started, quiet_before = time.monotonic(), reconciles()
            await asyncio.sleep(quiet)
            while reconciles() - quiet_before < resources:  # until every resource was resynced at least once
                await asyncio.sleep(poll)
            quiet_writes = emulator.writes(by_method=True)
            quiet_seconds, quiet_reconciles = time.monotonic() - quiet_started, reconciles() - quiet_before
        peak = peak_rss_mib()  # before measuring the store, which needs memory of its own
        violations = emulator.rbac_violations()
        store = deep_size_mib(stored_versions(emulator))
    return BenchResult(
        resources=resources,
        children_per_resource=children,
        converge_seconds=converged,
        at_rest_seconds=at_rest,
        writes=writes,
        reconciles=done,
        quiet_seconds=quiet_seconds,
        quiet_reconciles=quiet_reconciles,
        quiet_writes=quiet_writes,
        rss_before_mib=rss_before,
        peak_rss_mib=peak,
        emulator_store_mib=store,
        rbac_violations=violations,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=1000)
    parser.add_argument("--quiet", type=float, default=30.0, help="minimum seconds of quiet period at rest")
    parser.add_argument("--resync", type=float, default=10.0, help="the operator's resync interval (seconds)")
    parser.add_argument("--sample", default=VLLM, help="manifests/samples/<name>.yaml for every resource")
    parser.add_argument("--per-namespace", type=int, default=20, help="resources per namespace")
    args = parser.parse_args(argv)
    result = asyncio.run(
        run_benchmark(
            args.resources,
            per_namespace=args.per_namespace,
            quiet=args.quiet,
            resync=args.resync,
            sample_name=args.sample,
        )
    )
    print(result.table())
    print(*result.rbac_violations, sep="\n")
    return 1 if sum(result.quiet_writes.values()) or result.rbac_violations else 0


if __name__ == "__main__":
    sys.exit(main())

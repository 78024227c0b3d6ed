"""Benchmark: the operator as users run it (`m3fleet run`, a process of its own), N resources at once,
against the apiserver emulator and against a real control plane (tests/support/cluster/bench.py), side by side.

    python3 tests/bench/bench_operator.py [--resources 1000] [--real-resources 300] [--quiet 30]
                                          [--per-namespace 20] [--sample vllm-h200-tp8] [--tier both]

Creates N MiniMaxM3Deployments (spread over namespaces of `--per-namespace`; the operator watches all
namespaces), and measures:

* convergence: until every resource has a status for its generation;
* at rest: until the operator has also stopped sending requests;
* the operator's requests by verb and resource: its writes (server-side applies, Secret creates, status
  patches) against the minimum of one apply per child plus one status write per resource, its Events,
  its dry runs, and its reads;
* requests in a quiet period of at least `--quiet` seconds at rest (writes and reads must be 0, exit
  status 1 otherwise: no resync, no polling);
* the operator process's peak RSS.

`BenchResult` holds only counts and times, so a run against a real API server (whose requests are counted
some other way) reports through the same `table()`. Not collected by pytest (bench_*.py);
tests/operator/test_bench_smoke.py runs it with 20 resources.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tests.*` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp.web
import attrs
import kmock

from tests.kube.emulator import ApiServerEmulator
from tests.operator.harness import (
    VLLM,
    Cluster,
    add_namespace,
    fresh_cluster,
    operator_requests,
    rbac_rule,
    rbac_violations,
    running_operator,
    sample,
)

WRITE_VERBS = frozenset({"create", "patch", "update", "delete"})
READ_VERBS = frozenset({"get", "list"})
DRY_RUN = " (dry run)"


@attrs.define(kw_only=True)
class LeanEmulator(ApiServerEmulator):
    """The emulator without its two per-request scans of everything it ever stored or served, and with a
    counter of the operator's requests by verb and resource.

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
    traffic: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if len(self._requests) > 2 * self.keep:  # a new request is matched right after it is logged
            dropped, self._requests[:] = self._requests[: -self.keep], self._requests[-self.keep :]
            for request in operator_requests(dropped):
                rule = rbac_rule(str(request.method.value), request.url.path, dict(request.params))
                self.rbac_examples.setdefault(rule, request)
            for reaction in self._payloads:  # each reaction keeps the requests it served, too
                del reaction._requests[: -self.keep]
        return await super().__call__(raw_request)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if operator_requests([request]):
            rule = rbac_rule(str(request.method.value), request.url.path, dict(request.params))
            verb, resource = (rule[2], rule[1]) if rule is not None else ("get", "discovery")
            self.traffic[f"{verb} {resource}{DRY_RUN if request.params.get('dryRun') else ''}"] += 1
        return await super()._handle(request)

    def _adopt_foreign_objects(self) -> None:
        pass

    def rbac_violations(self) -> list[str]:
        return rbac_violations([*self.rbac_examples.values(), *operator_requests(self)])


def count(traffic: Mapping[str, int], verbs: Iterable[str], *, exclude: Iterable[str] = ()) -> int:
    """Requests of these verbs ("patch deployments" -> verb "patch"), dry runs never included."""
    wanted, skipped = set(verbs), set(exclude)
    return sum(
        n for key, n in traffic.items() if key.split(" ", 1)[0] in wanted and key.split(" ", 1)[1] not in skipped
    )


@dataclasses.dataclass
class BenchResult:
    """Counts and times of one run. `traffic` and `quiet_traffic` count the operator's requests by
    "<verb> <resource>" ("patch deployments", "list configmaps", "patch services (dry run)", ...)."""

    resources: int
    children_per_resource: float
    converge_seconds: float
    at_rest_seconds: float
    traffic: collections.Counter[str]  # from creation until at rest
    reconciles: float
    quiet_seconds: float
    quiet_traffic: collections.Counter[str]
    operator_peak_rss_mib: float
    rbac_violations: list[str] = dataclasses.field(default_factory=list)  # requests outside permissions.RBAC

    @property
    def operator_writes(self) -> int:
        return count(self.traffic, WRITE_VERBS, exclude={"events"})

    @property
    def minimum_writes(self) -> float:
        return self.resources * (self.children_per_resource + 1)  # one apply per child, one status write

    @property
    def ratio(self) -> float:
        return self.operator_writes / self.minimum_writes

    @property
    def quiet_requests(self) -> int:
        """Writes and reads at rest (watches staying open are neither)."""
        return count(self.quiet_traffic, WRITE_VERBS | READ_VERBS) + sum(
            n for key, n in self.quiet_traffic.items() if key.endswith(DRY_RUN)
        )

    def table(self) -> str:
        n = self.resources
        dry_runs = sum(v for k, v in self.traffic.items() if k.endswith(DRY_RUN))
        rows = [
            ("resources", f"{n}"),
            ("children per resource", f"{self.children_per_resource:g}"),
            ("convergence (every status written)", f"{self.converge_seconds:.1f} s"),
            ("at rest (no request any more)", f"{self.at_rest_seconds:.1f} s"),
            *((f"  {k}", f"{v}") for k, v in sorted(self.traffic.items())),
            ("operator writes per resource", f"{self.operator_writes / n:.2f}"),
            ("minimum per resource (children + status)", f"{self.children_per_resource + 1:g}"),
            ("ratio to the minimum", f"{self.ratio:.3f}"),
            ("events posted per resource", f"{self.traffic['create events'] / n:.2f}"),
            ("dry runs per resource", f"{dry_runs / n:.2f}"),
            ("reads (get, list) per resource", f"{count(self.traffic, READ_VERBS) / n:.2f}"),
            ("reconciles per resource (until at rest)", f"{self.reconciles / n:.2f}"),
            (f"requests in {self.quiet_seconds:.0f} s at rest (writes and reads)", f"{self.quiet_requests}"),
            *((f"  quiet {k}", f"{v}") for k, v in sorted(self.quiet_traffic.items())),
            ("operator peak RSS", f"{self.operator_peak_rss_mib:.0f} MiB"),
            ("requests outside permissions.RBAC", f"{len(self.rbac_violations)}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v:>10}" for k, v in rows)


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident memory (Linux: VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


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


async def quiet_for(emulator: LeanEmulator, seconds: float, timeout: float) -> None:
    """Until the operator has sent no request for `seconds`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = sum(emulator.traffic.values())
        await asyncio.sleep(seconds)
        if sum(emulator.traffic.values()) == before:
            return
    raise TimeoutError(f"the operator still sends requests after {timeout} s")


async def run_benchmark(
    resources: int,
    *,
    per_namespace: int = 20,
    quiet: float = 30.0,
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
        poll = min(0.5, max(0.05, resources / 2000))  # checking every resource costs time on the shared loop
        with tempfile.TemporaryDirectory(prefix="m3fleet-bench-") as directory:
            async with running_operator(emulator, Path(directory), namespace=None) as operator:
                reconciles_before = await operator.metric("m3fleet_reconciles_total")
                emulator.traffic.clear()
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
                await quiet_for(emulator, 1.0, timeout)
                at_rest = time.monotonic() - started - 1.0
                traffic = collections.Counter(emulator.traffic)
                children = len(clusters[0].children(names[0]))  # every resource has the same set
                done = await operator.metric("m3fleet_reconciles_total") - reconciles_before

                emulator.traffic.clear()
                quiet_started = time.monotonic()
                await asyncio.sleep(quiet)
                quiet_traffic = collections.Counter(emulator.traffic)
                quiet_seconds = time.monotonic() - quiet_started
                rss = peak_rss_mib(operator.process.pid)
        violations = emulator.rbac_violations()
    return BenchResult(
        resources=resources,
        children_per_resource=children,
        converge_seconds=converged,
        at_rest_seconds=max(converged, at_rest),
        traffic=traffic,
        reconciles=done,
        quiet_seconds=quiet_seconds,
        quiet_traffic=quiet_traffic,
        operator_peak_rss_mib=rss,
        rbac_violations=violations,
    )


def real_tier(resources: int, quiet: float) -> tuple[str, bool]:
    """The same measurement on a real control plane (built by .ci/control-plane.sh), chart installed."""
    from tests.support.cluster import bench as real
    from tests.support.cluster.cluster import Cluster
    from tests.support.cluster.controlplane import ControlPlane, build

    workdir = Path(tempfile.mkdtemp(prefix="m3fleet-bench-"))
    control_plane = ControlPlane(build(), workdir).start()
    try:
        cluster = Cluster(control_plane, workdir)
        cluster.install_chart()
        result = real.run(cluster, resources, quiet=quiet)
    finally:
        control_plane.stop()
    ok = not result.forbidden and not result.quiet_traffic.get("write")
    return result.table(), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--resources", type=int, default=1000, help="resources on the emulator")
    parser.add_argument("--real-resources", type=int, default=300, help="resources on the real control plane")
    parser.add_argument("--quiet", type=float, default=30.0, help="seconds of quiet period at rest")
    parser.add_argument("--sample", default=VLLM, help="manifests/samples/<name>.yaml for every resource")
    parser.add_argument("--per-namespace", type=int, default=20, help="resources per namespace")
    parser.add_argument("--tier", choices=("emulator", "real", "both"), default="both")
    args = parser.parse_args(argv)
    failed = False
    if args.tier in ("emulator", "both"):
        result = asyncio.run(
            run_benchmark(args.resources, per_namespace=args.per_namespace, quiet=args.quiet, sample_name=args.sample)
        )
        print("== emulator ==")
        print(result.table())
        print(*result.rbac_violations, sep="\n")
        failed |= bool(result.quiet_requests or result.rbac_violations)
    if args.tier in ("real", "both"):
        table, ok = real_tier(args.real_resources, args.quiet)
        print("== real control plane ==")
        print(table)
        failed |= not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

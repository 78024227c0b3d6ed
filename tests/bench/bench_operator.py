"""Benchmark: the operator as users run it (`m3fleet run`, a process of its own, with the chart's RBAC), N
MiniMaxM3Deployments applied at once on a real control plane (built by .ci/control-plane.sh), every request it
makes counted from the apiserver's audit log (tests/support/cluster/bench.py measures).

    python3 tests/bench/bench_operator.py [--resources 300] [--per-namespace 50] [--quiet 30]

Figures: convergence, writes per resource against the minimum (one apply per child plus the status writes),
reads and writes per resource per hour at rest (a quiet window of `--quiet` seconds: exit status 1 if the operator
writes then, or if any of its requests was forbidden), and the operator's peak RSS. Not collected by pytest
(bench_*.py); tests/cluster/test_bench_smoke.py runs the same code with 12 resources.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tests.*` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.cluster import bench
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.controlplane import ControlPlane, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--resources", type=int, default=300, help="MiniMaxM3Deployments applied at once")
    parser.add_argument("--per-namespace", type=int, default=50, help="resources per namespace")
    parser.add_argument("--quiet", type=float, default=30.0, help="seconds watched at rest")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="m3fleet-bench-"))
    control_plane = ControlPlane(build(), workdir).start()
    try:
        cluster = Cluster(control_plane, workdir)
        cluster.install_chart()
        result = bench.run(cluster, args.resources, per_namespace=args.per_namespace, quiet=args.quiet)
    finally:
        control_plane.stop()
    print(result.table())
    print(*result.forbidden, sep="\n")
    return 1 if result.forbidden or result.quiet_traffic.get("write") else 0


if __name__ == "__main__":
    sys.exit(main())

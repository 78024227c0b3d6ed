"""The operator benchmark on the real tier: N MiniMaxM3Deployments applied at once with kubectl, the
operator running as `m3fleet run` with the chart's RBAC, every request it makes counted from the
apiserver's audit log.

Figures: convergence (apply -> every resource Ready), writes per resource against the minimum (one
server-side apply per child plus the status writes: one when children are applied, one when the pods
are Ready), reads and writes per resource per hour at rest (measured over a quiet window and scaled), and
the operator process's peak RSS. Pods need nodes: the benchmark adds a few kwok nodes of the H200 pool
with room for many pods each (a density no real node has; the operator's work does not depend on it).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster.cluster import WRITE_VERBS, Cluster, OperatorProcess, eventually, is_dry_run, traffic
from tests.support.cluster.fleet import renamed, sample, weight_volumes
from tests.support.cluster.nodes import NodeSpec, node_object

CHILDREN = 4  # the one-node vLLM sample: Deployment, NetworkPolicy, PodDisruptionBudget, Service
STATUS = "patch minimaxm3deployments/status"
EVENTS = "create events"  # the Applied Event a user sees in `kubectl describe`: reported, not a state write


@dataclass
class RealTierResult:
    resources: int
    convergence_seconds: float
    writes: Counter[str] = field(default_factory=Counter)
    quiet_seconds: float = 0.0
    quiet_traffic: Counter[str] = field(default_factory=Counter)
    peak_rss_mib: float = 0.0
    forbidden: list[str] = field(default_factory=list)

    @property
    def writes_per_resource(self) -> float:
        """State writes (applies, status), against the minimum; Events are counted apart."""
        return sum(v for k, v in self.writes.items() if k != EVENTS) / self.resources

    @property
    def applies_per_resource(self) -> float:
        return sum(v for k, v in self.writes.items() if k not in (EVENTS, STATUS)) / self.resources

    @property
    def status_writes_per_resource(self) -> float:
        return self.writes.get(STATUS, 0) / self.resources

    @property
    def minimum_per_resource(self) -> int:
        """One apply per child and one status write. A real rollout passes through states a user wants to
        see (pods created, then ready), so a status write or two more is the honest figure, not waste."""
        return CHILDREN + 1

    def per_resource_per_hour(self, kind: str) -> float:
        if not self.quiet_seconds:
            return 0.0
        return self.quiet_traffic.get(kind, 0) / self.resources * 3600.0 / self.quiet_seconds

    def rows(self) -> list[tuple[str, str]]:
        reads = sum(v for k, v in self.quiet_traffic.items() if k not in ("write", "dry-run"))
        return [
            ("resources", str(self.resources)),
            ("convergence (apply -> all Ready)", f"{self.convergence_seconds:.1f} s"),
            ("operator writes per resource", f"{self.writes_per_resource:.2f} (minimum {self.minimum_per_resource})"),
            ("  applies / status writes", f"{self.applies_per_resource:.2f} / {self.status_writes_per_resource:.2f}"),
            ("  by target", ", ".join(f"{k} {v}" for k, v in sorted(self.writes.items()))),
            ("at rest: writes / resource / hour", f"{self.per_resource_per_hour('write'):.2f}"),
            ("at rest: reads / resource / hour", f"{reads / self.resources * 3600.0 / max(self.quiet_seconds, 1):.2f}"),
            ("at rest: window", f"{self.quiet_seconds:.0f} s, traffic {dict(self.quiet_traffic)}"),
            ("operator peak RSS", f"{self.peak_rss_mib:.0f} MiB"),
            ("403 Forbidden", str(len(self.forbidden))),
        ]

    def table(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in self.rows())


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _write_target(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    return f"{event.get('verb')} {ref.get('resource')}{'/' + ref['subresource'] if ref.get('subresource') else ''}"


def dense_nodes(cluster: Cluster, count: int) -> list[str]:
    """H200-labelled kwok nodes with room for 100 eight-GPU pods each."""
    names = []
    for i in range((count + 99) // 100):
        spec = NodeSpec(
            f"bench-h200-{i}",
            "amd64",
            cpu="20000",
            memory="200Ti",
            gpus=880,
            gpu_resource="nvidia.com/gpu",
            labels={"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.present": "true"},
        )
        cluster.control_plane.admin.create("/api/v1/nodes", node_object(spec, f"127.0.1.{i + 1}"))
        names.append(spec.name)
    return names


def run(cluster: Cluster, count: int, per_namespace: int = 50, quiet: float = 60.0) -> RealTierResult:
    """Assumes the chart is installed in `cluster`; leaves it as it found it (namespaces and nodes removed)."""
    nodes = dense_nodes(cluster, count)
    try:
        return _run(cluster, count, per_namespace, quiet)
    finally:
        for namespace in {f"bench-{i}" for i in range((count + per_namespace - 1) // per_namespace)}:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        eventually(
            "the benchmark's namespaces gone",
            lambda: not [n for n in cluster.list("namespaces") if n["metadata"]["name"].startswith("bench-")],
            300,
            2.0,
        )
        cluster.kubectl("delete", "node", *nodes, check=False)


def _run(cluster: Cluster, count: int, per_namespace: int, quiet: float) -> RealTierResult:
    namespaces = [f"bench-{i}" for i in range((count + per_namespace - 1) // per_namespace)]
    for namespace in namespaces:
        cluster.namespace(namespace)
        weight_volumes(cluster, namespace)
    documents = [renamed(sample("vllm-h200-tp8"), f"m3-{i:04d}", namespaces[i // per_namespace]) for i in range(count)]
    operator: OperatorProcess
    with cluster.operator("--all-namespaces", "--standalone", name="operator-bench") as operator:
        start_mark = operator.mark()
        started = time.monotonic()
        for namespace in namespaces:
            batch = [d for d in documents if d["metadata"]["namespace"] == namespace]
            cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(batch), timeout=600)

        def all_ready() -> bool:
            items = json.loads(cluster.kubectl("get", "m3d", "-A", "-o", "json", timeout=300).stdout)["items"]
            ready = sum(
                1
                for item in items
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (item.get("status") or {}).get("conditions") or []
                )
            )
            return ready >= count

        eventually(f"{count} resources Ready", all_ready, timeout=max(600.0, count * 3.0), interval=2.0)
        convergence = time.monotonic() - started
        time.sleep(5)  # the last status writes land
        converged = operator.requests_since(start_mark)
        writes = Counter(_write_target(e) for e in converged if e.get("verb") in WRITE_VERBS and not is_dry_run(e))
        quiet_mark = operator.mark()
        time.sleep(quiet)
        quiet_traffic = traffic(operator.requests_since(quiet_mark))
        return RealTierResult(
            resources=count,
            convergence_seconds=convergence,
            writes=writes,
            quiet_seconds=quiet,
            quiet_traffic=quiet_traffic,
            peak_rss_mib=_peak_rss_mib(operator.process.pid),
            forbidden=operator.forbidden(),
        )

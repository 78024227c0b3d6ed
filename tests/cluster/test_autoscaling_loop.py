"""The closed loop on the real tier: engine stand-ins -> a real Prometheus -> the operator's autoscaler
(`m3fleet run`, the chart's ServiceAccount) -> the real Deployment -> kwok's pods -> the stand-ins.

* One stand-in per running engine pod: when kwok brings a pod up, a stand-in starts exporting vLLM 0.33's
  metric format (tests/autoscaling/prom.py's `vllm_text`) on its own loopback port; when the pod goes, its
  stand-in stops. Prometheus finds them through file-based service discovery (the test writes the target
  list as Kubernetes service discovery would), each target labelled as the chart's PodMonitor labels engine
  series: `namespace`, `m3fleet_dev_name` (the fleet) and `pod` (the replica the adapter groups by).
* The load is a fleet-wide demand, in replicas' worth of KV at the 0.8 target, shared by the pods up: it
  rises (the KV term asks for more replicas), then falls (it asks for fewer). The number of requests in
  flight stays the same, so the KV term, not the arrival estimate, decides.
* Checks: the act fleet's Deployment scales up, then down; decisions and reasons in `status.autoscaling`;
  `Scaled` Events; the advisory fleet under the same load gets `ScaleRecommended` and its Deployment is
  never changed; Prometheus down -> the policy holds the last replicas and says why (and scales down once
  Prometheus is back); the resources' `spec.replicas` is never written (only the user's field manager owns
  any of `spec`, and `metadata.generation` never moves).

A LeaderWorkerSet fleet (two H200 nodes a replica) grows by a group and shrinks by a group the same way: its
leader's stand-in is the replica's metrics, and a whole group's pods come and go.

What this leaves unproven: real engines' timings and load (kwok's pods are ready within a second).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.autoscaling.prom import EngineState, MetricsServer, free_port, prometheus, vllm_text
from tests.cluster.cluster import Cluster, ClusterError, OperatorProcess
from tests.cluster.cluster import eventually as cluster_eventually
from tests.cluster.fleet import delete, operated_namespace, pods, renamed, sample, wait_ready

from m3fleet.api import parse_resource
from m3fleet.api.models import Plan
from m3fleet.planner import plan as make_plan

NAMESPACE = "loop"
ACT, ADVISORY = "loop-act", "loop-advisory"
QUIET, BUSY = 0.5, 2.5  # fleet-wide demand, in replicas' worth of KV at the 0.8 target
IN_FLIGHT = 12.0  # requests running in the fleet, whatever the demand
PROMPT = 8000.0
REQUEST_RATE = 0.05  # per pod: the counters grow steadily (no counter resets when the load changes)


def fleet(name: str, mode: str) -> dict[str, Any]:
    document = renamed(sample("vllm-h200-tp8"), name, NAMESPACE)
    document["spec"]["autoscaling"] = {
        "enabled": True,
        "mode": mode,
        "minReplicas": 1,
        "maxReplicas": 3,
        "intervalSeconds": 5,
        "coldStartSeconds": 30,
        "panicThreshold": 10,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}, "scaleUp": {"stabilizationWindowSeconds": 0}},
        "forecast": {"enabled": True},
        "prometheus": {"url": "http://127.0.0.1:9"},  # replaced by the test's Prometheus
    }
    return document


class StandIns:
    """One vLLM stand-in per running engine pod of the `plans`' fleets (of a multi-node replica, its leader: the
    only pod that serves metrics), exporting that fleet's plan's KV capacity, and the target list Prometheus
    reads."""

    def __init__(self, cluster: Cluster, targets: Path, plans: dict[str, Plan]) -> None:
        self.cluster, self.targets, self.plans = cluster, targets, plans
        self.demand: dict[str, float] = {}
        self.servers: dict[str, tuple[str, MetricsServer]] = {}  # pod -> (fleet, its stand-in)
        self.started: list[str] = []  # pods a stand-in was started for, in order
        self.stopped: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._write()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def state(self, fleet: str) -> EngineState:
        with self._lock:
            up = sum(1 for f, _ in self.servers.values() if f == fleet)
        up = max(1, up)
        usage = min(0.95, 0.8 * self.demand.get(fleet, QUIET) / up)
        return EngineState(
            running=IN_FLIGHT / up,
            waiting=0,
            kv_usage=usage,
            capacity_tokens=float(self.plans[fleet].kv_cache_tokens_per_replica),
            prompt_tokens_rate=REQUEST_RATE * PROMPT,
            generation_tokens_rate=REQUEST_RATE * 256,
            request_rate=REQUEST_RATE,
            prompt_tokens=PROMPT,
        )

    def up(self, fleet: str) -> int:
        with self._lock:
            return sum(1 for f, _ in self.servers.values() if f == fleet)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                running = {
                    p["metadata"]["name"]: p["metadata"]["labels"]["m3fleet.dev/name"]
                    for p in self.cluster.list("pods", NAMESPACE, "m3fleet.dev/name,m3fleet.dev/role!=worker")
                    if p["metadata"]["labels"]["m3fleet.dev/name"] in self.plans
                    and not p["metadata"].get("deletionTimestamp")
                    and (p.get("status") or {}).get("phase") == "Running"
                }
            except Exception:  # the apiserver busy for a moment: try again
                time.sleep(0.5)
                continue
            changed = False
            for pod, name in running.items():
                if pod not in self.servers:
                    server = MetricsServer(
                        {
                            "/metrics": lambda t, f=name: (
                                200,
                                vllm_text(self.state(f), t, max_model_len=self.plans[f].max_model_len),
                            )
                        }
                    ).__enter__()
                    with self._lock:
                        self.servers[pod] = (name, server)
                        self.started.append(pod)
                    changed = True
            for pod in [p for p in self.servers if p not in running]:
                with self._lock:
                    _, server = self.servers.pop(pod)
                    self.stopped.append(pod)
                server.__exit__(None, None, None)
                changed = True
            if changed:
                self._write()
            self._stop.wait(0.5)

    def _write(self) -> None:
        with self._lock:
            groups = [
                {
                    "targets": [f"127.0.0.1:{server.port}"],
                    "labels": {"namespace": NAMESPACE, "m3fleet_dev_name": name, "pod": pod},
                }
                for pod, (name, server) in sorted(self.servers.items())
            ]
        partial = self.targets.with_suffix(".tmp")
        partial.write_text(json.dumps(groups))
        os.replace(partial, self.targets)  # Prometheus never reads half a file

    def __enter__(self) -> StandIns:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for _, server in self.servers.values():
            server.__exit__(None, None, None)


def scrape_config(targets: Path) -> str:
    return (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: engines\n"
        "    file_sd_configs:\n"
        f"      - files: ['{targets}']\n"
        "        refresh_interval: 1s\n"
    )


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    with operated_namespace(chart, NAMESPACE, "operator-loop") as running:
        yield running


def eventually(what: str, check: Callable[[], Any], timeout: float, what_now: Callable[[], Any] | None = None) -> Any:
    """tests.cluster.cluster.eventually, saying what the operator last recorded when it times out."""
    try:
        return cluster_eventually(what, check, timeout)
    except ClusterError as exc:
        if what_now is None:
            raise
        raise ClusterError(f"{exc}\nlast recorded: {json.dumps(what_now())[:3000]}") from None


def autoscaling(cluster: Cluster, name: str) -> dict[str, Any]:
    body = cluster.get("m3d", name, NAMESPACE) or {}
    return dict((body.get("status") or {}).get("autoscaling") or {})


def replicas(cluster: Cluster, name: str) -> int:
    body = cluster.get("deployment", name, NAMESPACE) or {}
    return int((body.get("spec") or {}).get("replicas") or 0)


def events(cluster: Cluster, name: str, reason: str) -> list[str]:
    return [
        str(e.get("message") or "")
        for e in cluster.list("events", NAMESPACE)
        if e.get("reason") == reason and e["involvedObject"].get("name") == name
    ]


def spec_managers(cluster: Cluster, name: str) -> set[str]:
    """The field managers owning any of the resource's spec (kubectl shows managedFields only on request)."""
    shown = cluster.kubectl("get", "m3d", name, "-n", NAMESPACE, "-o", "json", "--show-managed-fields")
    fields = json.loads(shown.stdout)["metadata"]["managedFields"]
    return {m["manager"] for m in fields if "f:spec" in (m.get("fieldsV1") or {})}


def test_demand_scales_the_deployment_up_then_down_advisory_changes_nothing_and_prometheus_down_holds(
    chart: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    documents = {ACT: fleet(ACT, "act"), ADVISORY: fleet(ADVISORY, "advisory")}
    plans = {name: make_plan(parse_resource(document).spec) for name, document in documents.items()}
    targets = tmp_path / "targets.json"
    port = free_port()
    workdir = tmp_path / "prom"
    workdir.mkdir()
    with StandIns(chart, targets, plans) as standins:
        stack = contextlib.ExitStack()
        try:
            url = stack.enter_context(prometheus(workdir, scrape_config(targets), port=port))
            for document in documents.values():
                document["spec"]["autoscaling"]["prometheus"]["url"] = url
                chart.apply(document)
            for name in documents:
                wait_ready(chart, name, NAMESPACE)
            generations = {n: (chart.get("m3d", n, NAMESPACE) or {})["metadata"]["generation"] for n in documents}

            # Quiet: one replica is enough (a steady decision is recorded when it changes, so the first stays).
            first = eventually("a first decision", lambda: autoscaling(chart, ACT), 60)
            assert first["desiredReplicas"] == 1 and first["mode"] == "act", first
            eventually("one stand-in per fleet", lambda: standins.up(ACT) == 1 and standins.up(ADVISORY) == 1, 30)
            time.sleep(6)  # Prometheus scrapes them

            # Demand rises: the act fleet's Deployment grows to 3 (kwok runs the pods, a stand-in each).
            standins.demand.update({ACT: BUSY, ADVISORY: BUSY})
            eventually(
                "the act fleet scaled up to 3 running replicas",
                lambda: standins.up(ACT) == 3,
                120,
                what_now=lambda: autoscaling(chart, ACT),
            )
            assert replicas(chart, ACT) == 3
            up_events = events(chart, ACT, "Scaled")
            assert any("scale-up 1 -> " in m and "KV demand" in m for m in up_events), up_events
            decided = autoscaling(chart, ACT)
            assert (decided["mode"], decided["action"], decided["desiredReplicas"], decided["applied"]) == (
                "act",
                "scale-up",
                3,
                True,
            ), decided
            assert decided["terms"]["kvReplicas"] > 2, decided  # the KV term decided

            # Advisory: the same load recommends more, and nothing is changed.
            advised = eventually(
                "the advisory fleet recommends a scale-up",
                lambda: (a := autoscaling(chart, ADVISORY)).get("desiredReplicas", 1) > 1 and a,
                60,
                what_now=lambda: autoscaling(chart, ADVISORY),
            )
            assert advised["applied"] is False and advised["reason"].startswith("advisory (not applied): scale-up")
            recommended = eventually(
                "a ScaleRecommended Event", lambda: events(chart, ADVISORY, "ScaleRecommended"), 30
            )
            assert any("advisory (not applied)" in m for m in recommended)
            assert not events(chart, ADVISORY, "Scaled")
            assert replicas(chart, ADVISORY) == 1 and len(pods(chart, ADVISORY, NAMESPACE)) == 1

            # Demand falls while Prometheus is down: the policy holds the 3 replicas and says why.
            standins.demand.update({ACT: QUIET, ADVISORY: QUIET})
            stack.close()
            held = eventually(
                "status says the metrics are unavailable",
                lambda: "metrics unavailable" in (a := autoscaling(chart, ACT)).get("reason", "") and a,
                60,
                what_now=lambda: autoscaling(chart, ACT),
            )
            assert held["action"] == "hold" and held["desiredReplicas"] == 3, held
            assert "never scale down without metrics" in held["reason"]
            time.sleep(12)  # two more ticks without metrics
            assert replicas(chart, ACT) == 3 and standins.up(ACT) == 3

            # Prometheus back at the same URL: the low demand scales the Deployment down, one step at a time.
            stack.enter_context(prometheus(workdir, scrape_config(targets), tsdb=workdir / "data", port=port))
            eventually(
                "the act fleet scaled down to 1",
                lambda: replicas(chart, ACT) == 1,
                150,
                what_now=lambda: autoscaling(chart, ACT),
            )
            eventually("the stand-ins of the removed pods stopped", lambda: standins.up(ACT) == 1, 60)
            down = [m for m in events(chart, ACT, "Scaled") if "scale-down" in m]
            assert any("scale-down 3 -> 2" in m for m in down) and any("scale-down 2 -> 1" in m for m in down), down
            assert len(standins.started) >= 4 and len(standins.stopped) >= 2
            final = eventually(
                "a decision on fresh metrics after the scale-down",
                lambda: "metrics unavailable" not in (a := autoscaling(chart, ACT)).get("reason", "x") and a,
                30,
            )
            assert (final["action"], final["desiredReplicas"], final["currentReplicas"]) == ("scale-down", 1, 2), final
            assert final["terms"]["kvReplicas"] < 1 and final["state"]["history"], final
            assert "open" in final["demand"]  # the forecast's record of this fleet's own demand

            # GitOps does not fight: no one but the user wrote any of spec (replicas included).
            for name, document in documents.items():
                body = chart.get("m3d", name, NAMESPACE) or {}
                assert body["metadata"]["generation"] == generations[name], name
                assert body["spec"]["replicas"] == document["spec"]["replicas"] == 1
                assert spec_managers(chart, name) == {"kubectl"}, name
            assert replicas(chart, ADVISORY) == 1
        finally:
            stack.close()
            for name in documents:
                delete(chart, name, NAMESPACE)


def test_a_leaderworkerset_fleet_grows_and_shrinks_by_a_group(
    chart: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = "loop-groups"
    document = fleet(name, "act")
    # 1M tokens, three full-length sequences: a replica spans two H200 nodes (as tests/cluster/test_multinode.py).
    document["spec"]["model"] = {"variant": "mxfp8", "source": {"pvc": {"claimName": "m3-weights-mxfp8"}}}
    document["spec"]["context"] = {"maxModelLen": 1_048_576, "minSequencesAtMaxLen": 3}
    document["spec"]["parallelism"] = {"strategy": "tp", "tensorParallelSize": 0}
    document["spec"]["autoscaling"]["maxReplicas"] = 2
    plan = make_plan(parse_resource(document).spec)
    assert plan.nodes_per_replica == 2
    targets = tmp_path / "targets.json"
    workdir = tmp_path / "prom"
    workdir.mkdir()

    def groups() -> int:
        body = chart.get("leaderworkerset", name, NAMESPACE) or {}
        return int((body.get("spec") or {}).get("replicas") or 0)

    with StandIns(chart, targets, {name: plan}) as standins, prometheus(workdir, scrape_config(targets)) as url:
        try:
            document["spec"]["autoscaling"]["prometheus"]["url"] = url
            chart.apply(document)
            wait_ready(chart, name, NAMESPACE, timeout=240)
            eventually("the leader's stand-in", lambda: standins.up(name) == 1, 30)
            assert len(pods(chart, name, NAMESPACE)) == 2  # one group: a leader and a worker

            for demand, count in ((1.5, 2), (QUIET, 1)):  # demand rises: a second group; falls: back to one
                standins.demand[name] = demand
                eventually(
                    f"{count} group(s), a stand-in each",
                    lambda n=count: groups() == n and standins.up(name) == n,
                    120,
                    lambda: autoscaling(chart, name),
                )
                eventually(f"{2 * count} pods", lambda n=count: len(pods(chart, name, NAMESPACE)) == 2 * n, 60)
            messages = events(chart, name, "Scaled")
            assert any("scale-up 1 -> 2" in m for m in messages) and any("scale-down 2 -> 1" in m for m in messages)
            assert standins.started == [f"{name}-0", f"{name}-1"], standins.started  # the leaders only
            assert standins.stopped == [f"{name}-1"], standins.stopped
            body = chart.get("m3d", name, NAMESPACE) or {}
            assert body["metadata"]["generation"] == 1 and body["spec"]["replicas"] == 1
            assert spec_managers(chart, name) == {"kubectl"}
        finally:
            delete(chart, name, NAMESPACE)

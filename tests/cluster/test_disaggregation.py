"""spec.disaggregation through the real operator on the real control plane: the TensorRT-LLM sample, on the kwok
H200 pool, becomes Dynamo's frontend, prefill workers (one node each: a Deployment) and a decode worker group (DEP16
over two nodes: a LeaderWorkerSet through the real LWS controller), owned and reported; a bad disaggregation
leaves them running; switching back to aggregated prunes every Dynamo child with a Warning; renderAs
DynamoGraphDeployment is applied against the installed CRD; with spec.autoscaling the operator's autoscaler scales each
role on its own signal, read from a real Prometheus scraping stand-ins of the role pods' engine metrics, and the role
workloads follow the counts it records.

H200 rather than the sample's GB200: the kwok pool has four GB200 nodes in two NVLink cliques, and two 2-node
groups scheduled at once (no gang scheduler) can each take one node of both cliques and wait forever; the GB200
rendering is checked whole by the golden test."""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.autoscaling.prom import EngineState, Reading, prometheus
from tests.support.cluster import dra
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.dynamo_crd import CRD
from tests.support.cluster.fleet import condition, delete, operated_namespace, pods, rendered, wait_ready
from tests.support.cluster.standins import StandIns, scrape_config
from tests.support.cluster.standins import eventually as eventually_saying
from tests.support.samples import SAMPLES_DIR

from m3fleet.api import parse_resource
from m3fleet.api.models import DisaggregationPlan
from m3fleet.autoscaling.signals import one_two_five_buckets
from m3fleet.planner import plan

NAMESPACE = "disagg"
NAME = "disagg"
SAMPLE = SAMPLES_DIR / "disaggregated" / "trtllm-gb200-disagg-32k.yaml"
DYNAMO_CHILDREN = {
    ("Deployment", f"{NAME}-frontend"),
    ("Deployment", f"{NAME}-prefill"),
    ("LeaderWorkerSet", f"{NAME}-decode"),
    ("ServiceAccount", f"{NAME}-dynamo"),
    ("Role", f"{NAME}-dynamo"),
    ("RoleBinding", f"{NAME}-dynamo"),
    ("Service", f"{NAME}-dynamo"),
    ("Service", f"{NAME}-api"),
}


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    dra.install(chart)
    chart.apply(CRD)  # before the operator starts: it asks discovery which kinds the cluster serves
    chart.kubectl("wait", "--for=condition=Established", "crd/dynamographdeployments.nvidia.com", "--timeout=60s")
    with operated_namespace(chart, NAMESPACE, "operator-disagg") as running:
        yield running


def document(name: str = NAME, **disaggregation: Any) -> dict[str, Any]:
    """The sample on H200 at 1k-token prompts: prefill TEP8 (one node), decode DEP16 (two nodes)."""
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": NAMESPACE}
    doc["spec"]["accelerator"] = "h200"
    doc["spec"]["disaggregation"].update({"inputTokens": 1024, **disaggregation})
    return doc


def owned_children(cluster: Cluster, uid: str) -> set[tuple[str, str]]:
    found = set()
    for kind in ("deployments", "leaderworkersets", "serviceaccounts", "roles", "rolebindings", "services"):
        for obj in cluster.list(kind, NAMESPACE, f"m3fleet.dev/name={NAME}"):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(r["uid"] == uid and r.get("controller") for r in refs):
                found.add((obj["kind"], obj["metadata"]["name"]))
    return found


def pod_uids(cluster: Cluster) -> set[str]:
    return {p["metadata"]["uid"] for p in pods(cluster, NAME, NAMESPACE)}


def test_disaggregated_fleet_runs_reports_survives_bad_input_and_switches_back(
    chart: Cluster, operator: OperatorProcess
) -> None:
    doc = document()
    try:
        chart.apply(doc)
        body = wait_ready(chart, NAME, NAMESPACE, timeout=240)
        uid = body["metadata"]["uid"]
        d = body["status"]["plan"]["disaggregation"]
        expected = plan(parse_resource(doc).spec).disaggregation
        assert expected is not None and d["ratio"] == expected.ratio
        assert (d["prefill"]["replicas"], d["decode"]["replicas"]) == (expected.prefill.replicas, 1)
        prefill = chart.get("deployment", f"{NAME}-prefill", NAMESPACE)
        assert prefill is not None and prefill["status"].get("readyReplicas") == expected.prefill.replicas
        decode = chart.get("leaderworkerset", f"{NAME}-decode", NAMESPACE)
        assert decode is not None and decode["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert (body["status"]["replicas"], body["status"]["readyReplicas"]) == (1, 1)  # decode workers
        assert owned_children(chart, uid) >= DYNAMO_CHILDREN
        roles = {p["metadata"]["labels"].get("m3fleet.dev/dynamo-role") for p in pods(chart, NAME, NAMESPACE)}
        assert roles == {"frontend", "prefill", "decode"}
        wide = chart.kubectl("get", "m3d", NAME, "-n", NAMESPACE, "-o", "wide").stdout
        assert "P:D" in wide.splitlines()[0] and expected.ratio in wide.splitlines()[1], wide

        # A ratio that starves prefill: refused at admission, or reported; either way nothing running is touched.
        running = pod_uids(chart)
        bad = copy.deepcopy(doc)
        bad["spec"]["disaggregation"]["ratio"] = "1:8"
        refused = chart.apply(bad, check=False)
        if refused.returncode != 0:
            assert "spec.disaggregation.ratio" in refused.stderr and "fix:" in refused.stderr, refused.stderr
        else:
            eventually(
                "InvalidSpec naming spec.disaggregation.ratio",
                lambda: (
                    "spec.disaggregation.ratio"
                    in condition(chart.get("m3d", NAME, NAMESPACE), "Ready").get("message", "")
                ),
                60,
            )
            chart.apply(doc)
        assert pod_uids(chart) >= running
        assert chart.get("leaderworkerset", f"{NAME}-decode", NAMESPACE) is not None

        # Back to aggregated: every Dynamo child pruned, the aggregated group created, and a Warning says so.
        aggregated = copy.deepcopy(doc)
        del aggregated["spec"]["disaggregation"]
        aggregated["spec"]["parallelism"] = {"strategy": "tp-ep"}
        chart.apply(aggregated)
        eventually(
            "the Dynamo children pruned",
            lambda: not (owned_children(chart, uid) & (DYNAMO_CHILDREN - {("Service", f"{NAME}-api")})),
            90,
        )
        assert chart.get("deployment", NAME, NAMESPACE) is not None  # TEP8: one H200 node per replica
        warnings = eventually(
            "a WorkloadReplaced Warning",
            lambda: [
                e["message"]
                for e in chart.list("events", NAMESPACE)
                if e["involvedObject"].get("name") == NAME and e["reason"] == "WorkloadReplaced"
            ],
            60,
        )
        assert any("removing spec.disaggregation replaces the disaggregated fleet" in w for w in warnings), warnings
        assert "Traceback" not in operator.log()
    finally:
        delete(chart, NAME, NAMESPACE)
        eventually(f"{NAME} pods gone", lambda: not pods(chart, NAME, NAMESPACE), 120)


def test_dynamo_graph_deployment_is_accepted_by_the_crd(
    chart: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = "disagg-dgd"
    doc = document(name, renderAs="DynamoGraphDeployment")
    # What m3fleet render emits passes the CRD's schema under kubectl's strict field validation (a dry run) ...
    dgd = next(o for o in rendered(doc, tmp_path) if o["kind"] == "DynamoGraphDeployment")
    chart.kubectl(
        "apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", "-", input=yaml.safe_dump(dgd)
    )
    try:
        # ... and the operator applies and owns it.
        chart.apply(doc)
        applied = eventually(
            "the DynamoGraphDeployment", lambda: chart.get("dynamographdeployment", name, NAMESPACE), 60
        )
        owner = applied["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("MiniMaxM3Deployment", name, True)
        types = [c["type"] for c in applied["spec"]["components"]]
        assert types == ["frontend", "prefill", "decode"]
        body = chart.get("m3d", name, NAMESPACE)
        assert body is not None and body["status"]["plan"]["disaggregation"]["renderAs"] == "DynamoGraphDeployment"
        # A component type the CRD does not know is refused by the real apiserver.
        broken = copy.deepcopy(dgd)
        broken["metadata"]["name"] = "broken"  # not the operator's object: only the schema answers
        broken["spec"]["components"][0]["type"] = "router"
        result = chart.kubectl(
            "apply", "--server-side", "--dry-run=server", "-f", "-", input=yaml.safe_dump(broken), check=False
        )
        assert result.returncode != 0 and "Unsupported value" in result.stderr, result.stderr
    finally:
        delete(chart, name, NAMESPACE)


class RoleLoad:
    """What the stand-ins of a disaggregated fleet's pods export: prompt requests queued at the prefill workers and
    KV demand (in decode workers' worth at the 0.8 target) at the decode workers, each shared by that role's pods up;
    the test sets both. The rates stay steady (no counter resets when the load changes); the frontend exports nothing
    the autoscaler reads (its series carry role frontend)."""

    PROMPT = 32768.0
    RATE = 0.05  # requests per second through each worker

    def __init__(self, fleet: str, d: DisaggregationPlan) -> None:
        self.fleet, self.d = fleet, d
        self.queued = 0.0  # prompt requests waiting, over all prefill workers
        self.kv_demand = 0.5
        self.members: dict[str, list[str]] = {"prefill": [], "decode": []}

    def role(self, replica: str) -> str:
        return next((r for r in ("prefill", "decode") if replica.startswith(f"{self.fleet}-{r}-")), "frontend")

    def follow(self, fleet: str, pods: Collection[str]) -> None:
        for role in self.members:
            self.members[role] = [p for p in pods if self.role(p) == role]

    def reading(self, fleet: str, replica: str, elapsed: float) -> Reading:
        role, bounds = self.role(replica), one_two_five_buckets(131072)
        if role == "frontend":
            return Reading.idle(0.0, bounds)
        share = 1 / max(1, len(self.members[role]))
        worker = self.d.prefill if role == "prefill" else self.d.decode
        state = EngineState(
            running=2.0,
            waiting=self.queued * share if role == "prefill" else 0.0,
            kv_usage=min(0.95, 0.8 * self.kv_demand * share) if role == "decode" else 0.1,
            capacity_tokens=float(worker.kv_cache_tokens_per_worker),
            prompt_tokens_rate=self.RATE * self.PROMPT,
            generation_tokens_rate=self.RATE * 1024,
            request_rate=self.RATE,
            prompt_tokens=self.PROMPT,
        )
        return state.reading(elapsed, bounds)


def test_autoscaler_scales_each_role_on_its_own_signal_and_the_role_workloads_follow(
    chart: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Prefill scales on queued prompt tokens while decode holds; then decode scales on KV demand."""
    name = "disagg-as"
    # 32k-token prompts, both roles one H200 node (TEP8): at most 2 prefill workers per decode worker (the ratio's
    # upper bound, twice the derived 0.7), at least one.
    doc = document(name, inputTokens=32768, decode={"parallelism": {"strategy": "tp-ep"}})
    doc["spec"]["autoscaling"] = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 3,
        "intervalSeconds": 5,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},  # no scale-down in this test
        "prometheus": {"url": "http://127.0.0.1:9"},  # replaced below by the test's Prometheus
    }
    p = plan(parse_resource(doc).spec)
    assert p.disaggregation is not None
    load = RoleLoad(name, p.disaggregation)
    targets = tmp_path / "targets.json"
    with (
        StandIns(chart, targets, {name: p}, load, namespace=NAMESPACE),
        prometheus(tmp_path, scrape_config(targets)) as url,
    ):
        doc["spec"]["autoscaling"]["prometheus"]["url"] = url
        try:
            chart.apply(doc)
            generation = wait_ready(chart, name, NAMESPACE)["metadata"]["generation"]

            def roles(prefill: int, decode: int, prefill_by: str, decode_by: str) -> dict[str, Any] | None:
                body = chart.get("m3d", name, NAMESPACE) or {}
                recorded = ((body.get("status") or {}).get("autoscaling") or {}).get("roles") or {}
                counts = {r: (recorded.get(r) or {}).get("replicas") for r in ("prefill", "decode")}
                deciders = {r: (recorded.get(r) or {}).get("decidedBy") for r in ("prefill", "decode")}
                if counts != {"prefill": prefill, "decode": decode}:
                    return None
                if deciders != {"prefill": prefill_by, "decode": decode_by}:
                    return None
                return dict(recorded)

            def workloads(prefill: int, decode: int) -> bool:
                """The role Deployments set to the counts, and their pods ready (kwok), as the render follows."""
                for role, count in (("prefill", prefill), ("decode", decode)):
                    workload = chart.get("deployment", f"{name}-{role}", NAMESPACE) or {}
                    ready = (workload.get("status") or {}).get("readyReplicas") or 0
                    if (workload.get("spec") or {}).get("replicas") != count or ready != count:
                        return False
                return True

            def recorded() -> dict[str, Any]:
                body = chart.get("m3d", name, NAMESPACE) or {}
                return dict((body.get("status") or {}).get("autoscaling") or {})

            # Quiet: one decode worker's KV at half the target, a trickle of prompts and none queued.
            quiet = eventually_saying(
                "the quiet fleet's decision", lambda: roles(1, 1, "promptTokens", "kvDemand"), 90, recorded
            )
            assert "KV demand" in quiet["decode"]["reason"]
            # Prompts queue at the prefill workers: prefill scales, decode holds.
            load.queued = 6.0
            queued = eventually(
                "prefill scaled on queued prompt tokens", lambda: roles(2, 1, "promptTokens", "kvDemand"), 90
            )
            assert "queued" in queued["prefill"]["reason"] and queued["prefill"]["need"] > 1.0
            eventually("the prefill Deployment at 2, decode at 1", lambda: workloads(2, 1), 90)
            # KV demand of 1.6 decode workers: decode scales; prefill keeps its two (its own signal is unchanged).
            load.kv_demand = 1.6
            eventually_saying(
                "decode scaled on KV demand", lambda: roles(2, 2, "promptTokens", "kvDemand"), 90, recorded
            )
            eventually("the decode Deployment at 2", lambda: workloads(2, 2), 90)
            body = chart.get("m3d", name, NAMESPACE)
            assert body is not None and body["status"]["autoscaling"]["desiredReplicas"] == 2
            assert body["metadata"]["generation"] == generation  # spec (GitOps's) never written
            assert (body["status"]["replicas"], body["status"]["readyReplicas"]) == (2, 2)  # decode workers
            scaled = [
                e["message"]
                for e in chart.list("events", NAMESPACE)
                if e["involvedObject"].get("name") == name and e["reason"] == "Scaled"
            ]
            assert any("decode 1 -> 2" in m for m in scaled) and any("prefill 1 -> 2" in m for m in scaled), scaled
            assert "Traceback" not in operator.log()
        finally:
            delete(chart, name, NAMESPACE)
            eventually(f"{name} pods gone", lambda: not pods(chart, name, NAMESPACE), 120)

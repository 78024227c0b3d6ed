"""spec.disaggregation through the real operator on the real control plane: the TensorRT-LLM sample, on the kwok
H200 pool, becomes Dynamo's frontend, prefill workers (one node each: a Deployment) and a decode worker group (DEP16
over two nodes: a LeaderWorkerSet through the real LWS controller), owned and reported; a bad disaggregation
leaves them running; switching back to aggregated prunes every Dynamo child with a Warning; renderAs
DynamoGraphDeployment is applied against the installed CRD.

H200 rather than the sample's GB200: the kwok pool has four GB200 nodes in two NVLink cliques, and two 2-node
groups scheduled at once (no gang scheduler) can each take one node of both cliques and wait forever; the GB200
rendering is checked whole by the golden test."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.cluster import dra
from tests.support.cluster.cluster import Cluster, OperatorProcess, eventually
from tests.support.cluster.dynamo_crd import CRD
from tests.support.cluster.fleet import condition, delete, operated_namespace, pods, rendered, wait_ready
from tests.support.samples import SAMPLES_DIR

from m3fleet.api import parse_resource
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

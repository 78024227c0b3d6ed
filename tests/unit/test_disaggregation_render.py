"""spec.disaggregation rendered onto NVIDIA Dynamo: the golden of the sample, every object against the Kubernetes
schemas, each role's command for each backend, the DynamoGraphDeployment, and the reconcile's decision when a fleet
switches between aggregated and disaggregated."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.controller.decide import Observed, decide, key_of, understand, want
from m3fleet.documents import dump
from m3fleet.planner import plan
from m3fleet.render import render, replacement_notice, required_secrets, set_owner
from tests.support.samples import ROOT, SAMPLES_DIR, load_sample
from tests.unit.test_render import validate_object

SAMPLE = SAMPLES_DIR / "disaggregated" / "trtllm-gb200-disagg-32k.yaml"
GOLDEN = ROOT / "tests" / "golden" / "disaggregated" / "trtllm-gb200-disagg-32k.yaml"
NAME = "m3-trtllm-gb200-disagg"


def rendered(doc: dict[str, Any]) -> list[dict[str, Any]]:
    resource = parse_resource(copy.deepcopy(doc))
    return render(resource, plan(resource.spec))


def by_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def engine_argv(workload: dict[str, Any]) -> list[str]:
    spec = workload["spec"]
    template = spec["template"] if workload["kind"] == "Deployment" else spec["leaderWorkerTemplate"]["leaderTemplate"]
    container = template["spec"]["containers"][0]
    return [*container["command"], *container["args"]]


def variant_doc(engine: str) -> dict[str, Any]:
    """The sample on another backend, in the layout Dynamo's M3 recipes run it (MXFP8, TP4 per role)."""
    doc = load_sample(SAMPLE)
    doc["metadata"]["name"] = f"m3-{engine}-disagg"
    doc["spec"]["engine"] = {"name": engine}
    doc["spec"]["model"]["variant"] = "mxfp8"
    doc["spec"]["parallelism"] = {"strategy": "tp-ep", "tensorParallelSize": 4}
    for role in ("prefill", "decode"):
        doc["spec"]["disaggregation"].pop(role)
    return doc


def test_golden(request: pytest.FixtureRequest) -> None:
    text = dump(rendered(load_sample(SAMPLE)), "yaml")
    if request.config.getoption("--update-goldens"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), f"{GOLDEN.name} differs: if intended, pytest --update-goldens"


@pytest.mark.parametrize("doc", [load_sample(SAMPLE), variant_doc("vllm"), variant_doc("sglang")], ids=str)
def test_every_object_validates(doc: dict[str, Any]) -> None:
    for obj in rendered(doc):
        validate_object(obj)


def test_the_sample_is_a_frontend_a_prefill_and_a_decode_workload() -> None:
    objects = by_name(rendered(load_sample(SAMPLE)))
    d = plan(parse_resource(load_sample(SAMPLE)).spec).disaggregation
    prefill, decode = objects[("LeaderWorkerSet", f"{NAME}-prefill")], objects[("LeaderWorkerSet", f"{NAME}-decode")]
    assert (prefill["spec"]["replicas"], decode["spec"]["replicas"]) == (d.prefill.replicas, d.decode.replicas)
    assert prefill["spec"]["leaderWorkerTemplate"]["size"] == decode["spec"]["leaderWorkerTemplate"]["size"] == 2
    frontend = objects[("Deployment", f"{NAME}-frontend")]
    assert engine_argv(frontend)[:3] == ["python3", "-m", "dynamo.frontend"]
    assert engine_argv(frontend)[engine_argv(frontend).index("--router-mode") + 1] == "kv"
    # The API Service is the aggregated fleet's name and selects the frontend only.
    api = objects[("Service", f"{NAME}-api")]
    assert api["spec"]["ports"][0]["port"] == 8000
    assert frontend["spec"]["template"]["metadata"]["labels"].items() >= api["spec"]["selector"].items()
    for worker in (prefill, decode):
        labels = worker["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
        assert not labels.items() >= api["spec"]["selector"].items()
    # The frontend holds no GPU.
    resources = frontend["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert not any("gpu" in r for r in [*resources["requests"], *resources["limits"]])


def test_trtllm_roles_run_the_guides_layouts_and_hand_kv_over_nixl() -> None:
    objects = by_name(rendered(load_sample(SAMPLE)))
    config = objects[("ConfigMap", f"{NAME}-engine-config")]["data"]
    for role, attention_dp in (("prefill", "false"), ("decode", "true")):
        leader = config[f"{role}-launch-leader.sh"]
        assert "trtllm-llmapi-launch python3 -m dynamo.trtllm" in leader
        assert f"--disaggregation-mode {role}" in leader
        assert ("--enable-attention-dp" in leader) == (attention_dp == "true")
        options = config[f"{role}-extra-llm-api-options.yaml"]
        assert "cache_transceiver_config:\n  backend: NIXL" in options
        assert f"enable_attention_dp: {attention_dp}" in options


@pytest.mark.parametrize(
    ("engine", "module", "transfer"),
    [("vllm", "dynamo.vllm", "--kv-transfer-config"), ("sglang", "dynamo.sglang", "--disaggregation-transfer-backend")],
)
def test_vllm_and_sglang_workers(engine: str, module: str, transfer: str) -> None:
    objects = by_name(rendered(variant_doc(engine)))
    for role in ("prefill", "decode"):
        argv = engine_argv(objects[("Deployment", f"m3-{engine}-disagg-{role}")])
        assert argv[:3] == ["python3", "-m", module]
        assert argv[argv.index("--disaggregation-mode") + 1] == role
        assert transfer in argv
        assert argv[argv.index("--discovery-backend") + 1] == "kubernetes"


def test_discovery_runs_as_the_fleets_own_service_account() -> None:
    objects = by_name(rendered(load_sample(SAMPLE)))
    account = f"{NAME}-dynamo"
    role = objects[("Role", account)]
    assert {"dynamoworkermetadatas", "endpointslices"} <= {r for rule in role["rules"] for r in rule["resources"]}
    binding = objects[("RoleBinding", account)]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "llm"}]
    decode = objects[("LeaderWorkerSet", f"{NAME}-decode")]
    pod = decode["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    assert pod["serviceAccountName"] == account and pod["automountServiceAccountToken"] is True
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert {"POD_NAME", "POD_NAMESPACE", "POD_UID", "DYN_SYSTEM_PORT"} <= env
    headless = objects[("Service", account)]
    assert headless["spec"]["clusterIP"] == "None"


def test_multi_node_trtllm_workers_need_the_ssh_key() -> None:
    resource = parse_resource(load_sample(SAMPLE))
    assert required_secrets(resource, plan(resource.spec)) == [f"{NAME}-mpi-ssh"]


def test_the_autoscalers_decode_count_carries_the_ratio() -> None:
    resource = parse_resource(load_sample(SAMPLE))
    p = plan(resource.spec)
    objects = by_name(render(resource, p, replicas=2))
    p_per_d, d_per = (int(x) for x in p.disaggregation.ratio.split(":"))
    assert objects[("LeaderWorkerSet", f"{NAME}-decode")]["spec"]["replicas"] == 2
    assert objects[("LeaderWorkerSet", f"{NAME}-prefill")]["spec"]["replicas"] == -(-2 * p_per_d // d_per)


def test_dynamo_graph_deployment() -> None:
    doc = load_sample(SAMPLE)
    doc["spec"]["disaggregation"]["renderAs"] = "DynamoGraphDeployment"
    objects = by_name(rendered(doc))
    assert set(objects) == {("ConfigMap", f"{NAME}-engine-config"), ("DynamoGraphDeployment", NAME)}
    dgd = objects[("DynamoGraphDeployment", NAME)]
    assert dgd["apiVersion"] == "nvidia.com/v1beta1" and dgd["spec"]["backendFramework"] == "trtllm"
    components = {c["name"]: c for c in dgd["spec"]["components"]}
    assert [c["type"] for c in dgd["spec"]["components"]] == ["frontend", "prefill", "decode"]
    assert components["prefill"]["multinode"] == {"nodeCount": 2}
    main = components["decode"]["podTemplate"]["spec"]["containers"][0]
    assert main["name"] == "main" and main["command"] == ["python3", "-m", "dynamo.trtllm"]
    assert "--discovery-backend" not in main["args"]  # the Dynamo operator wires discovery itself


# --- the reconcile's decision ----------------------------------------------------------------------


def body(doc: dict[str, Any], uid: str = "u1") -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["metadata"].update({"uid": uid, "generation": 1})
    return out


def observed(doc: dict[str, Any], live: list[dict[str, Any]]) -> Observed:
    b = body(doc)
    understood = understand(b)
    served = frozenset({"ConfigMap", "ComputeDomain", "Deployment", "LeaderWorkerSet", "NetworkPolicy",
                        "PodDisruptionBudget", "Service", "ServiceAccount", "Role", "RoleBinding"})  # fmt: skip
    for obj in live:
        obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
    return Observed(b, understood, None, want(understood, None, {}), served, {key_of(o): o for o in live})


def owned(objects: list[dict[str, Any]], doc: dict[str, Any]) -> list[dict[str, Any]]:
    owner = {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": {"name": NAME, "uid": "u1"}}
    return [set_owner(o, owner) for o in objects]


def aggregated_doc() -> dict[str, Any]:
    doc = load_sample(SAMPLE)
    del doc["spec"]["disaggregation"]
    doc["spec"]["parallelism"] = {"strategy": "tp-ep"}
    return doc


def test_switching_to_disaggregated_prunes_the_aggregated_workload_and_says_so() -> None:
    running = owned(rendered(aggregated_doc()), aggregated_doc())
    work = decide(observed(load_sample(SAMPLE), running))
    assert work.blocked is None
    assert ("LeaderWorkerSet", NAME) in {(p.kind, p.name) for p in work.prune}
    assert "replaces the aggregated LeaderWorkerSet with NVIDIA Dynamo's frontend" in work.replaced["LeaderWorkerSet"]
    assert work.workload is not None and work.workload["metadata"]["name"] == f"{NAME}-decode"


def test_switching_back_prunes_every_dynamo_child_and_says_so() -> None:
    running = owned(rendered(load_sample(SAMPLE)), load_sample(SAMPLE))
    work = decide(observed(aggregated_doc(), running))
    pruned = {(p.kind, p.name) for p in work.prune}
    assert {("Deployment", f"{NAME}-frontend"), ("LeaderWorkerSet", f"{NAME}-prefill"),
            ("ServiceAccount", f"{NAME}-dynamo"), ("Role", f"{NAME}-dynamo")} <= pruned  # fmt: skip
    assert "removing spec.disaggregation replaces the disaggregated fleet" in work.replaced["Deployment"]


def test_a_bad_disaggregation_touches_nothing_that_runs() -> None:
    running = owned(rendered(aggregated_doc()), aggregated_doc())
    bad = load_sample(SAMPLE)
    bad["spec"]["disaggregation"]["ratio"] = "1:8"
    work = decide(observed(bad, running))
    assert work.blocked is not None and work.blocked.message.startswith("spec.disaggregation.ratio: ")
    assert work.apply == [] and work.prune == []


def test_replacement_notice_between_two_disaggregated_shapes_is_silent() -> None:
    p = plan(parse_resource(load_sample(SAMPLE)).spec)
    assert replacement_notice("Deployment", p, was_disaggregated=True) is None


def test_sample_has_its_golden_file() -> None:
    assert Path(GOLDEN).is_file()

"""Rendered objects: goldens per sample, real Kubernetes schemas, and properties over the planner's grid."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from m3fleet.api import parse_resource
from m3fleet.api.models import MAX_NAME_LENGTH, MAX_REPLICAS, MAX_SURGE, MiniMaxM3Deployment
from m3fleet.catalog import ACCELERATORS, ENGINES
from m3fleet.documents import dump
from m3fleet.engines import sglang
from m3fleet.errors import SpecError
from m3fleet.planner import plan
from m3fleet.render import render, required_secrets, service_name, set_owner
from tests.support.samples import K8S_VERSION, ROOT, SAMPLE_FILES, SAMPLES_DIR, load_sample

GOLDEN_DIR = ROOT / "tests" / "golden"


def rendered(doc: dict[str, Any]) -> list[dict[str, Any]]:
    resource = parse_resource(doc)
    return render(resource, plan(resource.spec))


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def test_golden(path: Path, request: pytest.FixtureRequest) -> None:
    text = dump(rendered(load_sample(path)), "yaml")
    golden = GOLDEN_DIR / f"{path.stem}.yaml"
    if request.config.getoption("--update-goldens"):
        golden.write_text(text)
    assert golden.exists(), f"no golden for {path.name}: run pytest --update-goldens and review the diff"
    assert text == golden.read_text(), f"{golden.name} differs: if intended, pytest --update-goldens"


def test_every_golden_has_a_sample() -> None:
    assert {p.stem for p in GOLDEN_DIR.glob("*.yaml")} == {p.stem for p in SAMPLE_FILES}


# --- schemas --------------------------------------------------------------------------------

# LeaderWorkerSet v1 and ComputeDomain v1beta1 fields m3fleet may set (LWS-API; DRA). kubernetes-validate
# has no schemas for custom resources, so these are checked against their API's field lists.
LWS_FIELDS = {
    "spec": {"replicas", "startupPolicy", "rolloutStrategy", "leaderWorkerTemplate", "networkConfig"},
    "spec.rolloutStrategy": {"type", "rollingUpdateConfiguration"},
    "spec.rolloutStrategy.rollingUpdateConfiguration": {"partition", "maxUnavailable", "maxSurge"},
    "spec.leaderWorkerTemplate": {
        "size", "restartPolicy", "leaderTemplate", "workerTemplate", "subGroupPolicy", "volumeClaimTemplates",
    },
}  # fmt: skip
LWS_ENUMS = {
    "spec.startupPolicy": {"LeaderCreated", "LeaderReady"},
    "spec.leaderWorkerTemplate.restartPolicy": {"RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"},
    "spec.rolloutStrategy.type": {"RollingUpdate"},
}
COMPUTE_DOMAIN_FIELDS = {"spec": {"numNodes", "channel"}, "spec.channel": {"resourceClaimTemplate", "allocationMode"}}
# InferencePool v1 (GIE v1.3.0 api/v1/inferencepool_types.go) and HTTPRoute v1 (Gateway API v1.x) fields m3fleet
# may set; tests/cluster/test_gateway.py applies them to the real CRDs.
POOL_FIELDS = {
    "spec": {"selector", "targetPorts", "endpointPickerRef"},
    "spec.selector": {"matchLabels"},
    "spec.endpointPickerRef": {"group", "kind", "name", "port", "failureMode"},
}
ROUTE_FIELDS = {"spec": {"parentRefs", "hostnames", "rules"}}
ROUTE_RULE_FIELDS = {"matches", "backendRefs", "timeouts", "filters", "name"}


def _get(obj: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj[part]
    return obj


def _as_pod_template_validated(template: dict[str, Any], name: str) -> None:
    """LWS templates are corev1 PodTemplateSpecs: validate them as a Deployment's template."""
    wrapper = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": template["metadata"]["labels"]}, "template": template},
    }
    kubernetes_validate.validate(wrapper, K8S_VERSION, strict=True)


def validate_object(obj: dict[str, Any]) -> None:
    kind = obj["kind"]
    if kind == "LeaderWorkerSet":
        assert obj["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
        for path, allowed in LWS_FIELDS.items():
            assert set(_get(obj, path)) <= allowed, f"{path}: {set(_get(obj, path)) - allowed}"
        for path, allowed in LWS_ENUMS.items():
            assert _get(obj, path) in allowed
        lwt = obj["spec"]["leaderWorkerTemplate"]
        assert isinstance(lwt["size"], int) and lwt["size"] >= 1
        _as_pod_template_validated(lwt["leaderTemplate"], obj["metadata"]["name"])
        _as_pod_template_validated(lwt["workerTemplate"], obj["metadata"]["name"])
    elif kind == "InferencePool":
        assert obj["apiVersion"] == "inference.networking.k8s.io/v1"
        for path, allowed in POOL_FIELDS.items():
            assert set(_get(obj, path)) <= allowed, f"{path}: {set(_get(obj, path)) - allowed}"
        assert all(set(port) == {"number"} for port in obj["spec"]["targetPorts"])
    elif kind == "HTTPRoute":
        assert obj["apiVersion"] == "gateway.networking.k8s.io/v1"
        assert set(obj["spec"]) <= ROUTE_FIELDS["spec"]
        assert all(set(rule) <= ROUTE_RULE_FIELDS for rule in obj["spec"]["rules"])
    elif kind == "ComputeDomain":
        assert obj["apiVersion"] == "resource.nvidia.com/v1beta1"
        for path, allowed in COMPUTE_DOMAIN_FIELDS.items():
            assert set(_get(obj, path)) <= allowed
        assert obj["spec"]["channel"]["resourceClaimTemplate"]["name"]
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def test_every_rendered_object_validates(path: Path) -> None:
    for obj in rendered(load_sample(path)):
        validate_object(obj)


def test_validation_catches_a_typo() -> None:
    obj = next(o for o in rendered(load_sample(SAMPLE_FILES[0])) if o["kind"] in ("Deployment", "Service"))
    obj["spec"]["replicass"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_set_owner_is_the_only_way_owner_references_appear() -> None:
    objs = rendered(load_sample(SAMPLE_FILES[0]))
    assert all("ownerReferences" not in o["metadata"] for o in objs)
    owner = {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "x", "uid": "u1"},
    }
    owned = set_owner(objs[0], owner)
    assert owned["metadata"]["ownerReferences"][0] == {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "name": "x",
        "uid": "u1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert "ownerReferences" not in objs[0]["metadata"]  # the hook copies


# --- child names --------------------------------------------------------------------------

DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def test_the_service_is_name_api_and_leaves_name_to_the_lws_controller(path: Path) -> None:
    doc = load_sample(path)
    name = doc["metadata"]["name"]
    objs = [o for o in rendered(doc) if o["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]
    (service,) = [o for o in objs if o["kind"] == "Service"]
    workload, *tiers = [o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet")]
    assert service["metadata"]["name"] == service_name(name) == f"{name}-api"
    assert workload["metadata"]["name"] == name
    tier_names = [t["name"] for t in doc["spec"].get("gateway", {}).get("tiers", [])]
    assert [t["metadata"]["name"] for t in tiers] == [f"{name}-{tier}" for tier in tier_names]
    # The LeaderWorkerSet controller creates its own headless Service <name> (LWS_LEADER_ADDRESS
    # resolves through it): no child of ours may take that name.
    assert not [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == name]


def _label_values(obj: dict[str, Any]) -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("labels", "matchLabels", "selector") and isinstance(value, dict):
                    found.extend(v for v in value.values() if isinstance(v, str))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(obj)
    return found


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def test_the_longest_accepted_name_makes_valid_children(path: Path) -> None:
    doc = load_sample(path)
    # A context tier's workload is <name>-<tier>: the CRD keeps that within MAX_NAME_LENGTH too.
    tier_suffix = max((1 + len(t["name"]) for t in doc["spec"].get("gateway", {}).get("tiers", [])), default=0)
    doc["metadata"]["name"] = "m" + "3" * (MAX_NAME_LENGTH - tier_suffix - 1)
    resource = parse_resource(doc)
    objs = render(resource, plan(resource.spec))
    for obj in objs:
        child = obj["metadata"]["name"]
        assert len(child) <= 253 and DNS1123_SUBDOMAIN.fullmatch(child), child
        if obj["kind"] in ("Service", "LeaderWorkerSet"):  # both become DNS-1035 Service names
            assert len(child) <= 63 and DNS1035_LABEL.fullmatch(child), child
        assert all(len(v) <= 63 for v in _label_values(obj)), obj["kind"]
        validate_object(obj)
    for secret in required_secrets(resource, plan(resource.spec)):
        assert len(secret) <= 253 and DNS1123_SUBDOMAIN.fullmatch(secret)
    for lws in (o for o in objs if o["kind"] == "LeaderWorkerSet"):
        # What the LWS controller derives: a worker StatefulSet per group, <name>-<group> (groups up to
        # replicas + maxSurge - 1), whose pods carry controller-revision-hash <statefulset>-<10 chars>,
        # and pods <statefulset>-<worker>, whose names are also their hostnames.
        statefulset = f"{lws['metadata']['name']}-{MAX_REPLICAS + MAX_SURGE - 1}"
        assert len(f"{statefulset}-0123456789") <= 63
        assert len(f"{statefulset}-{lws['spec']['leaderWorkerTemplate']['size'] - 1}") <= 63


# --- a small model of each engine's flags ---------------------------------------------------
# Not the engines' own parsers (tests/engine_parsers runs those): a quick check that every flag we emit is one
# we meant to emit, with the arity we meant, so a typo fails here in milliseconds.

VLLM_FLAGS = {
    "--served-model-name": 1, "--host": 1, "--port": 1, "--tensor-parallel-size": 1, "--data-parallel-size": 1,
    "--pipeline-parallel-size": 1, "--enable-expert-parallel": 0, "--block-size": 1, "--max-model-len": 1,
    "--gpu-memory-utilization": 1,
    "--kv-cache-dtype": 1, "--attention-backend": 1, "--moe-backend": 1, "--no-enable-prefix-caching": 0,
    "--language-model-only": 0, "--mm-encoder-tp-mode": 1, "--mm-encoder-attn-backend": 1,
    "--mm-processor-cache-type": 1, "--skip-mm-profiling": 0, "--hf-overrides": 1, "--tool-call-parser": 1,
    "--reasoning-parser": 1, "--enable-auto-tool-choice": 0, "--trust-remote-code": 0, "--nnodes": 1,
    "--node-rank": 1, "--master-addr": 1, "--headless": 0, "--shutdown-timeout": 1,
}  # fmt: skip
SGLANG_FLAGS = {
    "--model-path": 1, "--served-model-name": 1, "--host": 1, "--port": 1, "--tp-size": 1, "--pp-size": 1,
    "--dp-size": 1, "--language-model-only": 0, "--mm-attention-backend": 1,
    "--enable-dp-attention": 0, "--ep-size": 1, "--mem-fraction-static": 1, "--context-length": 1,
    "--chunked-prefill-size": 1, "--quantization": 1, "--dtype": 1, "--kv-cache-dtype": 1, "--attention-backend": 1,
    "--page-size": 1, "--moe-runner-backend": 1, "--enable-multimodal": 0, "--json-model-override-args": 1,
    "--trust-remote-code": 0, "--reasoning-parser": 1, "--tool-call-parser": 1, "--enable-metrics": 0,
    "--dist-init-addr": 1, "--nnodes": 1, "--node-rank": 1, "--watchdog-timeout": 1, "--skip-server-warmup": 0,
}  # fmt: skip
TRTLLM_FLAGS = {
    "--host": 1, "--port": 1, "--trust_remote_code": 0, "--reasoning_parser": 1, "--tool_parser": 1,
    "--chat_template": 1, "--extra_llm_api_options": 1,
}  # fmt: skip


def model_parser(flags: dict[str, int], positional: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    if positional:
        parser.add_argument("model")
    for flag, arity in flags.items():
        parser.add_argument(flag, action="store_true" if arity == 0 else "store")
    return parser


def engine_argv(obj: dict[str, Any], engine: str) -> list[list[str]]:
    """Engine argv (after the executable) of every container in a workload."""
    templates = []
    if obj["kind"] == "Deployment":
        templates = [obj["spec"]["template"]]
    elif obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        templates = [lwt["leaderTemplate"], lwt["workerTemplate"]]
    argvs = []
    for t in templates:
        c = t["spec"]["containers"][0]
        if engine == "vllm":
            assert c["command"] == ["vllm", "serve"]
            argvs.append(c["args"])
        elif engine == "sglang":
            assert c["command"] == sglang.COMMAND  # the launcher that adds the keys, then python3 -m sglang...
            argvs.append(c["args"])
        elif c["command"] == ["trtllm-serve"]:
            argvs.append(c["args"])
    return argvs


def parse_with_model(engine: str, argv: list[str]) -> argparse.Namespace:
    flags = {"vllm": VLLM_FLAGS, "sglang": SGLANG_FLAGS, "trtllm": TRTLLM_FLAGS}[engine]
    return model_parser(flags, positional=engine != "sglang").parse_args(argv)


def trtllm_leader_argv(objs: list[dict[str, Any]]) -> list[str] | None:
    config = next((o for o in objs if o["kind"] == "ConfigMap"), None)
    if config is None or "launch-leader.sh" not in config["data"]:
        return None
    line = next(
        x for x in config["data"]["launch-leader.sh"].splitlines() if x.lstrip().startswith("trtllm-llmapi-launch")
    )
    return shlex.split(line.split("trtllm-llmapi-launch", 1)[1])[1:]  # drop 'trtllm-serve'


# --- properties over the planner's grid -------------------------------------------------------

COMBOS = [(e.value, a.value, v.value) for e, f in ENGINES.items() for a, vs in f.support.items() for v in vs]


def resource_for(engine: str, accel: str, variant: str, strategy: str, kv: str, max_len: int, lmo: bool, moe: str,
                 replicas: int, hf: bool) -> dict[str, Any]:  # fmt: skip
    source: dict[str, Any] = (
        {"huggingFace": {"cacheClaimName": "hf-cache", "tokenSecretRef": {"name": "hf-secret", "key": "token"}}}
        if hf
        else {"pvc": {"claimName": "weights", "subPath": "m3"}}
    )
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "grid", "namespace": "ns"},
        "spec": {
            "model": {"variant": variant, "source": source, "languageModelOnly": lmo},
            "engine": {"name": engine, "moeBackend": moe},
            "accelerator": accel,
            "parallelism": {"strategy": strategy},
            "context": {"maxModelLen": max_len, "kvCacheDtype": "bf16" if engine == "trtllm" else kv},
            "replicas": replicas,
            "nodePool": {"extraResources": {"rdma/ib": 1}} if replicas % 2 else {},
        },
    }


grid = st.builds(
    resource_for,
    st.sampled_from(COMBOS).map(lambda c: c[0]),
    st.just(""),
    st.just(""),
    st.sampled_from(["tp", "tp-ep", "dp-ep"]),
    st.sampled_from(["auto", "bf16", "fp8"]),
    st.sampled_from([4096, 32768, 131072, 524288, 1048576]),
    st.booleans(),
    st.sampled_from(["auto", "aiter", "emulation"]),
    st.integers(0, 3),
    st.booleans(),
)


@st.composite
def grid_resources(draw: st.DrawFn) -> dict[str, Any]:
    engine, accel, variant = draw(st.sampled_from(COMBOS))
    doc = draw(grid)
    doc["spec"]["engine"]["name"] = engine
    doc["spec"]["accelerator"] = accel
    doc["spec"]["model"]["variant"] = variant
    if engine == "trtllm":
        doc["spec"]["context"]["kvCacheDtype"] = "bf16"
    return doc


def rendered_or_none(doc: dict[str, Any]) -> tuple[MiniMaxM3Deployment, Any, list[dict[str, Any]]] | None:
    resource = parse_resource(doc)
    try:
        p = plan(resource.spec)
    except SpecError:
        return None
    return resource, p, render(resource, p)


GRID = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@GRID
@given(doc=grid_resources())
def test_grid_properties(doc: dict[str, Any]) -> None:
    result = rendered_or_none(doc)
    if result is None:
        return
    resource, p, objs = result
    engine = p.engine
    workload = next(o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    gpu = ACCELERATORS[p.accelerator].resource_name
    assert workload["spec"]["replicas"] == resource.spec.replicas
    if workload["kind"] == "Deployment":
        assert p.nodes_per_replica == 1
        pods = [workload["spec"]["template"]]
    else:
        lwt = workload["spec"]["leaderWorkerTemplate"]
        assert lwt["size"] == p.nodes_per_replica > 1
        pods = [lwt["leaderTemplate"]] + [lwt["workerTemplate"]] * (lwt["size"] - 1)
    # GPUs requested per group equal gpusPerReplica.
    assert sum(int(t["spec"]["containers"][0]["resources"]["limits"][gpu]) for t in pods) == p.gpus_per_replica
    for argv in engine_argv(workload, engine):
        ns = parse_with_model(engine, argv)
        if engine == "vllm":
            assert ns.block_size == "128"
            world = int(ns.tensor_parallel_size) * int(ns.data_parallel_size or 1) * int(ns.pipeline_parallel_size or 1)
            assert world == p.gpus_per_replica
            assert not ns.skip_mm_profiling  # the encoder's peak memory must be profiled, not left to chance
        if engine == "sglang":
            # SGLang's TP is the world size, or the per-stage size with --pp-size.
            assert int(ns.tp_size) * int(ns.pp_size or 1) == p.gpus_per_replica
    if engine == "trtllm":
        options = yaml.safe_load(
            next(o for o in objs if o["kind"] == "ConfigMap")["data"]["extra-llm-api-options.yaml"]
        )
        assert options["tensor_parallel_size"] == p.gpus_per_replica
        assert options["sparse_attention_config"] == {"algorithm": "minimax_m3"}
        assert options["kv_cache_config"]["enable_block_reuse"] is False
        leader_argv = trtllm_leader_argv(objs)
        if leader_argv is not None:
            parse_with_model("trtllm", leader_argv)
    for obj in objs:
        validate_object(obj)
    # No Secret value in rendered output: the token is only ever a reference.
    text = json.dumps(objs)
    for t in pods:
        for e in t["spec"]["containers"][0]["env"]:
            if e["name"] == "HF_TOKEN":
                assert e == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-secret", "key": "token"}}}
    assert 'kind": "Secret' not in text


def test_multi_node_ranks_add_up_to_world_size() -> None:
    doc = resource_for("vllm", "h200", "bf16", "tp", "bf16", 524288, False, "auto", 1, False)
    doc["spec"]["context"]["minSequencesAtMaxLen"] = 2
    result = rendered_or_none(doc)
    assert result is not None
    _, p, objs = result
    lws = next(o for o in objs if o["kind"] == "LeaderWorkerSet")
    leader, worker = (engine_argv(lws, "vllm")[i] for i in (0, 1))
    # Tensor parallel within each H200 node, one pipeline stage per node (vLLM's M3 model implements PP).
    assert (p.tensor_parallel_size, p.pipeline_parallel_size) == (8, 2) and lws["spec"]["leaderWorkerTemplate"][
        "size"
    ] == 2
    for argv in (leader, worker):
        assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert leader[leader.index("--node-rank") + 1] == "0" and "--headless" not in leader
    assert worker[worker.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)" and "--headless" in worker
    assert leader[leader.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
    worker_pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    assert "readinessProbe" not in worker_pod and "startupProbe" not in worker_pod and "ports" in worker_pod


def test_vllm_drains_in_flight_requests_before_the_kubelet_kills_the_pod() -> None:
    # vLLM aborts what it has in flight on SIGTERM unless --shutdown-timeout lets it drain; the drain must end
    # (with time to free the GPUs) before terminationGracePeriodSeconds, which starts with the preStop sleep.
    doc = resource_for("vllm", "h200", "bf16", "tp", "bf16", 524288, False, "auto", 1, False)
    doc["spec"]["context"]["minSequencesAtMaxLen"] = 2
    result = rendered_or_none(doc)
    assert result is not None
    lws = next(o for o in result[2] if o["kind"] == "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        pod = template[role]["spec"]
        container = pod["containers"][0]
        argv = container["args"]
        drain = int(argv[argv.index("--shutdown-timeout") + 1])
        pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
        assert drain >= 300 and pre_stop + drain + 15 <= pod["terminationGracePeriodSeconds"], (role, drain)


@pytest.mark.parametrize(
    ("engine", "flag"),
    [("vllm", "--tensor-parallel-size=4"), ("vllm", "--block-size"), ("vllm", "--max-model"),
     ("sglang", "--tp"), ("sglang", "--mem-fraction-static"), ("trtllm", "--extra_llm_api_options")],
)  # fmt: skip
def test_extra_args_that_contradict_the_plan_are_rejected(engine: str, flag: str) -> None:
    accel = "gb200" if engine == "trtllm" else "h200"
    doc = resource_for(engine, accel, "bf16", "tp", "bf16", 8192, False, "auto", 1, False)
    other = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests", "trtllm": "--log_level"}[engine]
    doc["spec"]["engine"]["extraArgs"] = [other, flag, "8"]
    resource = parse_resource(doc)
    with pytest.raises(SpecError) as info:
        render(resource, plan(resource.spec))
    assert info.value.field == "spec.engine.extraArgs[1]" and "remove it" in info.value.fix


def test_harmless_extra_args_and_user_env_pass_through() -> None:
    doc = resource_for("vllm", "h200", "bf16", "tp", "bf16", 8192, False, "auto", 1, False)
    doc["spec"]["engine"]["extraArgs"] = ["--max-num-seqs", "64"]
    doc["spec"]["engine"]["env"] = [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]
    deployment = next(o for o in rendered(doc) if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-2:] == ["--max-num-seqs", "64"]
    assert {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"} in container["env"]


def _templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    workload = next(o for o in objects if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    spec = workload["spec"]
    if "template" in spec:
        return [spec["template"]]
    return [spec["leaderWorkerTemplate"]["leaderTemplate"], spec["leaderWorkerTemplate"]["workerTemplate"]]


def _config_data(objects: list[dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    return data


@pytest.mark.parametrize(
    ("accelerator", "parallelism", "change"),
    [
        # single-node: the context only reaches the LLM-API options file
        ("h200", {"strategy": "tp-ep", "tensorParallelSize": 8}, {"context": {"maxModelLen": 65536}}),
        # multi-node: the whole serve command, extraArgs included, lives in the launcher scripts
        ("gb200", None, {"engine": {"extraArgs": ["--log_level", "debug"]}}),
    ],
)
def test_a_change_only_the_engine_config_carries_rolls_every_pod_template(
    accelerator: str, parallelism: dict[str, Any] | None, change: dict[str, Any]
) -> None:
    doc = load_sample(SAMPLES_DIR / "trtllm-gb200-2x4-tep.yaml")
    doc["spec"]["accelerator"] = accelerator
    if parallelism is not None:
        doc["spec"]["parallelism"] = parallelism
    before = rendered(doc)
    for key, value in change.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    after = rendered(doc)
    assert _config_data(before) != _config_data(after)
    old, new = _templates(before), _templates(after)
    for one, other in zip(old, new, strict=True):
        # the ConfigMap is all that changed: without its digest in the template no pod would restart
        assert one["spec"] == other["spec"]
        assert one["metadata"]["annotations"] != other["metadata"]["annotations"]


def test_render_is_deterministic() -> None:
    doc = load_sample(SAMPLE_FILES[0])
    assert dump(rendered(doc), "yaml") == dump(rendered(doc), "yaml")


def _engine_pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    workload = next(o for o in rendered(doc) if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    template = workload["spec"].get("template") or workload["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    spec: dict[str, Any] = template["spec"]
    return spec


def test_mi355x_pods_accept_every_known_product_label_spelling() -> None:
    spec = _engine_pod_spec(load_sample(SAMPLES_DIR / "vllm-mi355x-bf16-tp8.yaml"))
    assert "amd.com/gpu.product-name" not in spec["nodeSelector"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [expression] = terms[0]["matchExpressions"]
    assert expression["key"] == "amd.com/gpu.product-name" and expression["operator"] == "In"
    assert "AMD_Instinct_MI355_OAM" in expression["values"]  # what live MI355X nodes carry


def test_a_label_the_user_selects_on_replaces_the_catalogs_choice() -> None:
    doc = load_sample(SAMPLES_DIR / "vllm-mi355x-bf16-tp8.yaml")
    doc["spec"]["nodePool"] = {"nodeSelector": {"amd.com/gpu.product-name": "My_MI355X"}}
    spec = _engine_pod_spec(doc)
    assert spec["nodeSelector"]["amd.com/gpu.product-name"] == "My_MI355X"
    assert "affinity" not in spec


def test_single_valued_pool_labels_stay_a_node_selector() -> None:
    spec = _engine_pod_spec(load_sample(SAMPLES_DIR / "vllm-h200-tp8.yaml"))
    assert spec["nodeSelector"] == {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.product": "NVIDIA-H200"}
    assert "affinity" not in spec


# --- placement, resources, long context, text-only ---------------------------------------------


def pod_templates_of(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    workload = next(o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    if workload["kind"] == "Deployment":
        return [workload["spec"]["template"]]
    lwt = workload["spec"]["leaderWorkerTemplate"]
    return [lwt["leaderTemplate"], lwt["workerTemplate"]]


def sample_named(stem: str) -> dict[str, Any]:
    return load_sample(next(p for p in SAMPLE_FILES if p.stem == stem))


@pytest.mark.parametrize("stem", ["trtllm-gb200-2x4-tep", "sglang-gb200-mxfp8-2x4-tp8-ep8"])
def test_gb200_groups_stay_in_one_nvlink_domain(stem: str) -> None:
    doc = sample_named(stem)
    objs = rendered(doc)
    name = doc["metadata"]["name"]
    for template in pod_templates_of(objs):
        affinity = template["spec"]["affinity"]
        assert affinity["podAffinity"] == {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"m3fleet.dev/name": name}},
                    "matchLabelKeys": ["leaderworkerset.sigs.k8s.io/group-key"],
                    "topologyKey": "nvidia.com/gpu.clique",
                }
            ]
        }
        # The pod matches its own term (the first pod of a group may start a clique); nothing keeps other
        # groups out of the clique (LWS's exclusive-topology anti-affinity would reserve a whole NVL72 rack).
        assert template["metadata"]["labels"]["m3fleet.dev/name"] == name
        assert "podAntiAffinity" not in affinity
    assert "exclusive-topology" not in json.dumps(objs)


def test_pods_outside_an_nvlink_domain_get_no_pod_affinity() -> None:
    single = rendered(resource_for("sglang", "gb200", "mxfp8", "tp", "bf16", 131072, False, "auto", 1, False))
    h200_two_nodes = rendered(resource_for("sglang", "h200", "bf16", "tp", "bf16", 1048576, False, "auto", 1, False))
    for objs in (single, h200_two_nodes):
        for template in pod_templates_of(objs):
            assert "podAffinity" not in template["spec"].get("affinity", {})


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def test_engine_pods_request_cpu_and_memory(path: Path) -> None:
    objs = rendered(load_sample(path))
    for template in pod_templates_of(objs):
        container = template["spec"]["containers"][0]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        # Burstable, never BestEffort: CPU and memory are requested; memory is limited to its request (the pod is
        # never ranked for eviction by usage above request), CPU is not limited (no CFS throttling).
        assert int(requests["cpu"]) >= 8 and requests["memory"].endswith("Gi")
        assert limits["memory"] == requests["memory"] and "cpu" not in limits
        # /dev/shm stays memory-backed, and fits in the pod's memory with room for the engine.
        (shm,) = [v for v in template["spec"]["volumes"] if v["name"] == "dshm"]
        assert shm["emptyDir"]["medium"] == "Memory"
        assert int(requests["memory"][:-2]) >= 2 * int(shm["emptyDir"]["sizeLimit"][:-2])
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_pod_resources_are_sized_per_gpu_and_overridable() -> None:
    doc = resource_for("vllm", "mi355x", "mxfp8", "tp", "bf16", 8192, False, "auto", 2, False)
    resource = parse_resource(doc)
    p = plan(resource.spec)
    assert p.gpus_per_node == 4 and (p.cpu_per_pod, p.memory_gib_per_pod) == (32, 256)  # half an 8-GPU node's share
    doc["spec"]["nodePool"]["resources"] = {"cpu": 48, "memoryGiB": 384}
    container = pod_templates_of(rendered(doc))[0]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"] == "48"
    assert container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"] == "384Gi"
    doc["spec"]["nodePool"]["resources"] = {"memoryGiB": 32}
    with pytest.raises(SpecError) as info:
        plan(parse_resource(doc).spec)
    assert info.value.field == "spec.nodePool.resources.memoryGiB" and "/dev/shm" in str(info.value)


# The YaRN override must carry the checkpoint's whole RoPE block: SGLang 0.5.23 replaces text_config's
# rope_parameters with it and falls back to theta 10,000 when rope_theta is missing.
YARN_2X = {
    "text_config": {
        "rope_scaling": {
            "rope_type": "yarn",
            "rope_theta": 5_000_000,
            "partial_rotary_factor": 0.5,
            "factor": 2.0,
            "original_max_position_embeddings": 524_288,
        }
    }
}


def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_sglang_one_million_override_keeps_rope_theta() -> None:
    objs = rendered(resource_for("sglang", "h200", "bf16", "tp", "bf16", 1048576, False, "auto", 1, False))
    lws = next(o for o in objs if o["kind"] == "LeaderWorkerSet")
    for argv in engine_argv(lws, "sglang"):
        (override,) = _flag_values(argv, "--json-model-override-args")
        assert json.loads(override) == YARN_2X
        assert _flag_values(argv, "--context-length") == ["1048576"]
        # TP within each H200 node, one pipeline stage per node.
        assert _flag_values(argv, "--tp-size") == ["8"] and _flag_values(argv, "--pp-size") == ["2"]


def test_sglang_workers_are_probed_on_their_health_server() -> None:
    # A non-zero node rank serves /health (and /metrics) only once its schedulers have loaded the weights; probing
    # it keeps the worker, and so the LeaderWorkerSet group, unready until then.
    objs = rendered(resource_for("sglang", "h200", "bf16", "tp", "bf16", 1048576, False, "auto", 1, False))
    lws = next(o for o in objs if o["kind"] == "LeaderWorkerSet")
    worker, guard = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"]
    (port,) = guard["ports"]  # through the key guard, as on the leader: SGLang listens on 127.0.0.1 only
    for kind in ("startup", "readiness", "liveness"):
        assert worker[f"{kind}Probe"]["httpGet"] == {"path": "/health", "port": port["containerPort"]}
    # Startup allows the whole weight load before liveness can restart the group.
    startup = worker["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60 * 60


def test_vllm_one_million_hf_overrides_keep_rope_theta() -> None:
    objs = rendered(sample_named("vllm-mi355x-1m-fp8kv"))
    deployment = next(o for o in objs if o["kind"] == "Deployment")
    (argv,) = engine_argv(deployment, "vllm")
    (override,) = _flag_values(argv, "--hf-overrides")
    assert json.loads(override) == YARN_2X


def test_vllm_on_nvidia_refuses_contexts_past_the_native_window() -> None:
    # vLLM 0.33.0's NVIDIA M3 model builds RoPE from rope_theta alone: a YaRN override would be silently ignored.
    doc = resource_for("vllm", "h200", "bf16", "tp", "bf16", 1048576, False, "auto", 1, False)
    with pytest.raises(SpecError) as info:
        plan(parse_resource(doc).spec)
    assert info.value.field == "spec.context.maxModelLen" and "ignores rope_scaling" in str(info.value)
    assert "variant mxfp8" in info.value.fix and "engine sglang" in info.value.fix


def test_skip_mm_profiling_is_never_rendered() -> None:
    for max_len in (8192, 131072, 524288):
        for accel in ("h200", "mi355x"):
            objs = rendered(resource_for("vllm", accel, "bf16", "tp", "fp8", max_len, False, "auto", 1, False))
            assert "--skip-mm-profiling" not in json.dumps(objs)


def test_language_model_only_does_what_each_engine_really_does() -> None:
    def both(engine: str, accel: str) -> tuple[Any, Any, list[dict[str, Any]]]:
        text = resource_for(engine, accel, "bf16", "tp", "bf16", 8192, True, "auto", 1, False)
        mm = resource_for(engine, accel, "bf16", "tp", "bf16", 8192, False, "auto", 1, False)
        return plan(parse_resource(text).spec), plan(parse_resource(mm).spec), rendered(text)

    text, mm, objs = both("vllm", "h200")
    (argv,) = engine_argv(next(o for o in objs if o["kind"] == "Deployment"), "vllm")
    assert "--language-model-only" in argv and "--mm-encoder-tp-mode" not in argv
    assert text.weights_gib_per_gpu < mm.weights_gib_per_gpu  # the vision tower is never built

    text, mm, objs = both("sglang", "h200")
    (argv,) = engine_argv(next(o for o in objs if o["kind"] == "Deployment"), "sglang")
    assert "--language-model-only" in argv and "--enable-multimodal" not in argv
    assert text.weights_gib_per_gpu == mm.weights_gib_per_gpu  # SGLang still loads the vision tower
    assert any("still builds and loads the vision tower" in n for n in text.notes)

    doc = resource_for("trtllm", "gb200", "bf16", "tp", "bf16", 8192, True, "auto", 1, False)
    with pytest.raises(SpecError) as info:
        plan(parse_resource(doc).spec)
    assert info.value.field == "spec.model.languageModelOnly" and "MiniMaxM3SparseForCausalLM" in str(info.value)


@pytest.mark.parametrize("accel", ["gb200", "h200"])
def test_trtllm_chat_template_exists_for_a_hugging_face_source(accel: str) -> None:
    objs = rendered(resource_for("trtllm", accel, "bf16", "tp-ep", "bf16", 131072, False, "auto", 1, True))
    config = next(o for o in objs if o["kind"] == "ConfigMap")["data"]
    scripts = {k: v for k, v in config.items() if k.endswith(".sh") and k != "launch-worker.sh"}
    (script,) = scripts.values()
    # The hub id is not a directory: the template is fetched into the shared HF cache and that file is passed.
    assert "MiniMaxAI/MiniMax-M3/chat_template.jinja" not in json.dumps(objs)
    assert "hf_hub_download" in script and '--chat_template "${chat_template}"' in script
    assert script.index('chat_template="$(') < script.index('"${chat_template}"')
    pvc = rendered(resource_for("trtllm", accel, "bf16", "tp-ep", "bf16", 131072, False, "auto", 1, False))
    assert "/models/m3/chat_template.jinja" in json.dumps(pvc) and "hf_hub_download" not in json.dumps(pvc)


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.stem for p in SAMPLE_FILES])
def test_every_engine_pod_and_nothing_else_is_under_the_disruption_budget(path: Path) -> None:
    objs = rendered(load_sample(path))
    (budget,) = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["maxUnavailable"] == 1 and budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    selector = budget["spec"]["selector"]["matchLabels"]
    for template in pod_templates_of(objs):  # a LeaderWorkerSet's leaders and workers alike
        assert selector.items() <= template["metadata"]["labels"].items()
    document = load_sample(path)
    document["metadata"]["name"] = "other"
    other = rendered(document)
    for template in pod_templates_of(other):  # another fleet's pods in the namespace are not counted
        assert not selector.items() <= template["metadata"]["labels"].items()

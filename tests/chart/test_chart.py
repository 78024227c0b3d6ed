"""charts/m3fleet rendered and linted by the Helm v4 SDK, for default and non-default values.

Every rendered object is validated (built-in kinds against the Kubernetes 1.33 schemas, strictly;
ServiceMonitor/PodMonitor/KopfPeering against their field lists), and the operator pod is held to
Pod Security "restricted" and to the `m3fleet run` command line it must match.
"""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import pytest
import yaml

from m3fleet import __version__
from m3fleet.api import parse_resource
from m3fleet.catalog import ENGINES
from m3fleet.cli import build_parser
from m3fleet.planner import plan
from m3fleet.render import labels as render_labels
from m3fleet.render import render as render_engine
from m3fleet.render.dynamo import DYNAMO_ROLE
from tests.support.chart import CHART, NAMESPACE, ROOT, by_kind, one, render, render_notes, validate_any
from tests.support.samples import SAMPLE_FILES, SAMPLES_DIR, load_sample

DIGEST = "sha256:" + "0123456789abcdef" * 4
CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "namespace-scoped": {"scope": "namespace", "watchNamespace": "llm"},
    "namespace-scoped-release-ns": {"scope": "namespace", "rbac": {"scanning": False}},
    "standby": {"replicas": 3, "peering": {"enabled": True}},
    "namespace-standby": {"scope": "namespace", "watchNamespace": "llm", "replicas": 2, "peering": {"enabled": True}},
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "dashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "LLM"}},
        }
    },
    "digest": {"image": {"repository": "registry.example.com/m3fleet/operator", "digest": DIGEST}},
    "minimal": {
        "rbac": {"create": False, "aggregateToDefaultRoles": False},
        "serviceAccount": {"create": False, "name": "existing"},
        "metrics": {"service": {"enabled": False}, "scrapeAnnotations": False},
        "nodeSelector": {},
        "resources": {},
    },
    "pinned-priority": {"peering": {"enabled": True, "priority": 100}, "extraEnv": [{"name": "X", "value": "1"}]},
    "webhook-off": {"webhook": {"enabled": False}},
    "narrowed-network": {
        "rbac": {"secretNamespaces": ["llm", "team-a"]},
        "networkPolicy": {
            "webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
            "apiServer": {"cidrs": ["10.0.0.10/32"], "ports": [6443]},
            "prometheus": {"peers": [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}], "queryPort": 9091},
            "extraEgress": [{"ports": [{"protocol": "TCP", "port": 4317}]}],
        },
    },
    "no-network-policy": {"networkPolicy": {"enabled": False}, "rbac": {"admissionPolicy": False}},
    "webhook-outside": {"webhook": {"url": "https://127.0.0.1:9443/validate", "failurePolicy": "Fail"}},
    "webhook-cert-manager": {"webhook": {"certManager": {"enabled": True}}, "scope": "namespace"},
    "webhook-cluster-issuer": {
        "webhook": {"certManager": {"enabled": True, "issuerRef": {"name": "internal-ca", "kind": "ClusterIssuer"}}}
    },
}


def deployment(values: dict[str, Any]) -> dict[str, Any]:
    return one(render(values), "Deployment")


def metrics_service(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(s for s in by_kind(objects, "Service") if s["metadata"]["name"].endswith("-metrics"))


def container(values: dict[str, Any]) -> dict[str, Any]:
    containers = deployment(values)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_lint_is_clean(values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True, kube_version="v1.33.0")
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings and errors are not accepted.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_every_rendered_object_validates(values: dict[str, Any]) -> None:
    objects = render(values)
    assert objects
    for obj in objects:
        validate_any(obj)
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), "duplicate objects"


def test_default_objects() -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in render())
    assert kinds == [
        ("ClusterRole", "m3fleet"),
        ("ClusterRole", "m3fleet-edit"),
        ("ClusterRole", "m3fleet-view"),
        ("ClusterRoleBinding", "m3fleet"),
        ("Deployment", "m3fleet"),
        ("Job", "m3fleet-release-caches"),  # helm uninstall's pre-delete hook (and its Role, RoleBinding)
        ("NetworkPolicy", "m3fleet"),
        ("Role", "m3fleet-release-caches"),
        ("RoleBinding", "m3fleet-release-caches"),
        ("Secret", "m3fleet-webhook-tls"),
        ("Service", "m3fleet-metrics"),
        ("Service", "m3fleet-webhook"),
        ("ServiceAccount", "m3fleet"),
        ("ValidatingAdmissionPolicy", "m3fleet-m3fleet-system-nodes"),
        ("ValidatingAdmissionPolicy", "m3fleet-m3fleet-system-pods"),
        ("ValidatingAdmissionPolicyBinding", "m3fleet-m3fleet-system-nodes"),
        ("ValidatingAdmissionPolicyBinding", "m3fleet-m3fleet-system-pods"),
        ("ValidatingWebhookConfiguration", "m3fleet-m3fleet-system"),
    ]
    assert all(o["metadata"].get("namespace") in (None, NAMESPACE) for o in render())


def test_the_uninstall_hook_releases_the_caches_the_operator_watches_as_its_service_account() -> None:
    for values, scope in (({}, ["--all-namespaces"]), (CASES["namespace-scoped"], ["--namespace", "llm"])):
        objects = render(values)
        hooks = [o for o in objects if (o["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"]
        assert sorted(o["kind"] for o in hooks) == ["Job", "Role", "RoleBinding"]
        job = one(hooks, "Job")
        pod = job["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
        [container] = pod["containers"]
        assert container["image"] == one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
        assert container["args"] == [
            "release-caches",
            *scope,
            "--operator-deployment",
            "m3fleet",
            "--operator-namespace",
            NAMESPACE,
        ]
        build_parser().parse_args(container["args"])  # the CLI takes them
        selector = one(objects, "Deployment")["spec"]["selector"]["matchLabels"].items()
        assert not selector <= job["spec"]["template"]["metadata"]["labels"].items()  # it waits for those pods to go
        role = one(hooks, "Role")
        assert role["metadata"]["namespace"] == NAMESPACE
        assert role["rules"] == [  # only to stop the operator: its own Deployment, and see its pods go
            {
                "apiGroups": ["apps"],
                "resources": ["deployments"],
                "resourceNames": ["m3fleet"],
                "verbs": ["get", "patch"],
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ]


def _ports(rules: list[dict[str, Any]]) -> list[set[tuple[str, int]]]:
    return [{(p["protocol"], p["port"]) for p in rule["ports"]} for rule in rules]


def test_operator_network_policy_admits_the_webhook_and_prometheus_and_reaches_the_apiserver_dns_prometheus() -> None:
    """Ingress: the webhook port (any source unless webhookFrom) and the metrics port (Prometheus only, so no other
    tenant reads every fleet's metrics); egress: the API server, DNS and Prometheus's query port, nothing else."""
    policy = one(render(), "NetworkPolicy")
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == deployment({})["spec"]["selector"]["matchLabels"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    webhook, metrics = spec["ingress"]
    assert _ports([webhook, metrics]) == [{("TCP", 9443)}, {("TCP", 9090)}]
    monitoring = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    }
    assert "from" not in webhook and metrics["from"] == [monitoring]
    assert _ports(spec["egress"]) == [{("TCP", 443), ("TCP", 6443)}, {("UDP", 53), ("TCP", 53)}, {("TCP", 9090)}]
    assert [rule.get("to") for rule in spec["egress"]] == [None, None, [monitoring]]
    container_ports = {p["containerPort"] for p in container({})["ports"]}
    assert {9443, 9090} <= container_ports  # the ports the policy opens are the ones the operator serves

    narrowed = one(render(CASES["narrowed-network"]), "NetworkPolicy")["spec"]
    assert narrowed["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    assert narrowed["egress"][0] == {
        "ports": [{"protocol": "TCP", "port": 6443}],
        "to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}],
    }
    assert _ports(narrowed["egress"])[2:] == [{("TCP", 9091)}, {("TCP", 4317)}]
    assert narrowed["egress"][2]["to"] == [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]
    assert _ports(one(render({"webhook": {"enabled": False}}), "NetworkPolicy")["spec"]["ingress"]) == [{("TCP", 9090)}]
    assert not by_kind(render(CASES["no-network-policy"]), "NetworkPolicy")


def test_chart_crds_are_the_repositorys() -> None:
    """The chart ships the MiniMaxM3Deployment and MiniMaxM3ModelCache CRDs (identical to crds/) and kopf's two
    peering CRDs."""
    chart = helm.Chart.load(str(CHART))
    try:
        crds = {c["name"]: c["data"] for c in chart.crds}
    finally:
        chart.close()
    assert sorted(crds) == [
        "crds/kopf.dev_clusterkopfpeerings.yaml",
        "crds/kopf.dev_kopfpeerings.yaml",
        "crds/m3fleet.dev_minimaxm3deployments.yaml",
        "crds/m3fleet.dev_minimaxm3modelcaches.yaml",
    ]
    for name in ("m3fleet.dev_minimaxm3deployments.yaml", "m3fleet.dev_minimaxm3modelcaches.yaml"):
        assert crds[f"crds/{name}"] == (ROOT / "crds" / name).read_text()


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_operator_pod_is_pod_security_restricted(values: dict[str, Any]) -> None:
    pod = deployment(values)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key)
    allowed = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    for volume in pod.get("volumes", []):
        assert set(volume) - {"name"} <= allowed
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["runAsNonRoot"] is True
        assert sc.get("privileged") is not True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c.get("ports") and all("hostPort" not in p for p in c["ports"])
    # A writable /tmp on the read-only root filesystem.
    assert {"name": "tmp", "mountPath": "/tmp"} in pod["containers"][0]["volumeMounts"]


@pytest.mark.parametrize(
    ("values", "args"),
    [
        ({}, ["run", "--all-namespaces", "--standalone"]),
        ({"scope": "namespace", "watchNamespace": "llm"}, ["run", "--namespace", "llm", "--standalone"]),
        ({"scope": "namespace"}, ["run", "--namespace", NAMESPACE, "--standalone"]),
        ({"replicas": 2, "peering": {"enabled": True}}, ["run", "--all-namespaces"]),
        ({"scope": "namespace", "peering": {"enabled": True}}, ["run", "--namespace", NAMESPACE]),
    ],
    ids=["cluster", "namespace", "namespace-default", "cluster-peering", "namespace-peering"],
)
def test_args_by_mode_parse_as_m3fleet_run(values: dict[str, Any], args: list[str]) -> None:
    rendered = container(values)["args"]
    webhook = ["--webhook-port", "9443", "--webhook-cert-dir", "/etc/m3fleet/webhook"]
    assert rendered == [*args, "--liveness-port", "8080", "--metrics-port", "9090", *webhook]
    parsed = build_parser().parse_args(rendered)
    assert parsed.command == "run"
    assert parsed.all_namespaces == ("--all-namespaces" in args)
    assert parsed.namespace == (args[2] if "--namespace" in args else None)
    assert parsed.standalone == ("--standalone" in args)
    assert (parsed.liveness_port, parsed.metrics_port) == (8080, 9090)


def test_probes_ports_and_resources() -> None:
    c = container({})
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"healthz": 8080, "metrics": 9090, "webhook": 9443}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    # The parser's defaults are what the chart passes explicitly.
    defaults = build_parser().parse_args(["run"])
    assert (defaults.liveness_port, defaults.metrics_port) == (8080, 9090)
    annotations = deployment({})["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9090",
        "prometheus.io/path": "/metrics",
    }
    service = metrics_service(render())
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = deployment({})["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize(("replicas", "strategy"), [(0, "Recreate"), (1, "Recreate"), (3, "RollingUpdate")])
def test_strategy_follows_replicas(replicas: int, strategy: str) -> None:
    values = {"replicas": replicas, "peering": {"enabled": replicas > 1}}
    objects = render(values)
    spec = one(objects, "Deployment")["spec"]
    assert spec["replicas"] == replicas
    assert spec["strategy"]["type"] == strategy
    pod = spec["template"]["spec"]
    if replicas > 1:
        assert one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
        term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    else:
        assert not by_kind(objects, "PodDisruptionBudget")
        assert "affinity" not in pod


def test_user_affinity_wins() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    pod = deployment({"replicas": 2, "peering": {"enabled": True}, "affinity": affinity})["spec"]["template"]["spec"]
    assert pod["affinity"] == affinity


def test_peering_objects_and_env() -> None:
    import inspect

    from m3fleet.controller import run

    assert 'peering_name="m3fleet"' in inspect.getsource(run), "the chart's peering object name follows run.py"
    assert not by_kind(render(), "ClusterKopfPeering") and not by_kind(render(), "KopfPeering")
    cluster = one(render({"peering": {"enabled": True}}), "ClusterKopfPeering")
    assert cluster["metadata"]["name"] == "m3fleet" and "namespace" not in cluster["metadata"]
    namespaced = one(
        render({"scope": "namespace", "watchNamespace": "llm", "peering": {"enabled": True}}), "KopfPeering"
    )
    assert (namespaced["metadata"]["namespace"], namespaced["metadata"]["name"]) == ("llm", "m3fleet")

    env = {e["name"]: e for e in container({"peering": {"enabled": True, "priority": 100}})["env"]}
    assert env["M3FLEET_PEERING_PRIORITY"]["value"] == "100"
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    standby_env = {e["name"] for e in container({"replicas": 2, "peering": {"enabled": True}})["env"]}
    assert "M3FLEET_PEERING_PRIORITY" not in standby_env  # a random priority per pod (controller/run.py)
    assert "M3FLEET_PEERING_LIFETIME_SECONDS" not in standby_env  # kopf's 60 s
    quick = {
        e["name"]: e for e in container({"replicas": 2, "peering": {"enabled": True, "lifetimeSeconds": 20}})["env"]
    }
    assert quick["M3FLEET_PEERING_LIFETIME_SECONDS"]["value"] == "20"


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ({}, f"ghcr.io/m3fleet/operator:{__version__}"),
        ({"tag": "0.2.0-rc1"}, "ghcr.io/m3fleet/operator:0.2.0-rc1"),
        ({"tag": "ignored", "digest": DIGEST}, f"ghcr.io/m3fleet/operator@{DIGEST}"),
    ],
)
def test_image_reference(image: dict[str, str], expected: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == chart["version"] == __version__  # one version: pyproject's (hack/generate.py)
    assert container({"image": image})["image"] == expected


def test_service_monitor_scrapes_the_metrics_service() -> None:
    objects = render(CASES["monitoring"])
    monitor, service = one(objects, "ServiceMonitor"), metrics_service(objects)
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # keep the metrics' own namespace/name labels


def _vllm_over_two_nodes() -> dict[str, Any]:
    """No sample spans nodes on vLLM: the H200 TP8 one at 1M tokens for three sequences (TP16, two nodes)."""
    document = load_sample(next(p for p in SAMPLE_FILES if p.name == "vllm-h200-tp8.yaml"))
    document["spec"]["model"] = {"variant": "mxfp8", "source": {"pvc": {"claimName": "m3-weights-mxfp8"}}}
    document["spec"]["context"] = {"maxModelLen": 1_048_576, "minSequencesAtMaxLen": 3}
    document["spec"]["parallelism"] = {"strategy": "tp", "tensorParallelSize": 0}
    return document


def _engine_pods(component: str = "engine") -> list[dict[str, Any]]:
    """Pod templates of every sample, disaggregated ones too (and of vLLM over two nodes), as the operator renders
    them: the engines', or another `component`'s (spec.gateway's endpoint-picker, a disaggregated frontend)."""
    pods = []
    disaggregated = sorted((SAMPLES_DIR / "disaggregated").glob("*.yaml"))
    for document in [*(load_sample(path) for path in [*SAMPLE_FILES, *disaggregated]), _vllm_over_two_nodes()]:
        resource = parse_resource(document)
        for obj in render_engine(resource, plan(resource.spec)):
            if obj["metadata"]["labels"].get("app.kubernetes.io/component") != component:
                continue
            if obj["kind"] == "Deployment":
                pods.append(obj["spec"]["template"])
            elif obj["kind"] == "LeaderWorkerSet":
                template = obj["spec"]["leaderWorkerTemplate"]
                pods += [template["leaderTemplate"], template["workerTemplate"]]
    return pods


SCRAPE_ANNOTATION = "__meta_kubernetes_pod_annotation_prometheus_io_scrape"


ROLE_LABEL = "__meta_kubernetes_pod_label_m3fleet_dev_dynamo_role"
ROLE_SERIES_LABEL = "m3fleet_dev_dynamo_role"  # what the autoscaler selects each role's series by


def _kept(endpoint: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Whether the endpoint's keep and drop rules (Prometheus's relabelling, the meta labels it reads) keep this pod."""
    meta = {
        SCRAPE_ANNOTATION: (pod["metadata"].get("annotations") or {}).get("prometheus.io/scrape", ""),
        "__meta_kubernetes_pod_label_m3fleet_dev_engine": pod["metadata"]["labels"].get(render_labels.ENGINE, ""),
        ROLE_LABEL: pod["metadata"]["labels"].get(DYNAMO_ROLE, ""),
    }
    rules = [r for r in endpoint["relabelings"] if r["action"] in ("keep", "drop")]
    assert {r["sourceLabels"][0] for r in rules} <= set(meta)
    return all(bool(re.fullmatch(r["regex"], meta[r["sourceLabels"][0]])) == (r["action"] == "keep") for r in rules)


def test_pod_monitor_scrapes_every_pod_that_exports_engine_metrics() -> None:
    monitor = one(render(CASES["monitoring"]), "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector == {render_labels.MANAGED_BY: render_labels.MANAGER}
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    (picker,) = [e for e in endpoints if e["port"] == "metrics"]  # spec.gateway's endpoint pickers
    (dynamo,) = [e for e in endpoints if e["port"] == "system"]  # spec.disaggregation's workers
    endpoints = [e for e in endpoints if e is not picker and e is not dynamo]
    picker_label = "__meta_kubernetes_pod_label_m3fleet_dev_endpoint_picker"
    assert [r["sourceLabels"] for r in picker["relabelings"]] == [[picker_label]]
    pickers = _engine_pods("endpoint-picker")
    assert pickers, "a sample with spec.gateway renders a picker"
    for pod in pickers:
        name = pod["metadata"]["labels"]["m3fleet.dev/endpoint-picker"]
        assert re.fullmatch(picker["relabelings"][0]["regex"], name)
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(
            next(p["containerPort"] for p in pod["spec"]["containers"][0]["ports"] if p["name"] == picker["port"])
        )
        assert pod["metadata"]["labels"][render_labels.MANAGED_BY] == render_labels.MANAGER  # the selector's
    assert re.fullmatch(picker["relabelings"][0]["regex"], "") is None  # engine pods lack the label: not kept
    assert {e["relabelings"][1]["regex"]: e["path"] for e in endpoints} == {
        str(name): facts.metrics_path for name, facts in ENGINES.items()
    }
    assert {e["path"] for e in endpoints} == {"/metrics", "/prometheus/metrics"}
    for e in endpoints:
        targets = {r["targetLabel"] for r in e["relabelings"] if r["action"] == "replace"}
        assert targets == {"m3fleet_dev_name", "m3fleet_dev_engine", "m3fleet_dev_accelerator", "m3fleet_dev_tier"}

    # A disaggregated fleet's prefill and decode workers: only the Dynamo endpoint, on their system port, with the role
    # the autoscaler reads each role by; its frontend (no engine metrics) by none.
    roles = {
        "frontend": _engine_pods("frontend"),
        "workers": [p for p in _engine_pods() if DYNAMO_ROLE in p["metadata"]["labels"]],
    }
    assert roles["frontend"] and roles["workers"], "the disaggregated sample renders a frontend and workers"
    assert not any(_kept(e, p) for e in [*endpoints, dynamo] for p in roles["frontend"])
    role_targets = {r["targetLabel"] for r in dynamo["relabelings"] if r["action"] == "replace"}
    assert ROLE_SERIES_LABEL in role_targets and "m3fleet_dev_name" in role_targets
    for pod in roles["workers"]:
        served = [e for e in [*endpoints, dynamo] if _kept(e, pod)]
        annotations = pod["metadata"]["annotations"]
        ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        if annotations.get("prometheus.io/scrape") != "true":
            assert not served  # a multi-node worker's non-leader pods
            continue
        assert served == [dynamo] and annotations["prometheus.io/path"] == dynamo["path"]
        assert annotations["prometheus.io/port"] == str(ports[dynamo["port"]])

    pods = [p for p in _engine_pods() if DYNAMO_ROLE not in p["metadata"]["labels"]]
    scraped = [p for p in pods if any(_kept(e, p) for e in endpoints)]
    serving = [p for p in pods if p["metadata"]["labels"].get(render_labels.SERVING) == "true"]
    workers = [p for p in pods if p["metadata"]["labels"][render_labels.ROLE] == "worker"]
    # Every serving pod, and of the multi-node workers SGLang's only (its worker nodes' DP ranks export there;
    # vLLM's headless workers and TensorRT-LLM's MPI ranks serve nothing).
    assert all(p in scraped for p in serving)
    assert {p["metadata"]["labels"][render_labels.ENGINE] for p in workers} >= {"vllm", "sglang", "trtllm"}
    for pod in workers:
        assert (pod in scraped) == (pod["metadata"]["labels"][render_labels.ENGINE] == "sglang")
    for pod in scraped:
        (endpoint,) = [e for e in endpoints if _kept(e, pod)]
        ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        annotations = pod["metadata"]["annotations"]
        assert endpoint["port"] in ports
        assert annotations["prometheus.io/path"] == endpoint["path"]
        assert annotations["prometheus.io/port"] == str(ports[endpoint["port"]])


def test_pod_monitor_namespace_scoped() -> None:
    values = {"scope": "namespace", "watchNamespace": "llm", "metrics": {"podMonitor": {"enabled": True}}}
    monitor = one(render(values), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}


def test_dashboard_config_map() -> None:
    cm = one(render(CASES["monitoring"]), "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    shipped = json.loads((ROOT / "manifests/dashboards/m3fleet-fleet.json").read_text())
    assert json.loads(cm["data"]["m3fleet-fleet.json"]) == shipped
    assert one(render({"metrics": {"dashboard": {"enabled": True}}}), "ConfigMap")["metadata"]["namespace"] == NAMESPACE


def test_notes_tell_what_to_do_next() -> None:
    notes = render_notes()
    for text in (
        "kubectl -n m3fleet-system rollout status deployment/m3fleet",
        "m3fleet plan -f manifests/samples/vllm-h200-tp8.yaml",
        "kubectl get m3d -n llm -w",
        "kubectl describe m3d",
        "kubectl -n llm port-forward service/m3-vllm-h200-tp8-api 8000:8000",  # render's Service <name>-api
        "LeaderWorkerSet",
        "kubectl apply --server-side --force-conflicts -f charts/m3fleet/crds/",
        "every namespace",
    ):
        assert text in notes
    scoped = render_notes({"scope": "namespace", "watchNamespace": "llm", "metrics": {"podMonitor": {"enabled": True}}})
    assert "in namespace llm only" in scoped
    assert "PodMonitor" in scoped
    assert "does not watch" not in scoped
    elsewhere = render_notes({"scope": "namespace", "metrics": {"service": {"enabled": False}}})
    assert "The samples use namespace llm, which this operator does not watch" in elsewhere
    assert "Metrics:" not in elsewhere


# --- values.yaml and values.schema.json --------------------------------------------------------


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def _leaves(values: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths of values.yaml keys; descends only into objects the schema describes field by field."""
    if not isinstance(values, dict) or "properties" not in schema:
        return [path]
    out = []
    for key, value in values.items():
        assert key in schema["properties"], f"{path}.{key} is in values.yaml but not in values.schema.json"
        out += _leaves(value, schema["properties"][key], f"{path}.{key}")
    return out


def test_values_yaml_and_schema_agree() -> None:
    schema = _schema()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = helm.Chart.load(str(CHART))
    try:
        chart.validate_schema(values)
    finally:
        chart.close()
    assert _leaves(values, schema)

    def walk(node: dict[str, Any], path: str, value: Any) -> None:
        assert node.get("description"), f"{path or '<root>'} has no description"
        if "properties" not in node:
            return
        assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"
        for key, child in node["properties"].items():
            if key == "global" and not path:
                continue  # Helm's own
            assert isinstance(value, dict) and key in value, f"{path}.{key} has no default in values.yaml"
            walk(child, f"{path}.{key}", value[key])

    walk(schema, "", values)


BAD_VALUES = [
    ({"scope": "global"}, "at '/scope': value must be one of 'cluster', 'namespace'"),
    ({"replicas": "two"}, "at '/replicas': got string, want integer"),
    ({"replicas": -1}, "at '/replicas'"),
    ({"image": {"digest": "sha256:abc"}}, "at '/image/digest': 'sha256:abc' does not match pattern"),
    ({"image": {"repository": "ghcr.io/m3fleet/operator@sha256:" + "a" * 64}}, "at '/image/repository'"),
    ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
    ({"rbac": {"secretNamespaces": ["Team A"]}}, "at '/rbac/secretNamespaces/0': 'Team A' does not match pattern"),
    ({"networkPolicy": {"apiServer": {"cidrs": ["10.0.0.1"]}}}, "at '/networkPolicy/apiServer/cidrs/0'"),
    ({"imge": {"tag": "x"}}, "additional properties 'imge' not allowed"),
    ({"rbac": {"wildcards": True}}, "at '/rbac': additional properties 'wildcards' not allowed"),
    ({"metrics": {"serviceMonitor": {"interval": "30 seconds"}}}, "at '/metrics/serviceMonitor/interval'"),
    ({"watchNamespace": "LLM"}, "at '/watchNamespace'"),
    ({"peering": {"enabled": "yes"}}, "at '/peering/enabled': got string, want boolean"),
    ({"podLabels": {"team": 1}}, "at '/podLabels/team': got number, want string"),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=[str(v) for v, _ in BAD_VALUES])
def test_schema_rejects_bad_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as exc:
        render(values)
    assert message in str(exc.value)
    report = helm.lint(str(CHART), values, strict=True, kube_version="v1.33.0")
    assert any(message in e for e in report["errors"])


CROSS_FIELD = [
    ({"replicas": 2}, "replicas: 2 needs peering.enabled=true"),
    (
        {"replicas": 2, "peering": {"enabled": True, "priority": 7}},
        "peering.priority: 7 would be shared by all 2 replicas",
    ),
    ({"peering": {"priority": 7}}, "peering.priority is only used with peering.enabled=true"),
    ({"watchNamespace": "llm"}, 'watchNamespace: "llm" is only used with scope=namespace'),
    (
        {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
        "metrics.serviceMonitor.enabled needs metrics.service.enabled=true",
    ),
    ({"serviceAccount": {"create": False}}, "serviceAccount.create=false needs serviceAccount.name"),
    (
        {"scope": "namespace", "rbac": {"secretNamespaces": ["other"]}},
        "rbac.secretNamespaces: [other] is only used with scope=cluster",
    ),
    ({"webhook": {"port": 9090}}, "webhook.port: 9090 is taken by the operator's liveness (8080) or metrics (9090)"),
    ({"podLabels": {"app.kubernetes.io/name": "x"}}, "podLabels: app.kubernetes.io/name is the Deployment's selector"),
    (
        {"metrics": {"podMonitor": {"enabled": True, "interval": "15s", "scrapeTimeout": "1m"}}},
        "metrics.podMonitor.scrapeTimeout: 1m is longer than its interval 15s",
    ),
    (
        {"metrics": {"serviceMonitor": {"enabled": True, "interval": "1m", "scrapeTimeout": "1m500ms"}}},
        "metrics.serviceMonitor.scrapeTimeout: 1m500ms is longer than its interval 1m",
    ),
]


def test_scrape_timeouts_up_to_the_interval_render() -> None:
    for interval, timeout in (("15s", "15s"), ("1m", "59s"), ("1m30s", "1m"), ("2s", "1500ms")):
        monitor = {"enabled": True, "interval": interval, "scrapeTimeout": timeout}
        (rendered,) = [o for o in render({"metrics": {"podMonitor": monitor}}) if o["kind"] == "PodMonitor"]
        assert rendered["spec"]["podMetricsEndpoints"][0]["scrapeTimeout"] == timeout


def test_a_release_name_starting_with_a_digit_is_refused_with_the_fix() -> None:
    """Helm allows it; a Service name (DNS-1035) does not."""
    with pytest.raises(helm.HelmRenderError) as exc:
        render(name="1fleet")
    assert 'the name "1fleet-m3fleet", which starts with a digit' in str(exc.value)
    assert "set fullnameOverride" in str(exc.value)
    (service,) = [o for o in render({"fullnameOverride": "fleet"}, name="1fleet") if o["kind"] == "Service"][:1]
    assert service["metadata"]["name"].startswith("fleet")


@pytest.mark.parametrize(("values", "message"), CROSS_FIELD, ids=[m.split(" ")[0] for _, m in CROSS_FIELD])
def test_cross_field_rules_fail_with_a_fix(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError) as exc:
        render(values)
    assert message in str(exc.value)
    assert "; " in str(exc.value) or ": " in str(exc.value)


def test_model_cache_rules_reach_the_operator_and_it_accepts_them() -> None:
    """modelCache.allowedPathPrefixes and allowedStagerImages become the env `m3fleet run` reads at startup; the
    defaults are the operator's own (a dedicated directory, the operator image's repository)."""
    from m3fleet.api.cache import DEFAULT_PATH_PREFIXES, allowed_image_repositories, allowed_prefixes

    env = {e["name"]: e.get("value") for e in container({})["env"]}
    assert allowed_prefixes(env["M3FLEET_CACHE_PATH_PREFIXES"]) == DEFAULT_PATH_PREFIXES
    assert allowed_image_repositories(env["M3FLEET_STAGER_IMAGES"], "x:1") == ("ghcr.io/m3fleet/operator",)
    values = {
        "image": {"repository": "mirror.local/m3fleet/operator"},
        "modelCache": {"allowedPathPrefixes": ["/raid/m3fleet"], "allowedStagerImages": ["mirror.local/stager"]},
    }
    env = {e["name"]: e.get("value") for e in container(values)["env"]}
    assert (
        env["M3FLEET_CACHE_PATH_PREFIXES"] == "/raid/m3fleet" and env["M3FLEET_STAGER_IMAGES"] == "mirror.local/stager"
    )
    mirrored = container({"image": {"repository": "mirror.local/m3fleet/operator"}})["env"]
    assert {e["name"]: e.get("value") for e in mirrored}["M3FLEET_STAGER_IMAGES"] == "mirror.local/m3fleet/operator"

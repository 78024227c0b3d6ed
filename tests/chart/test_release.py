"""The release's dry run (hack/release.sh --dry-run, what .github/workflows/release.yml runs with --push on a tag):
every step that needs no credentials runs here — the image (hack/build-image.sh, cached), `helm package`, the CLI's
sdist and wheel with `twine check` — and each artifact carries the one version, pyproject.toml's. The pushes it
cannot do here (registry, cosign, PyPI) are said, not done."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import yaml

from m3fleet.catalog import gateway
from tests.support.chart import ROOT

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def helm() -> Path:
    built = subprocess.run(["bash", ".ci/control-plane.sh"], cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    return Path(built.stdout.strip().splitlines()[-1]) / "helm"


def test_the_dry_run_builds_every_artifact_of_the_one_version() -> None:
    env = {**os.environ, "PYTHON": sys.executable, "HELM": str(helm())}
    env.pop("GITHUB_REF_TYPE", None)
    result = subprocess.run(
        ["bash", "hack/release.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200
    )
    assert result.returncode == 0, result.stderr[-5000:]
    dist = ROOT / "dist"

    with tarfile.open(dist / f"m3fleet-{VERSION}.tgz") as chart:
        member = chart.extractfile("m3fleet/Chart.yaml")
        assert member is not None
        meta = yaml.safe_load(member.read())
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)

    with zipfile.ZipFile(dist / f"m3fleet-{VERSION}-py3-none-any.whl") as wheel:
        metadata = Parser().parsestr(wheel.read(f"m3fleet-{VERSION}.dist-info/METADATA").decode())
        entry_points = wheel.read(f"m3fleet-{VERSION}.dist-info/entry_points.txt").decode()
    assert metadata["Name"] == "m3fleet" and metadata["Version"] == VERSION
    assert "m3fleet = m3fleet.cli:main" in entry_points
    assert (dist / f"m3fleet-{VERSION}.tar.gz").is_file()
    with zipfile.ZipFile(dist / f"m3fleet_simulator-{VERSION}-py3-none-any.whl") as wheel:  # m3fleet[simulate]
        metadata = Parser().parsestr(wheel.read(f"m3fleet_simulator-{VERSION}.dist-info/METADATA").decode())
        entry_points = wheel.read(f"m3fleet_simulator-{VERSION}.dist-info/entry_points.txt").decode()
    assert metadata["Name"] == "m3fleet-simulator" and metadata["Requires-Dist"] == f"m3fleet=={VERSION}"
    assert "simulate = m3fleet_simulator.command:register" in entry_points
    assert (dist / f"m3fleet_simulator-{VERSION}.tar.gz").is_file()

    with tarfile.open(dist / f"m3fleet-operator-{VERSION}.oci.tar") as archive:
        index_file = archive.extractfile("index.json")
        assert index_file is not None
        index = json.load(index_file)
    names = [m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in index["manifests"]]
    values = yaml.safe_load((ROOT / "charts" / "m3fleet" / "values.yaml").read_text())
    assert names == [f"{values['image']['repository']}:{VERSION}"], index  # what the chart pulls

    for push in ("buildah manifest push --all", "cosign sign --yes", "helm push", "pypa/gh-action-pypi-publish"):
        assert f"dry run, would run: {push}" in result.stderr, push
    # The endpoint picker image spec.gateway renders is released too, under its own pin.
    epp = gateway.EPP_IMAGE
    assert f"buildah manifest push --all --digestfile dist/epp-image.digest {epp} docker://{epp}" in result.stderr


def test_the_workflow_runs_the_release_script_on_a_version_tag() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as True
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    runs = "\n".join(str(step.get("run", "")) for step in steps)
    uses = [str(step.get("uses", "")) for step in steps]
    assert "hack/release.sh --push" in runs
    assert any(u.startswith("sigstore/cosign-installer@") for u in uses)
    assert any(u.startswith("actions/setup-go@") for u in uses)  # hack/build-epp-image.sh builds the picker
    assert any(u.startswith("pypa/gh-action-pypi-publish@") for u in uses)
    jobs = workflow["jobs"].values()
    publish = next(job for job in jobs if any("pypi-publish" in str(s.get("uses")) for s in job["steps"]))
    assert publish["permissions"] == {"id-token": "write"}  # trusted publishing: no token secret

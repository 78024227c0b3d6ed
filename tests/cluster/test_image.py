"""The operator image (hack/build-image.sh, operator/Dockerfile) runs the chart's container on the real tier.

The container is the one the chart's Deployment declares — its args, env and volume mounts, read back from the
cluster after `helm install` — run from the image's root filesystem as a kubelet would (tests/support/cluster/image.py):
read-only root, uid 65532 with no passwd entry and no home, the ServiceAccount token and CA at the in-cluster path
with KUBERNETES_SERVICE_HOST/PORT, no kubeconfig. Only the ports move to free loopback ports (the host's network is
shared) and POD_ID (a fieldRef, set by a kubelet) stays unset: the image crashed at start without it until the peer
identity fell back to the numeric uid. It logs in with the token, reconciles a sample to Ready, refuses a spec the
planner refuses through the chart's webhook, and serves /metrics with the fleet's series.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.cluster.cluster import OPERATOR_NAMESPACE, OPERATOR_SA, RELEASE, REPO, Cluster, eventually
from tests.support.cluster.fleet import delete, renamed, sample, wait_ready, weight_volumes, write_manifest
from tests.support.cluster.image import SERVICE_ACCOUNT_DIR, Image, build_image, unpacked
from tests.support.ports import free_port

NAMESPACE = "image"
IMAGE_UID = 65532
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    with unpacked(build_image(), tmp_path_factory.mktemp("image")) as unpacked_image:
        yield unpacked_image


def test_the_image_says_what_it_is_and_runs_as_65532(image: Image) -> None:
    labels = image.labels
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.source"].startswith("https://github.com/")
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", labels["org.opencontainers.image.revision"]), labels
    assert image.config["User"] == f"{IMAGE_UID}:{IMAGE_UID}"
    assert image.config["Entrypoint"] == ["m3fleet"] and image.config["Cmd"] == ["run", "--all-namespaces"]


def test_the_image_carries_no_simulator_and_says_how_to_get_one(image: Image) -> None:
    """The autoscaling simulator is a distribution of its own (simulator/, `m3fleet[simulate]`): the operator's image
    has neither its package nor the modules it once was, and its `m3fleet simulate` says so in one line, exit 2."""
    site_packages = sorted(image.rootfs.glob("opt/m3fleet/lib/python3*/site-packages"))
    assert site_packages, "the image has no /opt/m3fleet venv"
    assert (site_packages[0] / "m3fleet" / "autoscaling" / "policy" / "__init__.py").is_file()  # the policy ships
    carried = [
        str(path.relative_to(image.rootfs))
        for pattern in ("m3fleet_simulator*", "m3fleet*simulator*", "m3fleet/autoscaling/simulat*.py")
        for path in site_packages[0].glob(pattern)
    ]
    assert not carried, carried
    result = subprocess.run(
        image.command(["simulate", "--scenario", "steady-chat"], {}, {}), capture_output=True, text=True, timeout=120
    )
    assert (result.returncode, result.stdout) == (2, ""), (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and "pip install 'm3fleet[simulate]'" in result.stderr, result.stderr


def chart_container(cluster: Cluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chart's operator Deployment's pod spec and its one container, as installed."""
    deployment = cluster.get("deployment", RELEASE, OPERATOR_NAMESPACE)
    assert deployment is not None, "the chart made no operator Deployment"
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def with_ports(args: list[str], ports: dict[str, int]) -> list[str]:
    """The chart's args with each port flag's value replaced (every one of them must be there)."""
    missing = [flag for flag in ports if flag not in args]
    assert not missing, f"the chart's operator args lack {missing}: {args}"
    return [str(ports[args[i - 1]]) if i and args[i - 1] in ports else arg for i, arg in enumerate(args)]


def service_account_volume(cluster: Cluster, directory: Path) -> tuple[Path, str, str]:
    """What the kubelet projects at the ServiceAccount path: a TokenRequest token, the cluster CA, the namespace."""
    token, user, credential = cluster.service_account_token(OPERATOR_NAMESPACE, OPERATOR_SA)
    directory.mkdir()
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes(cluster.control_plane.ca.cert.read_bytes())
    (directory / "namespace").write_text(OPERATOR_NAMESPACE)
    return directory, user, credential


def secret_volume(source: Path, directory: Path) -> Path:
    """The files of `source` as a kubelet projects a Secret volume: mode 0644 (the volume's defaultMode), root's."""
    directory.mkdir()
    for item in source.iterdir():
        (directory / item.name).write_bytes(item.read_bytes())
        (directory / item.name).chmod(0o644)
    return directory


def refused(name: str) -> dict[str, Any]:
    """Admitted by the CRD's schema; the planner refuses it (9 GPUs a pod on 8-GPU H200 nodes)."""
    document = renamed(sample("vllm-h200-tp8"), name, NAMESPACE)
    document["spec"]["nodePool"] = {"extraResources": {"nvidia.com/gpu": 9}}
    return document


def fleet_series(port: int, name: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("namespace") == NAMESPACE and s.labels.get("name") == name
    }


def mounted_read_only(pid: int, path: str) -> bool:
    """Whether `path` (in the process's own view) is a read-only mount, from /proc/PID/mountinfo."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == path:
            return "ro" in fields[5].split(",")
    return False


def process_uids(pid: int) -> list[str]:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))


def test_the_charts_container_from_the_image_logs_in_reconciles_admits_and_exports(
    chart: Cluster, image: Image, tmp_path: Path
) -> None:
    pod, container = chart_container(chart)
    assert container["image"].endswith(f":{VERSION}"), container["image"]  # the chart runs this version's image
    assert pod["securityContext"]["runAsUser"] == IMAGE_UID and container["securityContext"]["readOnlyRootFilesystem"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/tmp": "tmp", "/etc/m3fleet/webhook": "webhook-tls"}, mounts  # /tmp: the launcher's tmpfs
    liveness, metrics = free_port(), free_port()
    args = with_ports(
        container["args"],
        {"--liveness-port": liveness, "--metrics-port": metrics, "--webhook-port": chart.webhook_ports[RELEASE]},
    )
    env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}  # POD_ID (a fieldRef): unset
    assert "POD_ID" not in env
    api = urllib.parse.urlsplit(chart.control_plane.server)
    env |= {"KUBERNETES_SERVICE_HOST": str(api.hostname), "KUBERNETES_SERVICE_PORT": str(api.port)}
    tokens, user, credential = service_account_volume(chart, tmp_path / "serviceaccount")
    certificate = secret_volume(chart.webhook_cert_dir(RELEASE), tmp_path / "webhook-tls")
    volumes = {SERVICE_ACCOUNT_DIR: tokens, "/etc/m3fleet/webhook": certificate}
    command = image.command(args, volumes, env)

    chart.namespace(NAMESPACE)
    weight_volumes(chart, NAMESPACE)
    with chart.operator_process("operator-image", command, {}, liveness, user, credential) as running:
        pid = running.process.pid
        assert process_uids(pid) == [str(IMAGE_UID)] * 4, "the operator does not run as the image's user"
        assert mounted_read_only(pid, "/"), "the operator's root filesystem is writable"
        assert not mounted_read_only(pid, "/tmp")

        refusal = chart.kubectl(
            "apply", "--server-side", "-f", str(write_manifest(tmp_path, refused("too-big"))), check=False
        )
        denied = 'admission webhook "validate.minimaxm3deployments.m3fleet.dev" denied the request'
        assert refusal.returncode != 0 and denied in refusal.stderr, refusal.stderr
        assert chart.get("m3d", "too-big", NAMESPACE) is None

        try:
            chart.apply(renamed(sample("vllm-h200-tp8"), "from-image", NAMESPACE))
            wait_ready(chart, "from-image", NAMESPACE)
            series = eventually(
                "the fleet's series on /metrics",
                lambda: (s := fleet_series(metrics, "from-image")).get("m3fleet_ready_replicas") == 1 and s,
                30,
            )
            assert series["m3fleet_desired_replicas"] == 1
        finally:
            delete(chart, "from-image", NAMESPACE)

    logged_in = running.requests()
    assert logged_in, "the apiserver saw no request with the ServiceAccount token"
    assert any(e.get("verb") == "patch" and (e.get("objectRef") or {}).get("name") == "from-image" for e in logged_in)
    assert "Traceback" not in running.log(), running.log()[-3000:]

"""m3fleet's endpoint picker (EPP) on the cluster tier: its build (.ci/epp.sh: GIE v1.3.0's EPP with our
m3fleet-context-tier filter), the GIE CRDs from the module it pins, the EPP run as a process on loopback against the
real apiserver with a ServiceAccount token as its pod would have, and engine stand-ins on the serving pods' own
addresses (kwok gives pods on the nodes with nodes.LOOPBACK_POD_CIDR loopback IPs) that export their engine's real
metric format and answer completions with their pod's name."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc

from m3fleet.autoscaling.signals import one_two_five_buckets
from m3fleet.catalog.gateway import EPP_IMAGE
from tests.support.autoscaling.prom import Reading, sglang_exposition, vllm_exposition
from tests.support.cluster.cluster import REPO, Cluster, eventually
from tests.support.cluster.controlplane import ControlPlaneError, Process, built_by, load_yaml
from tests.support.cluster.image import SERVICE_ACCOUNT_DIR, Image, ImageError
from tests.support.cluster.pki import Authority
from tests.support.ports import free_port

BUILD_SCRIPT = REPO / ".ci" / "epp.sh"
IMAGE_SCRIPT = REPO / "hack" / "build-epp-image.sh"
HELD_METRIC = "inference_extension_flow_control_queue_size"  # requests flow control holds (scale-from-zero signal)
IDLE = Reading.idle(capacity_tokens=1_000_000.0, prompt_bounds=one_two_five_buckets(1_048_576))
LOADED = dataclasses.replace(IDLE, running=64.0, waiting=40.0, kv_usage=0.97)  # past the saturation thresholds


@dataclass(frozen=True)
class Build:
    """What .ci/epp.sh built and the cluster tier uses: the ext-proc descriptors and the CRDs of the pinned modules (its
    bin/epp is what the Go tests passed on; the image, hack/build-epp-image.sh, is built from the same sources)."""

    directory: Path

    @property
    def descriptors(self) -> Path:
        return self.directory / "extproc.binpb"

    @property
    def crds(self) -> list[Path]:
        return sorted((self.directory / "crds").glob("*.yaml"))


def build() -> Build:
    return Build(built_by(BUILD_SCRIPT, ControlPlaneError))


def build_image() -> Path:
    """The pinned EPP image (hack/build-epp-image.sh, cached by its inputs); returns its OCI archive."""
    return built_by(IMAGE_SCRIPT, ImageError)


def install_crds(cluster: Cluster, epp: Build) -> None:
    """The GIE CRDs (InferencePool and the x-k8s.io ones the EPP also watches) from the module the EPP pins, and the
    Gateway API's (Gateway, HTTPRoute)."""
    cluster.apply(epp.directory / "crds")  # one kubectl for all: each call costs a second on a busy machine
    for crd in epp.crds:
        cluster.control_plane.wait_established(load_yaml(crd.read_text())["metadata"]["name"])


@dataclass
class EndpointPicker:
    process: Process
    grpc_address: str
    metrics_port: int
    ca: Path  # the CA of its serving certificate (--cert-path), which the gateway client trusts

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def sample(self, metric: str) -> float:
        """The sum of a metric's series on the EPP's /metrics (0 when it has none)."""
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(metric) and line[len(metric) : len(metric) + 1] in ("{", " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log(self) -> str:
        return self.process.log.read_text(errors="replace") if self.process.log.exists() else ""


def health_serving(address: str) -> bool:
    """grpc.health.v1.Health/Check for the EPP's service, hand-encoded (one string field; SERVING is enum 1)."""
    service = b"inference-extension"
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            answer = check(b"\n" + bytes([len(service)]) + service, timeout=2)
        except grpc.RpcError:
            return False
    return bytes(answer) == b"\x08\x01"


PORT_FLAGS = ("--grpc-port", "--grpc-health-port", "--metrics-port")
CERT_DIR = "/etc/epp-tls"  # where the test mounts the serving certificate it adds


def with_values(args: list[str], values: dict[str, str]) -> list[str]:
    """`args` (`--flag value` pairs, as rendered) with each flag of `values` given its new value; each must be there."""
    missing = [flag for flag in values if flag not in args]
    assert not missing, f"the rendered EPP args lack {missing}: {args}"
    return [values[args[i - 1]] if i and args[i - 1] in values else arg for i, arg in enumerate(args)]


@contextlib.contextmanager
def rendered_endpoint_picker(
    cluster: Cluster, image: Image, namespace: str, fleet: str, metrics_port: int | None = None
) -> Iterator[EndpointPicker]:
    """Run the pinned EPP image as a kubelet would run the operator's Deployment `<fleet>-epp` (tests/support/cluster/
    image.py: the image's entrypoint and user, its root filesystem read-only): the container's args (ports moved to
    free loopback ones, `metrics_port` if given), its env, the rendered ConfigMap at its mount path, and at the
    ServiceAccount path a TokenRequest token of the rendered ServiceAccount (so the apiserver enforces the rendered
    Role), serving TLS with a certificate the test's CA signed (--cert-path, the one flag added: see
    tests/cluster/test_gateway_epp.py)."""
    deployment = cluster.get("deployment", f"{fleet}-epp", namespace)
    assert deployment is not None, f"the operator rendered no endpoint picker Deployment {fleet}-epp"
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == EPP_IMAGE, f"{fleet}-epp runs {container['image']}, not the pinned {EPP_IMAGE}"
    args: list[str] = container["args"]
    config_file = args[args.index("--config-file") + 1]
    mount = next(m for m in container["volumeMounts"] if config_file.startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = cluster.get("configmap", volume["configMap"]["name"], namespace)
    assert config_map is not None, f"the rendered EPP mounts ConfigMap {volume['configMap']['name']}, which is missing"

    workdir = cluster.workdir / f"epp-{namespace}-{fleet}-{int(time.time() * 1000)}"
    authority = Authority(workdir / "pki")
    pair = authority.serving("epp")
    certs = workdir / "certs"
    certs.mkdir()
    (certs / "tls.crt").write_bytes(pair.cert.read_bytes())
    (certs / "tls.key").write_bytes(pair.key.read_bytes())
    config = workdir / "config"
    config.mkdir()
    for key, text in config_map["data"].items():
        (config / key).write_text(text)
    ports = {flag: str(free_port()) for flag in PORT_FLAGS} | (
        {"--metrics-port": str(metrics_port)} if metrics_port else {}
    )
    token, _, _ = cluster.service_account_token(namespace, pod["serviceAccountName"])
    service_account = workdir / "serviceaccount"
    service_account.mkdir()
    (service_account / "token").write_text(token)
    (service_account / "ca.crt").write_bytes(cluster.control_plane.ca.cert.read_bytes())
    (service_account / "namespace").write_text(namespace)
    fields = {"metadata.namespace": namespace, "metadata.name": f"{fleet}-epp-0-local"}
    env = {
        e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for e in container.get("env") or []
    }
    api = urllib.parse.urlsplit(cluster.control_plane.server)  # in-cluster config: the apiserver is on loopback
    env |= {"KUBERNETES_SERVICE_HOST": str(api.hostname), "KUBERNETES_SERVICE_PORT": str(api.port)}
    mounts = {mount["mountPath"]: config, SERVICE_ACCOUNT_DIR: service_account, CERT_DIR: certs}
    command = image.command([*with_values(args, ports), f"--cert-path={CERT_DIR}"], mounts, env)
    process = Process("epp", command, workdir / "epp.log")
    process.start()
    picker = EndpointPicker(process, f"127.0.0.1:{ports['--grpc-port']}", int(ports["--metrics-port"]), authority.cert)
    try:
        eventually(
            f"{fleet}'s EPP serving (gRPC health SERVING: its InferencePool synced)",
            lambda: process.check_alive() or health_serving(f"127.0.0.1:{ports['--grpc-health-port']}"),
            60,
        )
        yield picker
    finally:
        process.stop()


class EngineStandIn:
    """One serving pod's engine on the pod's own IP and port: /metrics in its engine's format (idle until the
    test sets a reading), and
    completions answered with the pod's name (what the test checks the EPP picked)."""

    def __init__(self, pod: str, ip: str, port: int, engine: str) -> None:
        self.pod, self.engine = pod, engine
        self.exposition = self.render(IDLE)
        self.served: list[dict[str, Any]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    return self._answer(404, "text/plain", b"not found\n")
                self._answer(200, "text/plain; version=0.0.4", stand_in.exposition)

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                stand_in.served.append(request)
                answer = {
                    "id": f"chatcmpl-{stand_in.pod}",
                    "object": "chat.completion",
                    "model": request.get("model"),
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": stand_in.pod}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
                }
                self._answer(200, "application/json", json.dumps(answer).encode())

            def _answer(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer((ip, port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def render(self, reading: Reading) -> bytes:
        """/metrics as its engine writes it; rendered once per reading (the EPP scrapes each pod many times a
        second)."""
        text = vllm_exposition(reading) if self.engine == "vllm" else sglang_exposition(reading, tp=8)
        return text.encode()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class EngineStandIns:
    """Follows the Running pods matching `selector` in `namespace` and keeps an EngineStandIn on each one's IP at
    `port` (the engine's, which the InferencePool targets); `engine` names the metric format."""

    def __init__(self, cluster: Cluster, namespace: str, selector: str, port: int, engine: str) -> None:
        self.cluster, self.namespace, self.selector, self.port, self.engine = cluster, namespace, selector, port, engine
        self.by_pod: dict[str, EngineStandIn] = {}
        self.ips: dict[str, str] = {}  # pod -> its IP
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                pods = self.cluster.list("pods", self.namespace, self.selector)
            except Exception:  # the apiserver busy for a moment: try again
                self._stop.wait(0.5)
                continue
            running = {
                p["metadata"]["name"]: p["status"]["podIP"]
                for p in pods
                if (p.get("status") or {}).get("phase") == "Running"
                and p["status"].get("podIP")
                and not p["metadata"].get("deletionTimestamp")
            }
            with self._lock:
                for pod in [p for p in self.by_pod if p not in running]:
                    self.by_pod.pop(pod).stop()  # before a new pod gets its address: kwok hands addresses out again
                    del self.ips[pod]
                for pod, ip in running.items():
                    if pod not in self.by_pod:
                        self.by_pod[pod] = EngineStandIn(pod, ip, self.port, self.engine)
                        self.ips[pod] = ip
            self._stop.wait(0.3)

    def pods(self) -> list[str]:
        with self._lock:
            return sorted(self.by_pod)

    def endpoint(self, pod: str) -> str:
        return f"{self.ips[pod]}:{self.port}"

    def pod_at(self, endpoint: str) -> str | None:
        return next((pod for pod, ip in self.ips.items() if f"{ip}:{self.port}" == endpoint), None)

    def set_reading(self, pod: str, reading: Reading) -> None:
        with self._lock:
            self.by_pod[pod].exposition = self.by_pod[pod].render(reading)

    def served(self) -> Counter[str]:
        with self._lock:
            return Counter({pod: len(s.served) for pod, s in self.by_pod.items()})

    def __enter__(self) -> EngineStandIns:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for stand_in in self.by_pod.values():
            stand_in.stop()

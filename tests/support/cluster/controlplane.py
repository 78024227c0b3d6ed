"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok (fake GPU nodes that run pods "for real" as far as the API can tell) and the
LeaderWorkerSet controller with its webhooks. Built from Go modules by `.ci/control-plane.sh`.

Every process is started here and stopped by its own PID. Nothing listens or dials off loopback: node
InternalIPs are 127.0.0.x, webhooks are called at https://127.0.0.1:<port>. The apiserver writes an
audit log (metadata level) so tests can count every request a user (e.g. the operator's
ServiceAccount) made and the status each got.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster.nodes import NODES, node_object
from tests.support.cluster.pki import Authority, Pair, signing_key
from tests.support.ports import free_port

# libyaml's loader where PyYAML was built with it (its Linux wheels are): the LeaderWorkerSet controller's CRDs alone
# are 2.8 MB, 2.8 s of pure-Python parsing on each control plane's start against 0.3 s. The same documents either way.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """One YAML document, as yaml.safe_load reads it."""
    return yaml.load(text, Loader=_LOADER)


REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / ".ci" / "control-plane.sh"
SERVICE_CIDR = "10.0.0.0/16"  # room for a Service per resource of the 300-resource benchmark
# kwok hands these out to pods on nodes without a pod CIDR of their own; nothing dials them. Not loopback: the
# apiserver refuses loopback addresses in EndpointSlices, so Services (LeaderWorkerSet's headless one, Dynamo's
# discovery) would list no pod. Pods that must be dialled (the endpoint picker's) run on nodes.LOOPBACK_POD_CIDR's.
POD_CIDR = "10.244.0.0/16"
LWS_NAMESPACE = "lws-system"
POD_FAILURE_STAGES = Path(__file__).parent / "kwok" / "pod-failures.yaml"
ENGINE_IMAGE_KEY = ".spec.containers[0].image"  # how the pod failure stages choose their pods
# A pod annotated with this (seconds, via spec.podTemplate.annotations) becomes ready that long after it was created,
# as an engine loading its weights would; a pod without it is ready at once, as before.
COLD_START_ANNOTATION = "kwok.m3fleet.test/cold-start-seconds"
# kwok's pod-ready stage waits until the time this jq expression gives (creation + the annotation): an absolute time,
# so a patch meanwhile (the operator's pod-deletion-cost) does not restart the wait, as a relative delay would; no
# annotation gives nothing, and kwok's default delay, none.
COLD_START_DELAY = {
    "durationFrom": {
        "jq": {
            "expression": f'(.metadata.annotations["{COLD_START_ANNOTATION}"] // empty | tonumber) as $seconds'
            " | .metadata.creationTimestamp | fromdateiso8601 + $seconds | todateiso8601"
        }
    }
}
STARTUP_SECONDS = 120.0  # the apiserver alone takes 20-60 s on 2 busy cores


class ControlPlaneError(RuntimeError):
    """The tier cannot run here: fail loudly (the tier is never skipped)."""


def build() -> Path:
    """Build (or reuse) the binaries; returns the bin directory. Progress goes to stderr."""
    return built_by(BUILD_SCRIPT, ControlPlaneError)


def built_by(script: Path, error: type[Exception]) -> Path:
    """Run a cached build script whose stdout's last line is what it built; fail loudly with `error`."""
    result = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise error(f"{script} failed with exit status {result.returncode} (its log is above)")
    return Path(result.stdout.strip().splitlines()[-1])


def with_pod_failures(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """kwok's stages plus ours that make engine pods fail by image (kwok/pod-failures.yaml); kwok's own
    pod-ready stage is told to leave those images alone, or it would race ours to the same pods, and to wait for a
    pod's cold start (COLD_START_ANNOTATION)."""
    failures = [d for d in yaml.safe_load_all(POD_FAILURE_STAGES.read_text()) if d]
    images = [
        value
        for stage in failures
        for expression in stage["spec"]["selector"]["matchExpressions"]
        if expression["key"] == ENGINE_IMAGE_KEY
        for value in expression["values"]
    ]
    for stage in stages:
        if stage["metadata"]["name"] == "pod-ready":
            expressions = stage["spec"]["selector"]["matchExpressions"]
            expressions.append({"key": ENGINE_IMAGE_KEY, "operator": "NotIn", "values": images})
            stage["spec"]["delay"] = COLD_START_DELAY
    return [*stages, *failures]


def wait_for(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(interval)
    raise ControlPlaneError(
        f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last})" if last else "")
    )


def wait_listening(what: str, process: Process, port: int, timeout: float = 90) -> None:
    """Until `process` accepts connections on 127.0.0.1:`port` (failing at once if it exits)."""

    def listening() -> bool:
        process.check_alive()
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    wait_for(what, listening, timeout, 0.5)


@dataclass
class Process:
    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> Process:
        handle = self.log.open("ab")
        self.popen = subprocess.Popen(
            self.args,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        handle.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise ControlPlaneError(f"{self.name} exited ({self.popen and self.popen.returncode}); log tail:\n{tail}")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to this PID (and its process group), then SIGKILL after `grace` seconds."""
        if self.popen is None or self.popen.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, sig)
            try:
                self.popen.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    *,
    user: str,
    cert: Pair | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> Path:
    credentials: dict[str, str] = {}
    if cert is not None:
        credentials = {"client-certificate": str(cert.cert), "client-key": str(cert.key)}
    if token is not None:
        credentials = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "m3fleet-test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "m3fleet-test", "user": user, "namespace": namespace}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Api:
    """A minimal JSON client for the tests' own requests (the admin, or any bearer token)."""

    port: int
    ca: Path
    cert: Pair | None = None
    token: str | None = None

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.cert is not None:
            context.load_cert_chain(str(self.cert.cert), str(self.cert.key))
        return context

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", timeout: float = 30
    ) -> tuple[int, Any]:
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=self._context(), timeout=timeout)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        payload = None if body is None else (body if isinstance(body, str | bytes) else json.dumps(body))
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        try:
            return response.status, json.loads(data) if data else {}
        except ValueError:
            return response.status, data.decode(errors="replace")

    def get(self, path: str) -> Any:
        status, data = self.request("GET", path)
        if status == 404:
            return None
        if status >= 400:
            raise ControlPlaneError(f"GET {path}: {status} {data}")
        return data

    def create(self, path: str, body: Any) -> Any:
        status, data = self.request("POST", path, body)
        if status >= 400 and status != 409:
            raise ControlPlaneError(f"POST {path}: {status} {data}")
        return data

    def apply(self, path: str, body: Any, manager: str = "m3fleet-tests") -> Any:
        status, data = self.request(
            "PATCH", f"{path}?fieldManager={manager}&force=true", body, "application/apply-patch+yaml"
        )
        if status >= 400:
            raise ControlPlaneError(f"apply {path}: {status} {data}")
        return data


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


@dataclass
class ControlPlane:
    bin_dir: Path
    workdir: Path
    processes: dict[str, Process] = field(default_factory=dict)
    etcd_port: int = 0
    port: int = 0
    lws_webhook_port: int = 0

    @property
    def data_dir(self) -> Path:
        return self.bin_dir.parent / "data"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        self.workdir.mkdir(parents=True, exist_ok=True)
        pki = self.workdir / "pki"
        self.ca = Authority(pki)
        self.apiserver_cert = self.ca.serving(
            "apiserver", "kubernetes", "kubernetes.default", "kubernetes.default.svc", ips=("127.0.0.1", "10.0.0.1")
        )
        self.admin_cert = self.ca.issue("admin", "m3fleet-test-admin", organization="system:masters")
        self.sa_key = signing_key(pki)
        self.admin_kubeconfig = kubeconfig(
            self.workdir / "admin.kubeconfig", "", self.ca.cert, user="admin", cert=self.admin_cert
        )
        self.etcd_port, self.port, self.lws_webhook_port = free_port(), free_port(), free_port()
        self._start_etcd()
        self._start_apiserver()
        kubeconfig(self.admin_kubeconfig, self.server, self.ca.cert, user="admin", cert=self.admin_cert)
        self.admin = Api(self.port, self.ca.cert, cert=self.admin_cert)
        self._start_controllers()
        self._register_nodes()
        self._start_lws()
        return self

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            self.processes[name].stop()

    def _process(self, name: str, args: list[str]) -> Process:
        process = Process(name, args, self.workdir / f"{name}.log").start()
        self.processes[name] = process
        return process

    def _start_etcd(self) -> None:
        peer = free_port()
        etcd = self._process(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=m3fleet-test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=m3fleet-test=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            etcd.check_alive()
            connection = http.client.HTTPConnection("127.0.0.1", self.etcd_port, timeout=2)
            connection.request("GET", "/health")
            return b'"true"' in connection.getresponse().read()

        wait_for("etcd /health", healthy, 60)

    def apiserver_args(self) -> list[str]:
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        return [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",  # 1.36 refuses a loopback advertise address otherwise
            f"--tls-cert-file={self.apiserver_cert.cert}",
            f"--tls-private-key-file={self.apiserver_cert.key}",
            f"--client-ca-file={self.ca.cert}",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={self.sa_key.cert}",
            f"--service-account-signing-key-file={self.sa_key.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            # The defaults (PodSecurity among them) plus what OpenShift runs: a child with blockOwnerDeletion
            # needs `update` on its owner's finalizers subresource.
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--audit-log-maxsize=0",
            "--profiling=false",
            # Logs, exec and port-forward go to the kubelet at the node's InternalIP (127.0.0.x), never through
            # a DNS lookup of the node's name, which would leave loopback.
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def _start_apiserver(self) -> None:
        apiserver = self._process("kube-apiserver", self.apiserver_args())
        api = Api(self.port, self.ca.cert, cert=self.admin_cert)

        def ready() -> bool:
            apiserver.check_alive()
            return api.request("GET", "/readyz", timeout=5)[0] == 200

        wait_for("kube-apiserver /readyz", ready, STARTUP_SECONDS, 0.5)

    def restart_apiserver(self) -> str:
        """Kill -9 the apiserver (etcd keeps its data) and start it again on the same port. Returns when it
        was ready again (UTC, the audit log's format): until then it refuses requests as it boots (503, 429,
        and 403 before its RBAC caches fill, which under load may outlast /readyz by a moment), which says nothing
        about the RBAC a client was granted."""
        process = self.processes["kube-apiserver"]
        assert process.popen is not None
        os.kill(process.pid, signal.SIGKILL)
        process.popen.wait(10)
        self._start_apiserver()
        return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def _start_controllers(self) -> None:
        kubeconfig_flag = f"--kubeconfig={self.admin_kubeconfig}"
        self._process(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                kubeconfig_flag,
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--service-account-private-key-file={self.sa_key.key}",
                f"--root-ca-file={self.ca.cert}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--concurrent-gc-syncs=5",
                # kwok renews node leases from one process on 2 busy cores: do not call a node lost (and
                # its pods not ready) over a late renewal
                "--node-monitor-grace-period=5m",
            ],
        )
        self._process(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                kubeconfig_flag,
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
            ],
        )
        stages = self.workdir / "kwok-stages.yaml"
        stage_files = [
            *sorted((self.data_dir / "kwok-stage/node/fast").glob("*.yaml")),
            *sorted((self.data_dir / "kwok-stage/node/heartbeat-with-lease").glob("*.yaml")),
            *sorted((self.data_dir / "kwok-stage/pod/fast").glob("*.yaml")),
        ]
        docs = [
            d
            for f in stage_files
            if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text())
            if d and d.get("kind") == "Stage"
        ]
        if not docs:
            raise ControlPlaneError(f"no kwok Stage objects under {self.data_dir / 'kwok-stage'}")
        stages.write_text(yaml.safe_dump_all(with_pod_failures(docs)))
        self._process(
            "kwok",
            [
                str(self.bin_dir / "kwok"),
                kubeconfig_flag,
                f"--config={stages}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=127.0.0.1",
                f"--server-address=127.0.0.1:{free_port()}",
                # Node health through Leases in kube-node-lease, renewed by kwok; without them the
                # heartbeat-with-lease stage posts node status only every 10-20 min, and the node lifecycle
                # controller marks every node lost (and every running pod NotReady) 5 min in.
                "--node-lease-duration-seconds=40",
            ],
        )

        def default_service_account() -> bool:
            self.processes["kube-controller-manager"].check_alive()
            return self.admin.get("/api/v1/namespaces/default/serviceaccounts/default") is not None

        wait_for("the default ServiceAccount (kube-controller-manager running)", default_service_account, 90, 0.5)

    def _register_nodes(self) -> None:
        for index, spec in enumerate(NODES):
            self.admin.create("/api/v1/nodes", node_object(spec, f"127.0.0.{10 + index}"))

        def all_ready() -> bool:
            self.processes["kwok"].check_alive()
            nodes = self.admin.get("/api/v1/nodes")["items"]
            ready = [
                n
                for n in nodes
                if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
            ]
            return len(ready) >= len(NODES)

        wait_for(f"{len(NODES)} kwok nodes Ready", all_ready, 60, 0.5)

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        def established() -> bool:
            body = self.admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}") or {}
            conditions = (body.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(f"CRD {crd} Established", established, timeout)

    def install_crds(self, files: Iterable[Path]) -> None:
        for crd in sorted(files):
            body = load_yaml(crd.read_text())
            self.admin.apply(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{body['metadata']['name']}", body
            )
            self.wait_established(body["metadata"]["name"])

    def write_serving_pair(self, directory: Path, name: str, *dns: str) -> None:
        """tls.crt and tls.key of a loopback serving certificate of this control plane's CA (webhook servers)."""
        directory.mkdir(parents=True, exist_ok=True)
        serving = self.ca.serving(name, *dns)
        (directory / "tls.crt").write_bytes(serving.cert.read_bytes())
        (directory / "tls.key").write_bytes(serving.key.read_bytes())

    # -- LeaderWorkerSet -------------------------------------------------------------------------------

    def _start_lws(self) -> None:
        config_dir = self.data_dir / "lws-config"
        self.install_crds((config_dir / "crd/bases").glob("*.yaml"))
        certs = self.workdir / "lws-certs"
        self.write_serving_pair(certs, "lws-webhook", "lws-webhook-service.lws-system.svc")
        health = free_port()
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": self.lws_webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        }
        config_path = self.workdir / "lws-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        lws = Process(
            "lws-controller",
            [str(self.bin_dir / "lws-controller"), f"--config={config_path}", "--zap-log-level=info"],
            self.workdir / "lws-controller.log",
        ).start(env={"KUBECONFIG": str(self.admin_kubeconfig), "POD_NAMESPACE": LWS_NAMESPACE})
        self.processes["lws-controller"] = lws

        wait_listening("the LeaderWorkerSet webhook server", lws, self.lws_webhook_port)
        for hook in self._lws_webhooks(config_dir / "webhook"):
            kind = (
                "mutatingwebhookconfigurations"
                if hook["kind"].startswith("Mutating")
                else "validatingwebhookconfigurations"
            )
            self.admin.apply(f"/apis/admissionregistration.k8s.io/v1/{kind}/{hook['metadata']['name']}", hook)

    def _lws_webhooks(self, directory: Path) -> list[dict[str, Any]]:
        """LWS's webhook manifests with its kustomize patches applied (the objectSelector that limits the pod
        webhooks to LWS pods: without it every pod create fails while LWS is down), served on loopback."""
        import base64

        documents = [d for d in yaml.safe_load_all((directory / "manifests.yaml").read_text()) if d]
        patches = {"Mutating": "mutating-patch.yaml", "Validating": "validating-patch.yaml"}
        bundle = base64.b64encode(self.ca.pem).decode()
        for document in documents:
            for prefix, patch_file in patches.items():
                if document["kind"].startswith(prefix) and (directory / patch_file).exists():
                    for op in yaml.safe_load((directory / patch_file).read_text()):
                        index = int(op["path"].rsplit("/", 1)[1])
                        document["webhooks"][index] = op["value"]
            document["metadata"]["name"] = f"lws-{document['metadata']['name']}"
            for hook in document["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.lws_webhook_port}{path}", "caBundle": bundle}
        return documents

    # -- audit -----------------------------------------------------------------------------------------

    def audit_events(self, since_offset: int = 0) -> Iterator[dict[str, Any]]:
        with self.audit_log.open("rb") as handle:
            handle.seek(since_offset)
            for line in handle:
                with contextlib.suppress(ValueError):
                    yield json.loads(line)

    def audit_offset(self) -> int:
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def dump_logs(self, stream: Any = sys.stderr, tail: int = 4000) -> None:
        """The tail of every process log of this cluster (control plane, operators started by tests), the last
        written last: the failing test's own operators end the dump, where a CI log's tail shows it."""
        for log in sorted(self.workdir.glob("*.log"), key=lambda path: path.stat().st_mtime):
            if log == self.audit_log:
                continue
            text = log.read_text(errors="replace")
            stream.write(f"\n===== {log.name} =====\n{text[-tail:]}\n")

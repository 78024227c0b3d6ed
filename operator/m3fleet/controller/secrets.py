"""The one Secret m3fleet generates: the SSH key TensorRT-LLM's mpirun uses between a replica's pods.

Generated once per resource (never re-generated while it exists), never logged, never rendered:
`m3fleet render` only names it. The operator needs `create` on Secrets for this, and `get`/`delete` by name
to find and prune it (a Secret of that name it does not control is reported, never mounted or deleted).
"""

from __future__ import annotations

import base64
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def ssh_key_secret(namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    public += b" m3fleet\n"

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {**labels, "m3fleet.dev/generated": "mpi-ssh"}},
        "type": "Opaque",
        "data": {"id_ed25519": b64(private), "id_ed25519.pub": b64(public), "authorized_keys": b64(public)},
    }

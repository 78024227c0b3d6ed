"""Helpers for driving MiniMaxM3Deployments on the real tier the way a user does (kubectl), and for
reading back what the real controllers made of them."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from m3fleet.cli import main
from tests.support.cluster.cluster import SAMPLES, Cluster, OperatorProcess, eventually
from tests.support.cluster.nodes import NODES

# The samples' claims: their weights, and the Hub cache of the one that reads the checkpoint from Hugging Face.
WEIGHT_CLAIMS = ("m3-weights", "m3-weights-mxfp8", "m3-weights-mxfp4", "m3-weights-nvfp4", "hf-cache")
POOL_OF_ACCELERATOR = {a: a for a in ("h200", "h100", "gb200", "gb300", "b200", "mi300x", "mi355x")}
NODE_POOL = {spec.name: spec.pool for spec in NODES}


def sample(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((SAMPLES / f"{name}.yaml").read_text())
    return document


def samples() -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, yaml.safe_load(p.read_text())) for p in sorted(SAMPLES.glob("*.yaml"))]


def renamed(document: dict[str, Any], name: str, namespace: str) -> dict[str, Any]:
    copied = copy.deepcopy(document)
    copied["metadata"] = {**copied.get("metadata", {}), "name": name, "namespace": namespace}
    return copied


def two_node_group(name: str, namespace: str) -> dict[str, Any]:
    """vLLM at 1M context on the MXFP8 checkpoint, three full-length sequences: two H200 nodes a replica (a
    LeaderWorkerSet group of a leader and one worker, 8 GPUs each)."""
    document = renamed(sample("vllm-h200-tp8"), name, namespace)
    document["spec"]["model"] = {"variant": "mxfp8", "source": {"pvc": {"claimName": "m3-weights-mxfp8"}}}
    document["spec"]["context"] = {"maxModelLen": 1_048_576, "minSequencesAtMaxLen": 3}
    document["spec"]["parallelism"] = {"tensorParallelSize": 0}
    return document


HUB_REVISION = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(namespace: str, path: str, pool_label: str, **spec: Any) -> dict[str, Any]:
    """A MiniMaxM3ModelCache `m3` of the Hub's MiniMax-M3 at a pinned revision, on the H200 nodes labelled
    `pool_label=a`, staged under `path` (`spec` adds or overrides fields)."""
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3ModelCache",
        "metadata": {"name": "m3", "namespace": namespace},
        "spec": {
            "source": {"huggingFace": {"repo": "MiniMaxAI/MiniMax-M3", "revision": HUB_REVISION}},
            "nodes": {"accelerator": "h200", "nodeSelector": {pool_label: "a"}},
            "path": path,
            **spec,
        },
    }


def advisory_fleet(name: str, namespace: str, prometheus: dict[str, Any], **autoscaling: Any) -> dict[str, Any]:
    """The vLLM H200 sample with advisory autoscaling (1-2 replicas, a 5 s tick) reading `prometheus`."""
    document = renamed(sample("vllm-h200-tp8"), name, namespace)
    document["spec"]["autoscaling"] = {
        "enabled": True,
        "mode": "advisory",
        "minReplicas": 1,
        "maxReplicas": 2,
        "intervalSeconds": 5,
        "prometheus": prometheus,
        **autoscaling,
    }
    return document


def weight_volumes(cluster: Cluster, namespace: str) -> None:
    """PVCs holding weights, bound to PVs (what a storage admin provides); the tests check they survive."""
    for claim in WEIGHT_CLAIMS:
        volume = f"{namespace}-{claim}"
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": "2Ti"},
                    "accessModes": ["ReadOnlyMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "hostPath": {"path": f"/var/lib/weights/{claim}"},
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            }
        )
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": {"storage": "1Ti"}},
                },
            }
        )
    eventually(
        f"weight PVCs bound in {namespace}",
        lambda: (
            all(p["status"].get("phase") == "Bound" for p in cluster.list("pvc", namespace))
            and len(cluster.list("pvc", namespace)) >= len(WEIGHT_CLAIMS)
        ),
        60,
    )


def condition(body: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for item in ((body or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            return dict(item)
    return {}


def wait_ready(cluster: Cluster, name: str, namespace: str, timeout: int = 180) -> dict[str, Any]:
    """`kubectl wait --for=condition=Ready m3d/NAME`, as a user (or a CI pipeline) waits."""
    result = cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        f"m3d/{name}",
        "-n",
        namespace,
        f"--timeout={timeout}s",
        check=False,
        timeout=timeout + 30,
    )
    body = cluster.get("m3d", name, namespace)
    if result.returncode != 0:
        pods = cluster.list("pods", namespace, f"m3fleet.dev/name={name}")
        status = json.dumps((body or {}).get("status"), indent=1)[:3000]
        placed = [(p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("nodeName")) for p in pods]
        raise AssertionError(f"m3d/{name} not Ready: {result.stderr}\nstatus: {status}\npods: {placed}")
    assert body is not None
    return body


def pods(cluster: Cluster, name: str, namespace: str) -> list[dict[str, Any]]:
    return [
        p
        for p in cluster.list("pods", namespace, f"m3fleet.dev/name={name}")
        if not p["metadata"].get("deletionTimestamp")
    ]


def assert_on_pool(cluster: Cluster, name: str, namespace: str, accelerator: str) -> list[dict[str, Any]]:
    found = pods(cluster, name, namespace)
    assert found, f"no pods for {name}"
    for pod in found:
        node = pod["spec"].get("nodeName")
        assert node and NODE_POOL[node] == POOL_OF_ACCELERATOR[accelerator], (pod["metadata"]["name"], node)
    return found


def delete(cluster: Cluster, name: str, namespace: str, wait: bool = True) -> None:
    cluster.kubectl("delete", f"m3d/{name}", "-n", namespace, f"--wait={'true' if wait else 'false'}", check=False)
    if wait:
        eventually(f"pods of {name} gone", lambda: not pods(cluster, name, namespace), 120)


def write_manifest(tmp: Path, document: dict[str, Any]) -> Path:
    path = tmp / f"{document['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@contextlib.contextmanager
def operated_namespace(
    cluster: Cluster, namespace: str, name: str, env: dict[str, str] | None = None
) -> Iterator[OperatorProcess]:
    """A namespace with weight PVCs, and a cluster-scoped operator (its own process, with `env`) running over it."""
    cluster.namespace(namespace)
    weight_volumes(cluster, namespace)
    with cluster.operator("--all-namespaces", "--standalone", name=name, env=env) as running:
        yield running


def render_output(path: Path, *flags: str) -> str:
    """What `m3fleet render -f PATH FLAGS` prints: the console script's `main`, run in this process (the same
    program, without an interpreter start of about a second for an expected value)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["render", "-f", str(path), *flags])
    assert code == 0, f"m3fleet render -f {path} {' '.join(flags)} exited {code}"
    return out.getvalue()


def rendered(document: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    """The objects `m3fleet render` says the operator makes for the document."""
    return [d for d in yaml.safe_load_all(render_output(write_manifest(tmp, document))) if d]

"""Fake nodes (kwok) that look like the real pools: the labels NVIDIA's GPU feature discovery and AMD's
node labeller put on them, their capacity and allocatable, the usual GPU taint, and a loopback InternalIP.

Sources for the label values (what the device plugins publish on live nodes):
- NVIDIA GPU feature discovery: `nvidia.com/gpu.product` is the product name with spaces as dashes
  (`NVIDIA-H200`, `NVIDIA-GB200`), plus `gpu.count`, `gpu.memory` (MiB), `gpu.family`, and on GB200 NVL72
  trays `nvidia.com/gpu.clique` = `<NVLink cluster UUID>.<clique id>` (GPU Operator docs, "GPU Feature
  Discovery" and "Multi-Node NVLink").
- AMD node labeller (ROCm/k8s-device-plugin, docs/advanced/node-labelling.md): `amd.com/gpu.product-name`
  shows `AMD_Instinct_MI355_OAM` on MI355X nodes, plus `gpu.device-id`, `gpu.vram`, `gpu.family`.
A CPU-only `system` node runs everything that is not an engine (the operator's own pod).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

# Two NVLink cliques of two trays each, so a group that ignored its clique could be split across them.
GB200_CLIQUES = ("7b2c4d1e-6f3a-4b8c-9d0e-1a2b3c4d5e6f.32766", "7b2c4d1e-6f3a-4b8c-9d0e-1a2b3c4d5e6f.32767")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    arch: str
    cpu: str
    memory: str
    gpus: int = 0
    gpu_resource: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    extended: dict[str, str] = field(default_factory=dict)  # other device-plugin resources (RDMA NICs)
    pod_cidr: str = ""  # kwok gives this node's pods addresses from it (else its --cidr)

    @property
    def pool(self) -> str:
        return self.name.rsplit("-", 1)[0]


RDMA_RESOURCE = "rdma/ib"  # what an RDMA device plugin advertises (the CRD's own example name)


def _hgx(pool: str, i: int, cpu: str, memory: str, product: str, gpu_memory_mib: str, family: str) -> NodeSpec:
    """An 8-GPU NVIDIA HGX node as GPU feature discovery labels it."""
    return NodeSpec(
        f"{pool}-{i}",
        "amd64",
        cpu=cpu,
        memory=memory,
        gpus=8,
        gpu_resource="nvidia.com/gpu",
        labels={
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": gpu_memory_mib,
            "nvidia.com/gpu.family": family,
        },
    )


def _h200(i: int) -> NodeSpec:
    node = _hgx("h200", i, "192", "2063731952Ki", "NVIDIA-H200", "143771", "hopper")
    # one InfiniBand NIC per GPU, as p5en nodes have
    labels = {**node.labels, "node.kubernetes.io/instance-type": "p5en.48xlarge"}
    return replace(node, labels=labels, extended={RDMA_RESOURCE: "8"})


def _b200(i: int) -> NodeSpec:
    return _hgx("b200", i, "224", "2113264832Ki", "NVIDIA-B200", "183359", "blackwell")


def _h100(i: int) -> NodeSpec:
    return _hgx("h100", i, "192", "2063731952Ki", "NVIDIA-H100-80GB-HBM3", "81559", "hopper")


def _grace_tray(pool: str, i: int, product: str, gpu_memory_mib: str, clique: str) -> NodeSpec:
    """A 4-GPU Grace Blackwell NVL72 compute tray as GPU feature discovery labels it, with its NVLink clique."""
    return NodeSpec(
        f"{pool}-{i}",
        "arm64",
        cpu="144",
        memory="898388200Ki",
        gpus=4,
        gpu_resource="nvidia.com/gpu",
        labels={
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": "4",
            "nvidia.com/gpu.memory": gpu_memory_mib,
            "nvidia.com/gpu.family": "blackwell",
            "nvidia.com/gpu.clique": clique,
        },
    )


def _gb200(i: int) -> NodeSpec:
    return _grace_tray("gb200", i, "NVIDIA-GB200", "189471", GB200_CLIQUES[i // 2])


def _gb300(i: int) -> NodeSpec:
    return _grace_tray("gb300", i, "NVIDIA-GB300", "279000", "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f.32766")


def _instinct(pool: str, i: int, product: str, device_id: str, vram: str) -> NodeSpec:
    """An 8-GPU AMD Instinct node as AMD's node labeller labels it."""
    return NodeSpec(
        f"{pool}-{i}",
        "amd64",
        cpu="256",
        memory="3170184360Ki",
        gpus=8,
        gpu_resource="amd.com/gpu",
        labels={
            "amd.com/gpu.product-name": product,
            "amd.com/gpu.device-id": device_id,
            "amd.com/gpu.vram": vram,
            "amd.com/gpu.family": "AI",
        },
    )


def _mi355x(i: int) -> NodeSpec:
    return _instinct("mi355x", i, "AMD_Instinct_MI355_OAM", "75a3", "288G")


def _mi300x(i: int) -> NodeSpec:
    return _instinct("mi300x", i, "AMD_Instinct_MI300X_OAM", "74a1", "192G")


# H200 nodes whose pods get loopback addresses (every 127.x address is local on Linux), so a test can run an engine
# stand-in on a pod's own address, where a component that dials pods by IP (the endpoint picker) finds it. Their
# product label differs, so only a fleet that selects it (spec.nodePool.nodeSelector) lands here: the apiserver
# refuses loopback addresses in EndpointSlices, which every other fleet's Services need.
LOOPBACK_POD_CIDR = "127.244.0.0/16"
LOOPBACK_NODE_SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-H200-loopback-pods"}


def _h200_loopback(i: int) -> NodeSpec:
    node = _h200(i)
    return replace(
        node, name=f"h200-lo{i}", labels={**node.labels, **LOOPBACK_NODE_SELECTOR}, pod_cidr=LOOPBACK_POD_CIDR
    )


NODES: tuple[NodeSpec, ...] = (
    NodeSpec("system-0", "amd64", cpu="16", memory="65842360Ki"),
    *(_h200(i) for i in range(7)),  # 7: every single-node H200 sample at once (the gateway sample runs two tiers)
    *(_gb200(i) for i in range(4)),
    *(_b200(i) for i in range(2)),
    *(_mi355x(i) for i in range(4)),
    # One node each for the newer pools' samples (docs/pools.md): every single-node sample is Ready at once.
    _h100(0),
    _gb300(0),
    _mi300x(0),
    *(_h200_loopback(i) for i in range(5)),  # tests/cluster/test_gateway_epp.py's five serving pods
)


def _allocatable(spec: NodeSpec) -> dict[str, str]:
    # The kubelet reserves some CPU and memory for the system; GPUs are all allocatable.
    resources = {"cpu": str(int(spec.cpu) - 1), "memory": spec.memory, "pods": "110", "ephemeral-storage": "3Ti"}
    if spec.gpus:
        resources[spec.gpu_resource] = str(spec.gpus)
    return {**resources, **spec.extended}


def node_object(spec: NodeSpec, ip: str) -> dict[str, Any]:
    capacity = {**_allocatable(spec), "cpu": spec.cpu}
    taints = [{"key": spec.gpu_resource, "value": "present", "effect": "NoSchedule"}] if spec.gpus else []
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/arch": spec.arch,
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": spec.name,
                "type": "kwok",
                **spec.labels,
            },
        },
        "spec": {
            "taints": taints,
            **({"podCIDR": spec.pod_cidr, "podCIDRs": [spec.pod_cidr]} if spec.pod_cidr else {}),
        },
        "status": {
            "capacity": capacity,
            "allocatable": _allocatable(spec),
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": spec.name}],
            "nodeInfo": {"architecture": spec.arch, "operatingSystem": "linux"},
        },
    }

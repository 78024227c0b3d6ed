"""A stand-in for the NVIDIA DRA driver's ComputeDomain support, which cannot run without GB200 hardware.

What the real driver does, and so what this does through the API: it serves the ComputeDomain CRD; for
each ComputeDomain it creates the ResourceClaimTemplate the domain names (its IMEX channel), of the
driver's DeviceClass; and its kubelet plugin publishes a ResourceSlice per node with the channel device.
The real scheduler then allocates the claims (DRA) and the pods of a group land on GB200 nodes. Only the
API objects are faked: what the driver does on the node (IMEX daemons) stays unproven here.
"""

from __future__ import annotations

from typing import Any

from tests.support.cluster.cluster import Cluster, eventually
from tests.support.cluster.nodes import NODES

DRIVER = "compute-domain.nvidia.com"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"

COMPUTE_DOMAIN_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "computedomains.resource.nvidia.com"},
    "spec": {
        "group": "resource.nvidia.com",
        "names": {"kind": "ComputeDomain", "plural": "computedomains", "singular": "computedomain"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
                "subresources": {"status": {}},
            }
        ],
    },
}


def install(cluster: Cluster) -> None:
    cluster.apply(COMPUTE_DOMAIN_CRD)
    cluster.control_plane.wait_established("computedomains.resource.nvidia.com")
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": CHANNEL_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    for node in NODES:
        if "nvidia.com/gpu.clique" not in node.labels:  # the NVL72 trays (gb200, gb300)
            continue
        cluster.apply(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node.name}-{DRIVER}"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node.name,
                    "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": f"channel-{i}"} for i in range(4)],
                },
            }
        )


def serve_compute_domain(cluster: Cluster, name: str, namespace: str) -> None:
    """What the driver's controller does when a ComputeDomain appears: create its channel claim template."""
    domain = eventually(f"ComputeDomain {name}", lambda: cluster.get("computedomain", name, namespace), 60)
    template = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": template, "namespace": namespace},
            "spec": {
                "spec": {"devices": {"requests": [{"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}]}}
            },
        }
    )

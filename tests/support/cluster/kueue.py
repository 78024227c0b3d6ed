"""Kueue's real manager (sigs.k8s.io/kueue, built by `.ci/kueue.sh`) on loopback against the cluster tier's
kube-apiserver: its CRDs and webhook configuration from its own module, its webhooks served at
https://127.0.0.1:<port> with a certificate of the control plane's CA (its internal cert management is off: it would
write a Secret and patch a webhook Service that do not exist here), its visibility API server off (it binds all
interfaces). The webhooks are scoped to the namespaces given: the control plane is shared by the session's other
test files, whose pods must not pass through (or wait on) Kueue.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.controlplane import REPO, ControlPlaneError, Process, built_by, wait_listening
from tests.support.ports import free_port

BUILD_SCRIPT = REPO / ".ci" / "kueue.sh"
KUEUE_NAMESPACE = "kueue-system"
LEADER_WORKER_SET_FRAMEWORK = "leaderworkerset.x-k8s.io/leaderworkerset"
API = "kueue.x-k8s.io/v1beta2"
# Without its internal cert management, Kueue v0.17's manager reads a metrics serving certificate at this fixed path
# (cmd/kueue/main.go; its Deployment mounts a Secret there) and exits when there is none, even with the metrics
# server off (as here). Any valid pair does: written once, left for the next run, never served.
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
WEBHOOK_KINDS = {
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
}


def build() -> Path:
    """The cached build: bin/kueue, crds/, webhook/manifests.yaml."""
    return built_by(BUILD_SCRIPT, ControlPlaneError)


def webhooks(manifests: Path, port: int, ca_pem: bytes, namespaces: list[str]) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, each webhook called at https://127.0.0.1:port<its path> and only for objects
    in `namespaces`; renamed with a `kueue-` prefix (the manifests' own names are kubebuilder's generic ones)."""
    bundle = base64.b64encode(ca_pem).decode()
    documents = [d for d in yaml.safe_load_all(manifests.read_text()) if d]
    for document in documents:
        document["metadata"]["name"] = f"kueue-{document['metadata']['name']}"
        for hook in document["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            hook["namespaceSelector"] = {
                "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]
            }
    return documents


def webhook_path(configuration: dict[str, Any]) -> str:
    resource = WEBHOOK_KINDS[configuration["kind"]]
    return f"/apis/admissionregistration.k8s.io/v1/{resource}/{configuration['metadata']['name']}"


@contextlib.contextmanager
def running_kueue(cluster: Cluster, namespaces: list[str]) -> Iterator[Process]:
    """Kueue's manager with the LeaderWorkerSet integration (and the pod integration it implies), managing only what
    names a queue (`manageJobsWithoutQueueName: false`) in `namespaces`, until the block ends; then its webhook
    configurations are removed before it stops (a pod webhook that fails closed would otherwise refuse every pod)."""
    built = build()
    control_plane = cluster.control_plane
    control_plane.install_crds((built / "crds").glob("*.yaml"))
    cluster.namespace(KUEUE_NAMESPACE)
    certs = cluster.workdir / "kueue" / "certs"
    control_plane.write_serving_pair(certs, "kueue-webhook", "kueue-webhook-service.kueue-system.svc")
    if not (METRICS_CERTS / "tls.crt").exists():
        control_plane.write_serving_pair(METRICS_CERTS, "kueue-metrics")
    port = free_port()
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]
        },
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
        "featureGates": {"VisibilityOnDemand": False},
        "integrations": {"frameworks": [LEADER_WORKER_SET_FRAMEWORK]},
    }
    config_path = certs.parent / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    process = Process(
        "kueue",
        [str(built / "bin" / "kueue"), f"--config={config_path}", "--zap-log-level=2"],
        control_plane.workdir / "kueue.log",
    ).start(env={"KUBECONFIG": str(control_plane.admin_kubeconfig)})
    control_plane.processes["kueue"] = process
    hooks = webhooks(built / "webhook" / "manifests.yaml", port, control_plane.ca.pem, namespaces)
    try:
        wait_listening("Kueue's webhook server", process, port)
        for hook in hooks:
            control_plane.admin.apply(webhook_path(hook), hook)
        yield process
    finally:
        for hook in hooks:
            control_plane.admin.request("DELETE", webhook_path(hook))
        process.stop()
        del control_plane.processes["kueue"]


def quota(flavor: str, cluster_queue: str, local_queue: str, namespace: str, gpus: int) -> list[dict[str, Any]]:
    """A ResourceFlavor, a ClusterQueue with `gpus` nvidia.com/gpu of it (CPU and memory ample: the GPUs decide) and
    a LocalQueue of `namespace` pointing at it: what a platform team sets up for a team's serving."""
    resources = [
        {"name": "cpu", "nominalQuota": "10000"},
        {"name": "memory", "nominalQuota": "100Ti"},
        {"name": "nvidia.com/gpu", "nominalQuota": gpus},
    ]
    return [
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {
            "apiVersion": API,
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": [r["name"] for r in resources],
                        "flavors": [{"name": flavor, "resources": resources}],
                    }
                ],
            },
        },
        {
            "apiVersion": API,
            "kind": "LocalQueue",
            "metadata": {"name": local_queue, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]

"""`spec.podTemplate`: what a platform team adds to the engine pods and their groups (a Kueue queue, a Volcano
scheduler, a priority class, cost labels, mesh annotations, an extra volume), and what of them m3fleet owns.

Shaped after corev1.PodTemplateSpec so each field reads as it does in every workload: `metadata.labels` and
`metadata.annotations`, `priorityClassName`, `schedulerName` and `volumes` as PodSpec names them, `volumeMounts` as a
Container does (the engine container's). Not a whole PodSpec: m3fleet renders containers, resources, placement and
security from the plan (tolerations are `spec.nodePool.tolerations`). None of it reaches the planner or the flags.

Owned names are refused here, in the CRD's CEL, so `kubectl apply`, `m3fleet plan` and the webhook (which evaluate the
same rules, m3fleet.api.contract) give the same one-line answer: the labels the Services, the PodDisruptionBudget,
the NetworkPolicy and the scale subresource select on, the LeaderWorkerSet controller's, the volumes and mount paths
the engine pods already carry (a second `/models` would hide the checkpoint).
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from m3fleet.api import children
from m3fleet.api.base import CamelModel
from m3fleet.api.rules import cel
from m3fleet.api.spec_model import sub_path_field

# The engine container's own paths (m3fleet.engines.base reads them from here; the renderers mount them).
MODEL_MOUNT = "/models"
CACHE_MOUNT = "/model-cache"  # the node-local copy of a MiniMaxM3ModelCache (Preferred; Required uses MODEL_MOUNT)
MODEL_LINK_DIR = "/m3fleet-model"  # Preferred: an emptyDir whose `checkpoint` symlink the init container points
HF_CACHE_MOUNT = "/hf-cache"
CONFIG_MOUNT = "/etc/m3fleet"
SSH_MOUNT = "/etc/m3fleet-ssh"
HOME_MOUNT = "/home/m3fleet"  # HOME of every engine container: a writable emptyDir (caches, compiled kernels)
SHM_MOUNT = "/dev/shm"
OWNED_MOUNT_PATHS = (
    SHM_MOUNT,
    HOME_MOUNT,
    MODEL_MOUNT,
    CACHE_MOUNT,
    MODEL_LINK_DIR,
    HF_CACHE_MOUNT,
    CONFIG_MOUNT,
    SSH_MOUNT,
)
# Volumes of the engine pods (m3fleet.render.pod); tests/unit/test_pod_template.py renders every sample and checks
# each name it finds is here.
OWNED_VOLUMES = ("dshm", "home", "model", "model-cache", "model-link", "hf-cache", "engine-config", "mpi-ssh")

LABEL_PREFIX = "m3fleet.dev/"  # m3fleet's labels and annotations (m3fleet.render.labels)
# A key whose prefix is one of these domains or a subdomain of one: m3fleet's, and the LeaderWorkerSet
# controller's (it sets leaderworkerset.sigs.k8s.io/* labels and annotations on the group's pods itself).
OWNED_DOMAINS = ("m3fleet.dev", "leaderworkerset.sigs.k8s.io")
_OWNED_PREFIX_PATTERN = "^([^/]*[.])?(" + "|".join(d.replace(".", "[.]") for d in OWNED_DOMAINS) + ")/"
# The labels every child carries and the selectors match (m3fleet.render.labels.object_labels).
OWNED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
)
# The scrape annotations the engine pods carry (m3fleet.render.pod): Prometheus must keep finding the metrics port.
OWNED_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")
ANNOTATION_VALUE_MAX = 4096
VOLUMES_MAX = 16

OWNED_KEY_PROBLEM = (
    "is m3fleet's or the LeaderWorkerSet controller's (keys under m3fleet.dev/ or leaderworkerset.sigs.k8s.io/, and "
    "the app.kubernetes.io/ labels the Services, the PodDisruptionBudget and the scale subresource select on)"
)
OWNED_KEY_FIX = "use a key of your own domain, e.g. example.com/team or kueue.x-k8s.io/queue-name"
OWNED_ANNOTATION_PROBLEM = (
    "is m3fleet's or the LeaderWorkerSet controller's (keys under m3fleet.dev/ or leaderworkerset.sigs.k8s.io/, and "
    "the prometheus.io/ scrape annotations that point Prometheus at the engine's metrics)"
)
OWNED_VOLUME_PROBLEM = f"is a volume m3fleet mounts in the engine pods ({', '.join(OWNED_VOLUMES)})"
OWNED_VOLUME_FIX = "give your volume another name, e.g. scratch"
OWNED_MOUNT_PROBLEM = (
    f"would mount over (or under, or above) a path m3fleet mounts in the engine container "
    f"({', '.join(OWNED_MOUNT_PATHS)}): the checkpoint, caches, shared memory, config or HOME"
)
OWNED_MOUNT_FIX = "mount it elsewhere, e.g. /scratch"


def _owned_key(variable: str, exact: tuple[str, ...]) -> str:
    return f"{variable}.matches('{_OWNED_PREFIX_PATTERN}') || {variable} in {list(exact)}"


def _key_rules(field: str, exact: tuple[str, ...], problem: str) -> list[dict[str, Any]]:
    return [cel(f"self.all(k, !({_owned_key('k', exact)}))", f"{field} has a key that {problem}; fix: {OWNED_KEY_FIX}")]


def label_rules() -> dict[str, Any]:
    rules = children.label_map_rules("podTemplate.metadata.labels")
    rules["x-kubernetes-validations"] += _key_rules("podTemplate.metadata.labels", OWNED_LABELS, OWNED_KEY_PROBLEM)
    return rules


def annotation_rules() -> dict[str, Any]:
    field = "podTemplate.metadata.annotations"
    return {
        "maxProperties": children.LABEL_MAP_MAX,
        "additionalProperties": {"type": "string", "maxLength": ANNOTATION_VALUE_MAX},
        "x-kubernetes-validations": [
            cel(
                f"self.all(k, {children.label_key('k')})",
                f"{field} has a key that {children.LABEL_KEY_PROBLEM}; fix: {children.LABEL_KEY_FIX}",
            ),
            *_key_rules(field, OWNED_ANNOTATIONS, OWNED_ANNOTATION_PROBLEM),
        ],
    }


def volume_schema() -> dict[str, Any]:
    """A corev1 Volume: its name checked here, its source kept as written (the apiserver validates it in the
    Deployment or LeaderWorkerSet's pods)."""
    return {
        "type": "object",
        "required": ["name"],
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "name": {
                "type": "string",
                "maxLength": 63,
                "description": "Volume name, a DNS-1123 label; not one m3fleet uses.",
            }
        },
        "x-kubernetes-validations": [
            cel(
                f"self.name.matches('{children.DNS_LABEL_PATTERN}')",
                "name is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter "
                "or digit); fix: rename it, e.g. scratch",
                ".name",
            ),
            cel(
                f"!(self.name in {list(OWNED_VOLUMES)})",
                f"name {OWNED_VOLUME_PROBLEM}; fix: {OWNED_VOLUME_FIX}",
                ".name",
                "FieldValueForbidden",
            ),
        ],
    }


def _mount_path_rules() -> dict[str, Any]:
    owned = list(OWNED_MOUNT_PATHS)
    directory = "(self.endsWith('/') ? self : self + '/')"
    return {
        "x-kubernetes-validations": [
            cel(
                "self.startsWith('/')",
                "mountPath is not an absolute path; fix: give a path inside the container, e.g. /scratch",
            ),
            cel(
                f"!{owned}.exists(p, self == p || self.startsWith(p + '/') || p.startsWith({directory}))",
                f"mountPath {OWNED_MOUNT_PROBLEM}; fix: {OWNED_MOUNT_FIX}",
            ),
        ]
    }


class VolumeMount(CamelModel):
    """corev1 VolumeMount, in the engine container."""

    name: str = Field(max_length=63, description="A volume of podTemplate.volumes.")
    mount_path: str = Field(
        max_length=1024,
        description="Where the container sees it; not a path m3fleet mounts (see the description of volumeMounts).",
        json_schema_extra=_mount_path_rules(),
    )
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: str = sub_path_field("A directory of the volume to mount instead of its root.")


class PodTemplateMetadata(CamelModel):
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels on every engine pod and on the workload (Deployment or LeaderWorkerSet), e.g. "
        "kueue.x-k8s.io/queue-name. Not m3fleet's own (m3fleet.dev/*, app.kubernetes.io/name, instance, component, "
        "managed-by) nor leaderworkerset.sigs.k8s.io/*.",
        json_schema_extra=label_rules(),
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Annotations on every engine pod and on the workload, e.g. scheduling.volcano.sh/queue-name. "
        "Not m3fleet's own (m3fleet.dev/*, prometheus.io/scrape, port, path) nor leaderworkerset.sigs.k8s.io/*.",
        json_schema_extra=annotation_rules(),
    )


class PodTemplateSpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
                    "self.volumes.exists(v, v.name == m.name))",
                    "volumeMounts names a volume that podTemplate.volumes does not declare; fix: add the volume to "
                    "podTemplate.volumes or correct the mount's name",
                    ".volumeMounts",
                ),
                cel(
                    "!has(self.volumes) || self.volumes.all(v, self.volumes.filter(w, w.name == v.name).size() == 1)",
                    "volumes has two volumes of one name; fix: give each volume its own name",
                    ".volumes",  # not FieldValueDuplicate: kubectl then prints "Duplicate value" without the message
                ),
            ]
        }
    )
    metadata: PodTemplateMetadata = Field(
        default_factory=PodTemplateMetadata, description="Labels and annotations for the engine pods and workload."
    )
    priority_class_name: str = Field(
        default="",
        max_length=253,
        description="PriorityClass of every engine pod (it must exist); empty: the cluster's default.",
        json_schema_extra=children.name_rules(
            "priorityClassName", "give the name as `kubectl get priorityclass` lists it", optional=True
        ),
    )
    scheduler_name: str = Field(
        default="",
        max_length=253,
        description="Scheduler of every engine pod, e.g. volcano; empty: the default scheduler. Pods wait Pending "
        "until a scheduler of that name places them.",
        json_schema_extra=children.name_rules(
            "schedulerName", "give the scheduler's name, e.g. volcano", optional=True
        ),
    )
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=VOLUMES_MAX,
        description="Extra corev1 Volumes of every engine pod (emptyDir, configMap, secret, persistentVolumeClaim, "
        "csi, ...); not named like m3fleet's own: " + ", ".join(OWNED_VOLUMES) + ".",
        json_schema_extra={"items": volume_schema()},
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list,
        max_length=VOLUMES_MAX,
        description="Mounts of those volumes in the engine container; not at, under or above a path m3fleet mounts: "
        + ", ".join(OWNED_MOUNT_PATHS)
        + ".",
    )

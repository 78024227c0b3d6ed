"""Every permission the operator needs: the RBAC table the chart's (Cluster)Roles and docs/security.md are generated
from (hack/generate.py), and what the operator says when a namespace grants it no Secrets. Pure data.
"""

from __future__ import annotations

from typing import NamedTuple

from m3fleet.api.cache import NODE_LABEL_PREFIX
from m3fleet.api.conditions import DeploymentReason
from m3fleet.autoscaling.policy import POD_DELETION_COST

CHILD_VERBS = ("get", "list", "watch", "create", "patch", "delete")  # applied, drift-corrected, pruned


class Grant(NamedTuple):
    """One RBAC rule the operator needs, and the feature that needs it (docs/security.md is generated from these)."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    feature: str


# Every (group, resource, verbs) the operator uses: m3fleet.kubeapi's calls plus kopf's own watches, event posting and
# peering. The chart renders its (Cluster)Roles from this list (hack/generate.py writes it out, and the RBAC table
# of docs/security.md); tests check both directions.
RBAC: tuple[Grant, ...] = (
    Grant("m3fleet.dev", "minimaxm3deployments", ("get", "list", "watch"), "the fleets it runs"),
    Grant("m3fleet.dev", "minimaxm3deployments/status", ("patch",), "conditions, the plan, the autoscaler's decision"),
    Grant(
        "m3fleet.dev",
        "minimaxm3deployments/finalizers",
        ("update",),
        "children set `blockOwnerDeletion`, which the `OwnerReferencesPermissionEnforcement` admission plugin "
        "(on in OpenShift) allows only to whoever may update the owner's finalizers",
    ),
    Grant("apps", "deployments", CHILD_VERBS, "the engine workload of a fleet whose replica fits one node"),
    Grant("leaderworkerset.x-k8s.io", "leaderworkersets", CHILD_VERBS, "the engine workload of a multi-node fleet"),
    Grant("resource.nvidia.com", "computedomains", CHILD_VERBS, "GB200 multi-node fleets (NVLink domain)"),
    Grant("", "services", CHILD_VERBS, "the engine Service `<name>-api`"),
    Grant("", "configmaps", CHILD_VERBS, "engine configuration files"),
    Grant("networking.k8s.io", "networkpolicies", CHILD_VERBS, "the engine pods' ingress policy (`spec.network`)"),
    Grant("policy", "poddisruptionbudgets", CHILD_VERBS, "one engine pod evicted at a time (node drains)"),
    Grant(
        "",
        "secrets",
        ("get", "create", "delete"),
        "by name, never listed or watched: the TensorRT-LLM multi-node SSH key it generates, the CA Secret "
        "`spec.autoscaling.prometheus.caSecretRef` names, and whether a model cache's token Secret exists "
        "(metadata only)",
    ),
    Grant(
        "",
        "serviceaccounts",
        CHILD_VERBS,
        "a disaggregated fleet's ServiceAccount `<name>-dynamo`, which Dynamo's Kubernetes discovery runs as",
    ),
    Grant("rbac.authorization.k8s.io", "roles", CHILD_VERBS, "a disaggregated fleet's discovery Role `<name>-dynamo`"),
    Grant(
        "rbac.authorization.k8s.io",
        "rolebindings",
        CHILD_VERBS,
        "binds a disaggregated fleet's discovery Role to its own ServiceAccount only",
    ),
    Grant(
        "nvidia.com",
        "dynamoworkermetadatas",
        ("create", "delete", "get", "list", "patch", "update", "watch"),
        "never used by the operator: held so it may grant them in a disaggregated fleet's discovery Role (the API "
        "server lets a Role grant only what its creator holds)",
    ),
    Grant(
        "discovery.k8s.io",
        "endpointslices",
        ("get", "list", "watch"),
        "never used by the operator: granted on in a disaggregated fleet's discovery Role (which pods are ready)",
    ),
    Grant(
        "nvidia.com",
        "dynamographdeployments",
        CHILD_VERBS,
        "a disaggregated fleet rendered as a DynamoGraphDeployment for the Dynamo operator",
    ),
    Grant("", "events", ("create", "list"), "Events on its resources; the kubelet's `Pulled` events (time to ready)"),
    Grant(
        "",
        "pods",
        ("get", "list", "watch", "patch"),
        "why a rollout waits and the autoscaler's time to ready (list/watch); get is granted on to a disaggregated "
        "fleet's discovery Role; on an autoscaled scale-down, the "
        f"`{POD_DELETION_COST}` annotation (patch, and with `rbac.admissionPolicy` nothing else, and only on "
        "m3fleet's pods)",
    ),
    Grant(
        "m3fleet.dev", "minimaxm3modelcaches", ("get", "list", "watch", "patch"), "model caches (patch: its finalizer)"
    ),
    Grant("m3fleet.dev", "minimaxm3modelcaches/status", ("patch",), "model cache status"),
    Grant("m3fleet.dev", "minimaxm3modelcaches/finalizers", ("update",), "model cache staging Jobs' owner references"),
    Grant("batch", "jobs", ("list", "watch", "create", "delete"), "model cache staging and cleanup Jobs, one per node"),
    Grant("apps", "daemonsets", ("list", "watch", "create", "patch", "delete"), "model cache image pre-pull"),
    Grant(
        "",
        "nodes",
        ("list", "watch", "patch"),
        "a model cache's pool (list/watch: a new node is staged at once) and its label on each node holding a "
        f"verified copy (patch, and with `rbac.admissionPolicy` only labels under `{NODE_LABEL_PREFIX}`)",
    ),
    Grant(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        ("list", "watch"),
        "kopf's scanning (`rbac.scanning`): a CRD such as LeaderWorkerSet installed after the operator started",
    ),
    Grant("", "namespaces", ("list", "watch"), "kopf's scanning with scope=namespace (`rbac.scanning`)"),
    Grant("kopf.dev", "kopfpeerings", ("get", "list", "watch", "patch"), "peering with scope=namespace"),
    Grant("kopf.dev", "clusterkopfpeerings", ("get", "list", "watch", "patch"), "peering with scope=cluster"),
    Grant(
        "coordination.k8s.io",
        "leases",
        ("get", "create", "update"),
        "with peering, only the holder of the Lease `m3fleet-leader` (in the operator's namespace) writes: kopf's "
        "peering cannot fence a peer cut off from the apiserver (update: renewal at the read resourceVersion)",
    ),
)
# The configuration a grant is needed in (the chart's m3fleet.rbacRules helper reads these names); every grant not
# listed is needed always. perNamespace: a Role in each namespace it is granted in, never a ClusterRole.
RBAC_WHEN: dict[tuple[str, str], str] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): "scanning",
    ("", "namespaces"): "namespaceScanning",  # kopf lists namespaces only when not cluster-wide
    ("kopf.dev", "clusterkopfpeerings"): "clusterPeering",
    ("kopf.dev", "kopfpeerings"): "namespacedPeering",
    ("", "secrets"): "perNamespace",  # a Secret read anywhere would be every tenant's credentials
    ("coordination.k8s.io", "leases"): "peering",
}
# Grants on cluster-scoped resources: a ClusterRole even when the operator watches one namespace.
CLUSTER_SCOPED: frozenset[tuple[str, str]] = frozenset(
    {
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("", "namespaces"),
        ("kopf.dev", "clusterkopfpeerings"),
        ("", "nodes"),
    }
)
# The condition's and the Event's reason when a feature needs Secrets where none are granted.
SECRETS_REFUSED = DeploymentReason.SECRETS_FORBIDDEN
SECRETS_RETRY_SECONDS = 30.0  # a Role granted later sends no event: look again this often


def secrets_refused(namespace: str, needed_for: str) -> str:
    """The message for a 403 on a Secret: the chart grants Secrets one namespace at a time (docs/security.md)."""
    return (
        f"the operator may not use Secrets in namespace {namespace}, which {needed_for} needs: add {namespace} to "
        "the chart's rbac.secretNamespaces (helm upgrade --reuse-values --set 'rbac.secretNamespaces={...}'), "
        "or grant its ServiceAccount get/create/delete on secrets there (docs/security.md)"
    )


# What the chart's ValidatingAdmissionPolicies (rbac.admissionPolicy) leave the operator's `patch` on nodes and pods:
# node labels under this prefix, and these annotations on pods carrying the managed-by label.
NODE_LABEL_PREFIXES = (NODE_LABEL_PREFIX,)
POD_ANNOTATIONS = (POD_DELETION_COST,)

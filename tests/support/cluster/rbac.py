"""What a Helm release grants its ServiceAccounts, read from the release's rendered manifest, and a wait until the
apiserver's authorizer agrees.

`helm --wait` returns once the objects are stored; the apiserver's RBAC authorizer learns of a new Role or binding
through its own watch, a moment later (seconds under a loaded CI machine). An operator started right after an upgrade
that added grants (peering: the peering object and the Lease) would be refused meanwhile, and the cluster tier fails
any 403 the operator gets. So an install or upgrade waits until the authorizer, asked with a SubjectAccessReview, allows
what it added.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import yaml


class Grant(NamedTuple):
    user: str  # system:serviceaccount:NAMESPACE:NAME
    namespace: str | None  # a RoleBinding's namespace; None: a ClusterRoleBinding (every namespace, cluster scope)
    verb: str
    group: str
    resource: str
    role: str  # the (Cluster)Role that holds the rule: the authorizer learns each Role, and each binding, whole

    def review(self) -> dict[str, Any]:
        """A SubjectAccessReview that asks the authorizer about this grant. Not `kubectl auth can-i`: it resolves the
        resource through discovery and says no for a CRD the cluster does not serve (ComputeDomains without the DRA
        driver), which RBAC grants all the same."""
        attributes = {"verb": self.verb, "group": self.group, "resource": self.resource}
        if self.namespace is not None:
            attributes["namespace"] = self.namespace
        return {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": self.user, "resourceAttributes": attributes},
        }

    def __str__(self) -> str:
        where = f"in {self.namespace}" if self.namespace is not None else "cluster-wide"
        return f"{self.user} may {self.verb} {self.resource}.{self.group} {where}"


def grants(manifest: str) -> set[Grant]:
    """Each (ServiceAccount, namespace, verb, resource) the manifest's bindings grant through its (Cluster)Roles.
    Roles a binding names but the manifest does not hold (e.g. the cluster's `view`) are not the release's."""
    documents = [d for d in yaml.safe_load_all(manifest) if isinstance(d, dict)]
    roles = {
        (d["kind"], (d.get("metadata") or {}).get("namespace"), d["metadata"]["name"]): d.get("rules") or []
        for d in documents
        if d.get("kind") in ("Role", "ClusterRole")
    }
    found: set[Grant] = set()
    for binding in documents:
        if binding.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        namespace = (binding.get("metadata") or {}).get("namespace") if binding["kind"] == "RoleBinding" else None
        ref = binding.get("roleRef") or {}
        rules = roles.get((ref.get("kind"), namespace if ref.get("kind") == "Role" else None, ref.get("name")), [])
        for subject in binding.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                user = f"system:serviceaccount:{subject.get('namespace')}:{subject.get('name')}"
                found.update(_rule_grants(user, namespace, f"{ref.get('kind')}/{ref.get('name')}", rules))
    return found


def to_ask(before: set[Grant], after: set[Grant]) -> list[Grant]:
    """The grants the change added, one per ServiceAccount, namespace and Role: the authorizer sees a Role (and a
    binding) as a whole, so one of its new rules answering yes shows that it has the new version."""
    chosen: dict[tuple[str, str | None, str], Grant] = {}
    for grant in sorted(after - before, key=lambda g: (g.user, g.namespace or "", g.role, g.resource, g.verb)):
        chosen.setdefault((grant.user, grant.namespace, grant.role), grant)
    return list(chosen.values())


def _rule_grants(user: str, namespace: str | None, role: str, rules: Iterable[dict[str, Any]]) -> Iterable[Grant]:
    for rule in rules:
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    yield Grant(user, namespace, verb, group, resource, role)

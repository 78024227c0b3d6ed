"""The operator's RBAC grants exactly what m3fleet.controller.kube.RBAC lists, no more, no wildcards.

kube.RBAC is every (group, resource, verbs) the operator calls, kopf's own calls included. Which of
them a configuration needs is kopf's business and is stated here independently of the chart:

* leases only with peering (the write Lease);
* clusterkopfpeerings only with peering in cluster scope, kopfpeerings only with peering in namespace
  scope (kopf/_core/engines/peering.py guess_selectors);
* namespaces list/watch only in namespace scope: kopf's namespace observer lists namespaces only when
  not cluster-wide (kopf/_core/reactor/observation.py), and only with scanning;
* customresourcedefinitions list/watch only with scanning (rbac.scanning).

In namespace scope the namespaced grants live in a Role in the watched namespace; the cluster-scoped
ones (CRDs, namespaces) in a small ClusterRole, since no Role can grant cluster-scoped resources.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from m3fleet.controller.kube import RBAC
from tests.chart.support import NAMESPACE, render

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "clusterkopfpeerings"}


def expected(scope: str, peering: bool, scanning: bool) -> set[Grant]:
    grants = {(g, r, v) for g, r, verbs in RBAC for v in verbs}
    unused = set()
    if not (peering and scope == "cluster"):
        unused.add("clusterkopfpeerings")
    if not (peering and scope == "namespace"):
        unused.add("kopfpeerings")
    if not peering:
        unused.add("leases")  # the write Lease of peers (controller/peering.py)
    if not (scanning and scope == "namespace"):
        unused.add("namespaces")
    if not scanning:
        unused.add("customresourcedefinitions")
    return {g for g in grants if g[1] not in unused}


def operator_grants(objects: list[dict[str, Any]], sa: str = "m3fleet") -> dict[tuple[str, str | None], set[Grant]]:
    """Grants bound to the operator's ServiceAccount, keyed by (role kind, namespace of the grant)."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}
    out: dict[tuple[str, str | None], set[Grant]] = {}
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subjects = binding["subjects"]
        if {"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE} not in subjects:
            continue
        assert len(subjects) == 1, "the operator's bindings bind the operator only"
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        key = ("ClusterRole" if binding["kind"] == "ClusterRoleBinding" else "Role", namespace)
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
            for g, r, v in itertools.product(rule["apiGroups"], rule["resources"], rule["verbs"]):
                out.setdefault(key, set()).add((g, r, v))
    return out


CASES = [
    (scope, peering, scanning)
    for scope in ("cluster", "namespace")
    for peering in (False, True)
    for scanning in (True, False)
]


@pytest.mark.parametrize(("scope", "peering", "scanning"), CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_operator_gets_exactly_kube_rbac(scope: str, peering: bool, scanning: bool) -> None:
    values: dict[str, Any] = {"scope": scope, "peering": {"enabled": peering}, "rbac": {"scanning": scanning}}
    if scope == "namespace":
        values["watchNamespace"] = "llm"
    grants = operator_grants(render(values))
    union = set().union(*grants.values())
    assert union == expected(scope, peering, scanning)

    if scope == "cluster":
        assert set(grants) == {("ClusterRole", None)}
    else:
        namespaced = grants[("Role", "llm")]
        assert all(r.split("/")[0] not in CLUSTER_SCOPED for _, r, _ in namespaced)
        cluster_wide = grants.get(("ClusterRole", None), set())
        # Cluster-wide, the namespace-scoped operator may only list/watch CRDs and namespaces (kopf's scanning),
        # and list/watch/patch nodes (the model cache's pool and its node labels).
        node_grants = {("", "nodes", v) for v in ("list", "watch", "patch")}
        assert node_grants <= cluster_wide
        assert {(r, v) for _, r, v in cluster_wide - node_grants} <= {
            ("customresourcedefinitions", "list"),
            ("customresourcedefinitions", "watch"),
            ("namespaces", "list"),
            ("namespaces", "watch"),
        }
        assert bool(cluster_wide - node_grants) == scanning
        assert set(grants) <= {("Role", "llm"), ("ClusterRole", None)}


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_no_wildcards_anywhere(scope: str) -> None:
    objects = render({"scope": scope, "peering": {"enabled": True}})
    roles = [o for o in objects if o["kind"] in ("ClusterRole", "Role")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert all("*" not in item for item in rule[field]), f"{role['metadata']['name']}: {rule}"


def test_secrets_only_as_the_ssh_keys_need() -> None:
    """get by name, create (once per resource), delete (pruning); never list, watch, update or patch: the
    operator never enumerates Secrets, so it cannot read ones it does not know the name of."""
    for scope in ("cluster", "namespace"):
        grants = set().union(*operator_grants(render({"scope": scope})).values())
        assert {v for g, r, v in grants if (g, r) == ("", "secrets")} == {"get", "create", "delete"}


def test_rbac_create_false_renders_no_rbac() -> None:
    values = {
        "rbac": {"create": False, "aggregateToDefaultRoles": True},
        "serviceAccount": {"create": False, "name": "x"},
    }
    kinds = {o["kind"] for o in render(values)}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def test_user_roles_aggregate_and_are_not_the_operators() -> None:
    objects = render()
    edit = next(o for o in objects if o["metadata"]["name"] == "m3fleet-edit")
    view = next(o for o in objects if o["metadata"]["name"] == "m3fleet-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {v for rule in view["rules"] for v in rule["verbs"]} == {"get", "list", "watch"}
    # People never write status: the operator owns it.
    status_rule = next(r for r in edit["rules"] if "minimaxm3deployments/status" in r["resources"])
    assert status_rule["verbs"] == ["get"]
    bound = {o["roleRef"]["name"] for o in objects if o["kind"].endswith("Binding")}
    assert not bound & {"m3fleet-edit", "m3fleet-view"}
    names = {o["metadata"]["name"] for o in render({"rbac": {"aggregateToDefaultRoles": False}})}
    assert not names & {"m3fleet-edit", "m3fleet-view"}

"""The operator's RBAC grants exactly what m3fleet.permissions.RBAC lists, no more, no wildcards.

permissions.RBAC is every (group, resource, verbs) the operator calls, kopf's own calls included. Which of
them a configuration needs is kopf's business and is stated here independently of the chart:

* leases only with peering (the write Lease);
* clusterkopfpeerings only with peering in cluster scope, kopfpeerings only with peering in namespace
  scope (kopf/_core/engines/peering.py guess_selectors);
* namespaces list/watch only in namespace scope: kopf's namespace observer lists namespaces only when
  not cluster-wide (kopf/_core/reactor/observation.py), and only with scanning;
* customresourcedefinitions list/watch only with scanning (rbac.scanning).

In namespace scope the namespaced grants live in a Role in the watched namespace; the cluster-scoped
ones (CRDs, namespaces, nodes) in a small ClusterRole, since no Role can grant cluster-scoped resources.
Secrets are never in a ClusterRole: in cluster scope only in a Role in each namespace of rbac.secretNamespaces.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml

from m3fleet.permissions import NODE_LABEL_PREFIXES, POD_ANNOTATIONS, RBAC
from m3fleet.render.labels import MANAGED_BY
from tests.support.chart import NAMESPACE, RELEASE, render
from tests.support.cluster.rbac import grants, to_ask

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "clusterkopfpeerings"}


def expected(scope: str, peering: bool, scanning: bool) -> set[Grant]:
    grants = {(grant.group, grant.resource, v) for grant in RBAC for v in grant.verbs}
    unused = set() if scope == "namespace" else {"secrets"}  # cluster scope: Secrets only per namespace
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
        if "helm.sh/hook" in (binding["metadata"].get("annotations") or {}):
            continue  # made at uninstall only, for the pre-delete hook: test_chart.py checks it
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
        assert set(grants) == {("ClusterRole", None)}  # no Secrets anywhere by default
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


SECRET_VERBS = {"get", "create", "delete"}


def test_secrets_only_per_namespace_and_by_name() -> None:
    """get by name, create (once per resource), delete (pruning); never list, watch, update or patch: the
    operator never enumerates Secrets. Never in a ClusterRole: with scope=cluster only in a Role in each namespace
    of rbac.secretNamespaces (none by default), with scope=namespace in the watched namespace's Role."""
    default = operator_grants(render())
    assert not any(r == "secrets" for grants in default.values() for _, r, _ in grants)

    listed = operator_grants(render({"rbac": {"secretNamespaces": ["llm", "team-a"]}}))
    assert set(listed) == {("ClusterRole", None), ("Role", "llm"), ("Role", "team-a")}
    assert not any(r == "secrets" for _, r, _ in listed[("ClusterRole", None)])
    for namespace in ("llm", "team-a"):
        assert listed[("Role", namespace)] == {("", "secrets", v) for v in SECRET_VERBS}

    scoped = operator_grants(render({"scope": "namespace", "watchNamespace": "llm"}))
    assert {v for g, r, v in scoped[("Role", "llm")] if (g, r) == ("", "secrets")} == SECRET_VERBS
    assert not any(r == "secrets" for _, r, _ in scoped.get(("ClusterRole", None), set()))


def _policies(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}


def test_admission_policies_narrow_the_operators_node_and_pod_patches_only() -> None:
    """One policy for nodes and one for pods, each matching UPDATEs of the operator's ServiceAccount only, bound
    with Deny; the node labels and pod annotations they leave it are the code's (permissions.NODE_LABEL_PREFIXES,
    permissions.POD_ANNOTATIONS), so a renamed label cannot drift from the policy."""
    objects = render()
    policies = _policies(objects)
    assert set(policies) == {f"m3fleet-{NAMESPACE}-nodes", f"m3fleet-{NAMESPACE}-pods"}
    bindings = {o["spec"]["policyName"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(bindings) == set(policies)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings.values())
    for name, policy in policies.items():
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail"
        [rule] = spec["matchConstraints"]["resourceRules"]
        assert rule["operations"] == ["UPDATE"] and rule["resources"] == [name.rsplit("-", 1)[1]]
        [condition] = spec["matchConditions"]
        assert condition["expression"] == f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:m3fleet'"
    node_rules = str(policies[f"m3fleet-{NAMESPACE}-nodes"]["spec"])
    assert all(f"k.startsWith('{prefix}')" in node_rules for prefix in NODE_LABEL_PREFIXES)
    pod_rules = str(policies[f"m3fleet-{NAMESPACE}-pods"]["spec"])
    assert all(f"k == '{annotation}'" in pod_rules for annotation in POD_ANNOTATIONS)
    assert f"'{MANAGED_BY}' in oldObject.metadata.labels" in pod_rules

    renamed_account = _policies(render({"serviceAccount": {"name": "ops"}}))
    for policy in renamed_account.values():
        assert policy["spec"]["matchConditions"][0]["expression"].endswith(f":{NAMESPACE}:ops'")
    assert not _policies(render({"rbac": {"admissionPolicy": False}}))
    assert not _policies(render({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "x"}}))


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
    bound = {o["roleRef"]["name"] for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")}
    assert not bound & {"m3fleet-edit", "m3fleet-view"}
    names = {o["metadata"]["name"] for o in render({"rbac": {"aggregateToDefaultRoles": False}})}
    assert not names & {"m3fleet-edit", "m3fleet-view"}


def test_the_cluster_tier_waits_for_the_grants_an_upgrade_to_peering_adds() -> None:
    """tests/support/cluster/rbac.py reads a release's grants from its manifest; after `helm upgrade` the cluster
    tier asks the authorizer about each Role the upgrade added to or changed (the peering object and the Lease), so an
    operator started next is not refused while the authorizer catches up."""
    before = grants(yaml.safe_dump_all(render()))
    after = grants(yaml.safe_dump_all(render({"peering": {"enabled": True}})))
    user = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    assert before < after
    added = {(g.namespace, g.group, g.resource, g.verb) for g in after - before}
    assert added == {(None, "kopf.dev", "clusterkopfpeerings", v) for v in ("get", "list", "watch", "patch")} | {
        (None, "coordination.k8s.io", "leases", v) for v in ("get", "create", "update")
    }, added  # cluster scope: one ClusterRole, bound cluster-wide
    asked = to_ask(before, after)
    assert [(g.user, g.namespace) for g in asked] == [(user, None)], asked  # one new version of one ClusterRole
    review = asked[0].review()
    assert review["kind"] == "SubjectAccessReview" and review["spec"]["user"] == user, review
    assert "namespace" not in review["spec"]["resourceAttributes"], review  # cluster-wide
    assert to_ask(after, after) == []  # an upgrade that adds nothing waits for nothing
    # In namespace scope the Lease and the peering object are in the Role of the watched namespace: asked there.
    scoped = {"scope": "namespace"}
    role_before = grants(yaml.safe_dump_all(render(scoped)))
    role_after = grants(yaml.safe_dump_all(render({**scoped, "peering": {"enabled": True}})))
    asked = to_ask(role_before, role_after)
    assert [(g.namespace, g.role) for g in asked] == [(NAMESPACE, f"Role/{RELEASE}")], asked
    assert asked[0].review()["spec"]["resourceAttributes"]["namespace"] == NAMESPACE, asked

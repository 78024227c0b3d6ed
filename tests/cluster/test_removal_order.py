"""A scale-down when the operator may not mark pods, on the real tier: `m3fleet run` as a ServiceAccount bound to
the chart's own roles less `patch` on pods (a cluster admin who trimmed them), against the real apiserver, its
RBAC, a real Prometheus scraping engine stand-ins and kwok's pods.

The operator prices each pod of a Deployment fleet by its resident KV (pod-deletion-cost) before a scale-down, so
the ReplicaSet removes the least loaded pod. When the apiserver refuses that patch, the scale-down must still
happen, with the ReplicaSet's own choice, and the refusal must be said: a `RemovalOrderNotSet` Warning Event
naming the missing permission. Nothing else may be refused.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.autoscaling.prom import prometheus
from tests.support.cluster import standins as loop
from tests.support.cluster.cluster import OPERATOR_NAMESPACE, OPERATOR_SA, Cluster, OperatorProcess
from tests.support.cluster.fleet import delete, pods, wait_ready, weight_volumes
from tests.support.ports import free_port

from m3fleet.api import parse_resource
from m3fleet.autoscaling.policy import POD_DELETION_COST
from m3fleet.planner import plan as make_plan

NARROW_SA = "m3fleet-no-pod-patch"


def _without_pod_patch(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules with `patch` taken off pods (a rule naming pods among other resources is split)."""
    out: list[dict[str, Any]] = []
    for rule in rules:
        core = "" in (rule.get("apiGroups") or [])
        resources = rule.get("resources") or []
        if not (core and "pods" in resources and "patch" in (rule.get("verbs") or [])):
            out.append(rule)
            continue
        if len(resources) > 1:
            out.append({**rule, "resources": [r for r in resources if r != "pods"]})
        verbs = [v for v in rule["verbs"] if v != "patch"]
        if verbs:
            out.append({**rule, "apiGroups": [""], "resources": ["pods"], "verbs": verbs})
    return out


def _clean(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of a stored object to apply under another name (server-set metadata and Helm's labels dropped)."""
    fresh = copy.deepcopy(obj)
    meta = fresh["metadata"]
    fresh["metadata"] = {"name": name, **({"namespace": meta["namespace"]} if "namespace" in meta else {})}
    return fresh


@contextlib.contextmanager
def narrow_operator(chart: Cluster) -> Iterator[OperatorProcess]:
    """A ServiceAccount with every binding the chart gives its own, the main role less pods/patch; the operator
    runs as it (cluster scope, as the chart's default)."""
    chart.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NARROW_SA, "namespace": OPERATOR_NAMESPACE}}
    )
    created: list[tuple[str, str, str | None]] = [("serviceaccount", NARROW_SA, OPERATOR_NAMESPACE)]
    ours = {"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NAMESPACE}
    narrowed = 0
    for kind, role_kind in (("clusterrolebinding", "clusterrole"), ("rolebinding", "role")):
        for binding in chart.list(kind):
            if not any(all(s.get(k) == v for k, v in ours.items()) for s in binding.get("subjects") or []):
                continue
            namespace = binding["metadata"].get("namespace")
            role = chart.get(role_kind, binding["roleRef"]["name"], namespace)
            assert role is not None, binding["roleRef"]
            rules = _without_pod_patch(role.get("rules") or [])
            name = f"{binding['metadata']['name']}-no-pod-patch"
            narrowed += rules != role.get("rules")
            chart.apply({**_clean(role, name), "rules": rules})
            bound = _clean(binding, name)
            bound["roleRef"] = {**binding["roleRef"], "name": name}
            bound["subjects"] = [{**ours, "name": NARROW_SA}]
            chart.apply(bound)
            created += [(role_kind, name, namespace), (kind, name, namespace)]
    assert narrowed, "none of the chart's roles lets its ServiceAccount patch pods"
    try:
        with chart.operator(
            "--all-namespaces", "--standalone", service_account=NARROW_SA, name="operator-narrow", allow_forbidden=True
        ) as running:
            yield running
    finally:
        for kind, name, namespace in reversed(created):
            chart.kubectl("delete", kind, name, *(["-n", namespace] if namespace else []), "--ignore-not-found")


def test_a_scale_down_the_operator_cannot_order_goes_ahead_and_says_why(chart: Cluster, tmp_path: Path) -> None:
    chart.namespace(loop.NAMESPACE)
    weight_volumes(chart, loop.NAMESPACE)
    document = loop.fleet(loop.ACT, "act")
    document["spec"]["autoscaling"]["minReplicas"] = 2  # two pods first; then minReplicas 1 lets one go
    plans = {loop.ACT: make_plan(parse_resource(document).spec)}
    targets, workdir = tmp_path / "targets.json", tmp_path / "prom"
    workdir.mkdir()
    with (
        narrow_operator(chart) as operator,
        loop.StandIns(chart, targets, plans) as standins,
        prometheus(workdir, loop.scrape_config(targets), port=free_port()) as url,
    ):
        try:
            standins.demand[loop.ACT] = loop.QUIET
            document["spec"]["autoscaling"]["prometheus"]["url"] = url
            chart.apply(document)
            wait_ready(chart, loop.ACT, loop.NAMESPACE)
            loop.eventually(
                "two stand-ins up",
                lambda: standins.up(loop.ACT) == 2,
                120,
                what_now=lambda: loop.autoscaling(chart, loop.ACT),
            )
            time.sleep(6)  # Prometheus scrapes them

            # Only one replica is needed now: the operator tries to price the pods, is refused, and scales down.
            document["spec"]["autoscaling"]["minReplicas"] = 1
            chart.apply(document)
            loop.eventually(
                "the fleet scaled down to 1",
                lambda: loop.replicas(chart, loop.ACT) == 1,
                120,
                what_now=lambda: loop.autoscaling(chart, loop.ACT),
            )
            refused = loop.eventually(
                "a RemovalOrderNotSet Event", lambda: loop.events(chart, loop.ACT, "RemovalOrderNotSet"), 30
            )
            assert any(
                POD_DELETION_COST in m
                and "grant the operator patch on pods" in m
                and "the ReplicaSet's own choice" in m
                for m in refused
            ), refused
            assert any("scale-down 2 -> 1" in m for m in loop.events(chart, loop.ACT, "Scaled"))
            loop.eventually("one pod left", lambda: len(pods(chart, loop.ACT, loop.NAMESPACE)) == 1, 60)
            kept = pods(chart, loop.ACT, loop.NAMESPACE)[0]
            assert POD_DELETION_COST not in (kept["metadata"].get("annotations") or {}), kept["metadata"]
            # The apiserver refused the pod patches and nothing else.
            forbidden = operator.forbidden()
            assert forbidden and all(f.startswith(f"patch pods/{loop.NAMESPACE}/{loop.ACT}-") for f in forbidden), (
                forbidden
            )
        finally:
            delete(chart, loop.ACT, loop.NAMESPACE)

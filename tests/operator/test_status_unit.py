"""Status conditions and reconcile helpers, without a server."""

from __future__ import annotations

from typing import Any

from m3fleet.api import parse_resource
from m3fleet.controller.reconcile import desired_replicas, intent_hash, stamped
from m3fleet.controller.status import Blocked, Workload, conditions

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def by_type(conds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in conds}


def test_rollout_in_progress_is_never_ready() -> None:
    # New generation applied, the Deployment controller has not observed it yet.
    stale = Workload(desired=2, replicas=2, ready=2, updated=2, observed_current=False)
    c = by_type(conditions([], 3, T0, stale, None))
    assert c["Ready"]["status"] == "False" and c["Progressing"]["status"] == "True"
    assert c["Available"]["status"] == "True"  # the old pods still serve
    half = Workload(desired=2, replicas=3, ready=2, updated=1, observed_current=True)
    assert by_type(conditions([], 3, T0, half, None))["Ready"]["status"] == "False"


def test_all_ready() -> None:
    done = Workload(desired=2, replicas=2, ready=2, updated=2, observed_current=True)
    c = by_type(conditions([], 3, T0, done, None))
    assert c["Ready"]["status"] == "True" and c["Ready"]["reason"] == "AllReplicasReady"
    assert c["Progressing"]["status"] == "False" and c["Degraded"]["status"] == "False"
    assert all(x["observedGeneration"] == 3 for x in c.values())


def test_last_transition_time_changes_only_when_status_flips() -> None:
    progressing = Workload(desired=1, replicas=1, ready=0, updated=1, observed_current=True)
    first = conditions([], 1, T0, progressing, None)
    same = conditions(first, 1, T1, progressing, None)
    assert same == first  # recomputing an unchanged status is identical: nothing to write
    done = Workload(desired=1, replicas=1, ready=1, updated=1, observed_current=True)
    flipped = by_type(conditions(first, 1, T1, done, None))
    assert flipped["Ready"]["lastTransitionTime"] == T1
    assert flipped["Degraded"]["lastTransitionTime"] == T0  # still False


def test_blocked_reports_degraded_and_keeps_available_from_running_children() -> None:
    running = Workload(desired=1, replicas=1, ready=1, updated=1, observed_current=True)
    c = by_type(conditions([], 4, T0, running, Blocked("InvalidSpec", "spec.x: bad; fix: y")))
    assert c["Degraded"]["status"] == "True" and c["Degraded"]["reason"] == "InvalidSpec"
    assert c["Ready"]["status"] == "False" and c["Available"]["status"] == "True"


def test_scaled_to_zero_is_ready() -> None:
    c = by_type(conditions([], 1, T0, Workload(desired=0, observed_current=True), None))
    assert c["Ready"]["reason"] == "ScaledToZero" and c["Ready"]["status"] == "True"


def test_workload_from_live_deployment() -> None:
    live = {"metadata": {"generation": 4}, "status": {"observedGeneration": 3, "replicas": 2, "readyReplicas": 2}}
    assert not Workload.from_live(2, live).all_ready
    live["status"].update(observedGeneration=4, updatedReplicas=2)
    assert Workload.from_live(2, live).all_ready
    assert not Workload.from_live(2, None).all_ready


def doc(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "x", "namespace": "ns"},
        "spec": {"model": {"source": {"pvc": {"claimName": "w"}}}, **spec},
    }


def test_desired_replicas_spec_unless_the_autoscaler_acts() -> None:
    assert desired_replicas(parse_resource(doc(replicas=3)), {}) == 3
    scaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 5}
    acting = parse_resource(doc(replicas=3, autoscaling=scaling))
    assert desired_replicas(acting, {"autoscaling": {"desiredReplicas": 4}}) == 4
    assert desired_replicas(acting, {"autoscaling": {"desiredReplicas": 9}}) == 5  # clamped to max
    assert desired_replicas(acting, {}) == 3  # no decision yet: spec, clamped
    advisory = parse_resource(doc(replicas=3, autoscaling={**scaling, "mode": "advisory"}))
    assert desired_replicas(advisory, {"autoscaling": {"desiredReplicas": 4}}) == 3


def test_intent_hash_is_stable_and_sensitive() -> None:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}, "data": {"a": "1"}}
    owner = {"apiVersion": "m3fleet.dev/v1alpha1", "kind": "MiniMaxM3Deployment", "metadata": {"name": "x", "uid": "u"}}
    a, b = stamped(obj, owner), stamped(obj, owner)
    assert a == b and a["metadata"]["ownerReferences"][0]["uid"] == "u"
    changed = stamped({**obj, "data": {"a": "2"}}, owner)
    key = "m3fleet.dev/intent-hash"
    assert changed["metadata"]["annotations"][key] != a["metadata"]["annotations"][key]
    assert intent_hash(obj) == intent_hash(dict(reversed(list(obj.items()))))

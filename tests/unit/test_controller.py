"""The controller's pure parts, without a server: status conditions, reconcile and scheduling helpers,
kopf's peering rule, the autoscaler's view of the fleet."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from m3fleet.api import parse_resource
from m3fleet.autoscaling.policy import RECORD_HEARTBEAT_SECONDS, replicas_to_apply, worth_recording
from m3fleet.autoscaling.prometheus import PrometheusAdapter, Tls
from m3fleet.autoscaling.time_to_ready import fleet_from
from m3fleet.controller.autoscaler import interval_of, prometheus_adapter, source_spec
from m3fleet.controller.cache import mounts_of, node_view
from m3fleet.controller.decide import missing_api, understand
from m3fleet.controller.manager import backoff, newer, worth_reconciling
from m3fleet.controller.peering import verdict
from m3fleet.controller.reconcile import digest, what_matters
from m3fleet.controller.status import (
    Blocked,
    Workload,
    cache_not_ready,
    conditions,
    model_cache_record,
    status_update,
)

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


def test_scaled_to_zero_is_ready_but_not_available() -> None:
    c = by_type(conditions([], 1, T0, Workload(desired=0, observed_current=True), None))
    assert c["Ready"]["reason"] == "ScaledToZero" and c["Ready"]["status"] == "True"
    assert (c["Available"]["status"], c["Available"]["reason"]) == ("False", "ScaledToZero")  # nothing serves
    # Scaling down to zero: Ready once the last replica is gone; Available while one still serves.
    draining = by_type(conditions([], 1, T0, Workload(desired=0, replicas=1, ready=1, observed_current=True), None))
    assert draining["Ready"]["status"] == "False" and draining["Available"]["status"] == "True"
    blocked = by_type(conditions([], 1, T0, Workload(desired=0), Blocked("InvalidSpec", "x")))
    assert blocked["Available"]["status"] == "False"


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
    assert replicas_to_apply(parse_resource(doc(replicas=3)).spec, {}) == 3
    scaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 5}
    acting = parse_resource(doc(replicas=3, autoscaling=scaling))
    assert replicas_to_apply(acting.spec, {"autoscaling": {"desiredReplicas": 4}}) == 4
    assert replicas_to_apply(acting.spec, {"autoscaling": {"desiredReplicas": 9}}) == 5  # clamped to max
    assert replicas_to_apply(acting.spec, {}) == 3  # no decision yet: spec, clamped
    advisory = parse_resource(doc(replicas=3, autoscaling={**scaling, "mode": "advisory"}))
    assert replicas_to_apply(advisory.spec, {"autoscaling": {"desiredReplicas": 4}}) == 3


def test_turning_autoscaling_off_removes_its_record_so_turning_it_on_starts_from_spec() -> None:
    done = Workload(desired=4, replicas=4, ready=4, updated=4, observed_current=True)
    record = {"desiredReplicas": 1, "state": {"history": [[0, 1]]}}
    body = {"metadata": {"generation": 2}, "status": {"autoscaling": record}}
    off = status_update(body, T0, done, None, None, "sel", [], None, autoscaling=False)
    assert off is not None and "autoscaling" in off and off["autoscaling"] is None  # a merge patch deletes it
    for kept in (True, None):  # on, or blocked (the spec was not read): the record stays
        update = status_update(body, T0, done, None, None, "sel", [], None, autoscaling=kept)
        assert update is None or "autoscaling" not in update
    cleared = {"metadata": {"generation": 2}, "status": {**off, "autoscaling": None}}
    assert status_update(cleared, T0, done, None, None, "sel", [], None, autoscaling=False) is None  # quiet after
    scaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 5}
    on_again = parse_resource(doc(replicas=4, autoscaling=scaling))
    assert replicas_to_apply(on_again.spec, cleared["status"]) == 4  # spec.replicas until the first tick decides


def test_drift_is_judged_on_what_matters() -> None:
    live: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "labels": {"a": "1"}, "resourceVersion": "7", "managedFields": [{}]},
        "data": {"k": "v"},
    }
    assert what_matters(live) == {"labels": {"a": "1"}, "annotations": {}, "ownerReferences": [], "data": {"k": "v"}}
    bookkeeping = {**live, "metadata": {**live["metadata"], "resourceVersion": "8"}, "status": {"x": 1}}
    assert digest(what_matters(bookkeeping)) == digest(what_matters(live))
    assert digest(what_matters({**live, "data": {"k": "w"}})) != digest(what_matters(live))
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})


def meta(rv: str, generation: int = 1, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv, "generation": generation, **extra}}


def test_the_cache_never_goes_back_and_reconciles_only_on_news() -> None:
    assert newer(meta("10"), meta("9")) and not newer(meta("9"), meta("10")) and not newer(meta("9"), meta("9"))
    assert newer(meta("b"), meta("a"))  # opaque versions: any other one is news
    assert worth_reconciling(None, meta("1"))  # first sight
    assert not worth_reconciling(meta("1"), {**meta("2"), "status": {"x": 1}})  # status only: our own write
    assert worth_reconciling(meta("1"), meta("2", generation=2))
    assert worth_reconciling(meta("1"), meta("2", labels={"a": "b"}))
    assert worth_reconciling(meta("1"), meta("2", deletionTimestamp="2026-01-01T00:00:00Z"))


def test_backoff_doubles_to_a_minute_and_honours_retry_after() -> None:
    assert [backoff(n, None) for n in (1, 2, 3, 7, 20)] == [1, 2, 4, 60, 60]
    assert backoff(1, 5) == 5 and backoff(7, 5) == 60


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def peers(**records: tuple[int, float]) -> dict[str, Any]:
    """{identity: (priority, seconds since last seen)} as kopf writes them, lifetime 60 s."""
    return {
        "status": {
            who: {"priority": p, "lifetime": 60, "lastseen": (NOW - timedelta(seconds=ago)).isoformat()}
            for who, (p, ago) in records.items()
        }
    }


def test_peering_follows_kopfs_rule() -> None:
    assert not verdict(None, "me", 100, NOW).paused  # no peering object: nobody to give way to
    assert not verdict(peers(me=(100, 0), low=(50, 0)), "me", 100, NOW).paused
    high = verdict(peers(me=(100, 0), high=(200, 10)), "me", 100, NOW)
    assert high.paused and high.blockers == ("high",) and high.recheck_in == 50  # when its record expires
    assert verdict(peers(twin=(100, 0)), "me", 100, NOW).paused  # the same priority: both pause, as kopf does
    assert not verdict(peers(gone=(200, 61)), "me", 100, NOW).paused  # a dead peer does not count
    assert not verdict({"status": {"odd": {"priority": "x"}}}, "me", 100, NOW).paused


def test_only_autoscaling_resources_have_an_interval() -> None:
    assert interval_of(understand(doc())) is None
    assert interval_of(understand(doc(autoscaling={"enabled": True, "intervalSeconds": 30}))) == 30
    assert interval_of(understand(doc(autoscaling={"enabled": True, "intervalSeconds": 1}))) is None  # invalid


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def test_fleet_from_measures_time_to_ready_and_starting_ages() -> None:
    now = 1_800_000_000.0
    workload = {"spec": {"replicas": 3}, "status": {"readyReplicas": 1}}

    def pod(created: float, ready_at: float | None) -> dict[str, Any]:
        conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": iso(ready_at)}] if ready_at else []
        return {"metadata": {"creationTimestamp": iso(created)}, "status": {"conditions": conditions}}

    fleet = fleet_from(workload, [pod(now - 900, now - 300), pod(now - 120, None), pod(now - 60, None)], now)
    assert fleet.current_replicas == 3 and fleet.ready_replicas == 1
    assert fleet.starting_ages == (60.0, 120.0)
    assert fleet.time_to_ready_seconds == 600.0
    assert fleet.starting_remaining == (540.0, 480.0)  # the measured 600 s less each one's age


def _pod(scheduled: dict[str, Any] | None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "deletionTimestamp": T0} if deleting else {"name": "p"}
    return {"metadata": meta, "status": {"conditions": [scheduled] if scheduled else []}}


def test_pods_that_no_node_fits_are_named_in_ready_with_the_schedulers_words() -> None:
    why = "0/15 nodes are available: 15 node(s) didn't match Pod's node affinity/selector."
    waiting = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
    placed = {"type": "PodScheduled", "status": "True"}
    workload = Workload(desired=2, replicas=2, ready=0, updated=2, observed_current=True)
    assert workload.with_pods([_pod(placed), _pod(placed)]).unschedulable is None
    assert workload.with_pods([_pod(waiting, deleting=True)]).unschedulable is None
    stuck = workload.with_pods([_pod(placed), _pod(waiting)])
    assert stuck.unschedulable == f"1 of 2 pods cannot be scheduled: {why}"
    ready = by_type(conditions([], 1, T0, stuck, None))["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "Unschedulable" and why in ready["message"]
    assert by_type(conditions([], 1, T0, workload, None))["Ready"]["reason"] == "RolloutInProgress"


def test_pods_waiting_for_the_nodes_of_a_cache_not_ready_say_what_the_cache_says() -> None:
    def cache(*conds: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": "m3"}, "status": {"conditions": list(conds)}}

    conflict = {"type": "Ready", "status": "False", "reason": "PathConflict", "message": "0 of 2 nodes hold a copy"}
    hint = cache_not_ready(cache(conflict))
    assert hint == "model cache m3 is not Ready (PathConflict: 0 of 2 nodes hold a copy)"
    assert cache_not_ready(cache({"type": "Ready", "status": "True", "reason": "AllNodesReady"})) is None
    assert cache_not_ready(None) is None
    assert cache_not_ready(cache()) == "model cache m3 has not reported a Ready condition yet"
    why = "0/15 nodes are available: 15 node(s) didn't match Pod's node affinity/selector."
    waiting = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
    workload = Workload(desired=1, replicas=1, ready=0, updated=1, observed_current=True)
    stuck = workload.with_pods([_pod(waiting)], hint)
    assert stuck.unschedulable == f"1 of 1 pods cannot be scheduled: {why}; {hint}"
    # Only when pods do wait: a hint alone says nothing about them.
    assert workload.with_pods([_pod({"type": "PodScheduled", "status": "True"})], hint).unschedulable is None


def test_status_is_written_only_when_what_it_says_changes() -> None:
    done = Workload(desired=2, replicas=2, ready=2, updated=2, observed_current=True)
    body: dict[str, Any] = {"metadata": {"name": "m3", "generation": 2}, "status": {}}
    first = status_update(body, T0, done, None, {"engine": "vllm"}, "sel", [])
    assert first is not None and first["observedGeneration"] == 2 and first["plan"] == {"engine": "vllm"}
    assert "generatedSecrets" not in first  # none made, none recorded before: nothing to say
    settled = {**body, "status": first}
    assert status_update(settled, T1, done, None, {"engine": "vllm"}, "sel", []) is None  # a later clock alone
    # An invalid spec has no plan: the last one stays; a blocked reconcile leaves the Secrets record alone.
    blocked = status_update(settled, T1, done, Blocked("InvalidSpec", "spec.x: bad"), None, "sel", None)
    assert blocked is not None and blocked["plan"] == {"engine": "vllm"} and "generatedSecrets" not in blocked
    dropped = status_update({**body, "status": {**first, "generatedSecrets": ["k"]}}, T1, done, None, None, "sel", [])
    assert dropped is not None and dropped["generatedSecrets"] == []  # the Secret it no longer needs is recorded gone


def test_an_autoscaler_decision_is_recorded_when_it_changes_or_on_the_heartbeat() -> None:
    previous = {"desiredReplicas": 2, "action": "hold", "mode": "act", "panic": False, "applied": False, "time": T0}
    now = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    same = {**previous, "reason": "hold at 2: other numbers"}
    assert not worth_recording(previous, same, now + 60)
    assert worth_recording(previous, same, now + RECORD_HEARTBEAT_SECONDS)
    assert worth_recording(previous, {**same, "desiredReplicas": 3}, now + 60)
    assert worth_recording(previous, {**same, "unservableRequests": 2}, now + 60)
    assert worth_recording(previous, {**same, "timeToReady": {"source": "measured"}}, now + 60)
    assert worth_recording({}, same, now)
    # Metrics going away while the fleet holds, and coming back, are recorded: status must say why it holds.
    decided = {**previous, "terms": {"needReplicas": 2.4, "horizonSeconds": 20}}
    held = {**same, "reason": "hold: metrics unavailable (refused)", "terms": {"horizonSeconds": 20}}
    assert worth_recording(decided, held, now + 15)
    assert not worth_recording(held, {**held, "reason": "hold: metrics unavailable (timeout)"}, now + 15)
    assert worth_recording(held, {**decided, "reason": "hold at 2"}, now + 15)
    # The endpoint picker's held-request count becoming readable (or not) is recorded: at zero it is the way up.
    # Unread, a decision has None, which the status merge patch drops: the recorded one has no count.
    recorded_unread = {**previous, "scaleToZero": {"lastBusyTime": 0.0}}
    unread = {**same, "scaleToZero": {"heldRequests": None, "lastBusyTime": 0.0, "rule": None}}
    read = {**same, "scaleToZero": {**unread["scaleToZero"], "heldRequests": 0.0}}
    assert not worth_recording(recorded_unread, unread, now + 15)
    assert worth_recording(recorded_unread, read, now + 15) and worth_recording(read, unread, now + 15)
    assert not worth_recording(read, {**read, "scaleToZero": {**read["scaleToZero"], "heldRequests": 0.5}}, now + 15)
    # A gateway's series coming into use, and its bytes per token first measured, are recorded; its numbers are not.
    waiting = {"gateway": {"source": "prior", "window": "not yet used: its series have answered for 15s of 60s"}}
    used = {"gateway": {"source": "prior", "window": "rate window", "arrivingPromptTokensPerSecond": 900}}
    measured = {"gateway": {**used["gateway"], "source": "measured"}}
    before = {**previous, "prefillThroughput": waiting}
    assert not worth_recording(before, {**same, "prefillThroughput": waiting}, now + 60)
    assert worth_recording(before, {**same, "prefillThroughput": used}, now + 60)
    assert worth_recording({**previous, "prefillThroughput": used}, {**same, "prefillThroughput": measured}, now + 60)
    assert not worth_recording(
        {**previous, "prefillThroughput": measured},
        {**same, "prefillThroughput": {"gateway": {**measured["gateway"], "arrivingPromptTokensPerSecond": 1}}},
        now + 60,
    )


def test_a_child_kind_the_cluster_does_not_serve_blocks_with_its_reason() -> None:
    objects = [{"kind": "LeaderWorkerSet"}, {"kind": "Service"}]
    assert missing_api(objects, {"LeaderWorkerSet", "Service"}, 2) is None
    blocked = missing_api(objects, {"Service"}, 2)
    assert blocked is not None and blocked.reason == "LeaderWorkerSetNotInstalled" and "2" in blocked.message


def test_status_says_which_model_cache_the_pods_mount() -> None:
    from m3fleet.api.models import ModelCacheRef
    from m3fleet.engines.base import CacheMount

    mount = CacheMount(name="m3", path="/mnt/nvme/m3", node_label="cache.m3fleet.dev/llm.m3", required=True)
    ref = ModelCacheRef.model_validate({"name": "m3", "nodeAffinity": "Required"})
    assert model_cache_record(ref, mount) == {
        "name": "m3",
        "nodeAffinity": "Required",
        "nodeLabel": "cache.m3fleet.dev/llm.m3=ready",
        "path": "/mnt/nvme/m3",
    }
    assert model_cache_record(None, None) is None


def test_the_spec_says_how_metrics_are_read() -> None:
    """The rate window comes from the spec (a slow scrape needs a longer one); a multi-node fleet's worker pods
    count for their leaders, named after its LeaderWorkerSet (the resource's name)."""
    body = doc(autoscaling={"enabled": True, "prometheus": {"url": "http://prom:9090", "rateWindowSeconds": 240}})
    scaling = parse_resource(body).spec.autoscaling
    single = source_spec("llm", "m3", "sglang", scaling, False, Tls())
    assert (single.rate_window_seconds, single.workers_of) == (240.0, None)
    assert single.selector == (("namespace", "llm"), ("m3fleet_dev_name", "m3"))
    adapter = prometheus_adapter(source_spec("llm", "m3", "sglang", scaling, True, Tls()))
    assert isinstance(adapter, PrometheusAdapter)
    assert (adapter.rate_window, adapter.histogram_window, adapter.workers_of) == (240.0, 300.0, "m3")
    body["spec"]["autoscaling"]["prometheus"]["rateWindowSeconds"] = 600
    longest = prometheus_adapter(source_spec("llm", "m3", "vllm", parse_resource(body).spec.autoscaling, False, Tls()))
    assert isinstance(longest, PrometheusAdapter) and longest.histogram_window == 600.0  # never shorter than a rate


def test_the_cache_sees_what_engine_pods_mount_and_since_when_a_node_is_not_ready() -> None:
    def pod(node: str, path: str, phase: str = "Running", **labels: str) -> dict[str, Any]:
        volume = {"name": "model-cache", "hostPath": {"path": path, "type": "Directory"}}
        spec = {"nodeName": node, "volumes": [volume, {"name": "shm", "emptyDir": {}}]}
        return {"metadata": {"labels": labels}, "spec": spec, "status": {"phase": phase}}

    pods = [
        pod("n0", "/mnt/nvme/m3"),
        pod("n0", "/mnt/nvme/done", "Succeeded"),  # gone in all but name
        pod("n1", "/mnt/nvme/m3", **{"m3fleet.dev/cache": "m3"}),  # the cache's own Job
        {"metadata": {}, "spec": {"volumes": []}, "status": {"phase": "Pending"}},  # not scheduled
    ]
    assert mounts_of(pods) == {"n0": ["/mnt/nvme/m3"]}

    def node(status: str | None, **stamps: str) -> dict[str, Any]:
        conditions = [] if status is None else [{"type": "Ready", "status": status, **stamps}]
        return {"metadata": {"name": "n0"}, "status": {"conditions": conditions}}

    assert node_view(node("True", lastTransitionTime=T0), 5.0).not_ready_since is None
    assert node_view(node(None), 5.0).not_ready_since is None  # just registered
    since = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    assert node_view(node("Unknown", lastTransitionTime=T0), 5.0).not_ready_since == since
    assert node_view(node("False", lastHeartbeatTime=T0), 5.0).not_ready_since == since
    assert node_view(node("False"), 5.0).not_ready_since == 5.0

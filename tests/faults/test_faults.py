"""Faults on the real tier: the operator (its real entrypoint, `m3fleet run`) talks to the real kube-apiserver
through a fault-injecting proxy (faultproxy.py) that answers 409 / 429 with Retry-After / 5xx, expires and
cuts watches, and cuts one operator off. Each test says what must converge and that nothing is duplicated.

* The model cache's writes (finalizer, node labels, Jobs, status) and its lists and watches.
* A fleet's NetworkPolicy and PodDisruptionBudget write paths, and their watches.
* Two peers, the active one cut off: the standby takes over, the cut-off one stops writing (its Lease not
  renewed) and, back, writes nothing until it holds the Lease again: the two never write at the same time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster.cluster import (
    Cluster,
    OperatorProcess,
    assert_no_tracebacks,
    describe,
    eventually,
    is_dry_run,
)
from tests.support.cluster.faultproxy import FaultProxy
from tests.support.cluster.fleet import delete, renamed, rendered, sample, wait_ready, weight_volumes

NAMESPACE = "faults"
POOL_LABEL = "m3fleet.test/faults-pool"
NODE_LABEL = f"cache.m3fleet.dev/{NAMESPACE}.m3"
POOL = ("h200-4", "h200-5")
REVISION = "0123456789abcdef0123456789abcdef01234567"
CONTROL = ("kopfpeerings", "clusterkopfpeerings", "leases")  # who may run and write, not what the operator does


@pytest.fixture(scope="module", autouse=True)
def faults_namespace(chart: Cluster) -> None:
    """The chart installed (`cluster` is then the same Cluster), and this file's namespace with its volumes."""
    chart.namespace(NAMESPACE)
    weight_volumes(chart, NAMESPACE)
    chart.kubectl("create", "secret", "generic", "hf-token", "-n", NAMESPACE, "--from-literal=token=hf_x")


def model_cache(name: str) -> dict[str, Any]:
    source = {"huggingFace": {"repo": "MiniMaxAI/MiniMax-M3", "revision": REVISION}}
    source["huggingFace"]["tokenSecretRef"] = {"name": "hf-token", "key": "token"}
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3ModelCache",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "source": source,
            "nodes": {"accelerator": "h200", "nodeSelector": {POOL_LABEL: "a"}},
            "path": "/mnt/nvme/m3fleet/faults",
            "deleteFilesOnRemoval": True,
        },
    }


def labelled(cluster: Cluster, node: str, key: str = NODE_LABEL) -> str | None:
    labels = ((cluster.get("node", node) or {}).get("metadata") or {}).get("labels") or {}
    value: str | None = labels.get(key)
    return value


def created(operator: OperatorProcess, resource: str) -> list[str]:
    """The objects of `resource` the apiserver created for the operator (each name once per creation)."""
    return [
        str((e.get("objectRef") or {}).get("name"))
        for e in operator.requests()
        if e.get("verb") == "create"
        and (e.get("objectRef") or {}).get("resource") == resource
        and (e.get("responseStatus") or {}).get("code") == 201
        and not is_dry_run(e)
    ]


def test_the_model_cache_converges_under_faults_and_stages_each_node_once(
    cluster: Cluster, proxy: FaultProxy, operator: OperatorProcess
) -> None:
    """Every write of the cache controller fails once (409, 429 with Retry-After, 500, 503), a Job create and
    a status write fail *after* the apiserver acted (the answer lost), its lists fail, and its watches expire
    and are cut: the pool is staged and labelled, a node joining while every watch is down is staged too (no
    lost update), each node gets exactly one staging Job, and removal releases the finalizer and the labels."""
    writes = [
        proxy.fail("patch", "minimaxm3modelcaches", 409),  # the finalizer
        proxy.fail("create", "jobs", 500, forward=True),  # created; the operator hears 500 and must not re-create
        proxy.fail("create", "jobs", 429, retry_after=1),
        proxy.fail("patch", "nodes", 409),
        proxy.fail("patch", "nodes", 503),
        proxy.fail("patch", "minimaxm3modelcaches", 500, subresource="status", forward=True),
        proxy.fail("patch", "minimaxm3modelcaches", 429, subresource="status", retry_after=1),
    ]
    reads = [proxy.fail("list", "nodes", 500), proxy.fail("list", "jobs", 503)]
    label_node = ["label", "node", POOL[0], f"{POOL_LABEL}=a", "--overwrite"]
    cluster.kubectl(*label_node)
    try:
        cluster.apply(model_cache("m3"))
        eventually(f"{POOL[0]} labelled ready", lambda: labelled(cluster, POOL[0]) == "ready", 120)

        # Every watch is cut and comes back "410 Gone" (history compacted): the operator must list again, and
        # find there the node that joined the pool meanwhile.
        gone = [proxy.expire(resource, times=2) for resource in ("nodes", "jobs", "minimaxm3modelcaches")]
        proxy.drop_watches()
        cluster.kubectl("label", "node", POOL[1], f"{POOL_LABEL}=a", "--overwrite")
        eventually(
            f"{POOL[1]}, joined while watches were down, labelled ready", lambda: labelled(cluster, POOL[1]), 120
        )
        eventually("both nodes ready", lambda: all(labelled(cluster, n) == "ready" for n in POOL), 120)
        status = eventually(
            "status says 2 nodes ready",
            lambda: ((cluster.get("m3cache", "m3", NAMESPACE) or {}).get("status") or {}).get("nodes"),
            60,
        )
        assert len(status) == 2, status
        jobs = created(operator, "jobs")
        assert len(jobs) == len(set(jobs)) == len(POOL), f"staging Jobs created: {jobs}"
        assert [f.hits for f in writes] == [1] * len(writes), [str(c) for c in proxy.calls()]
        assert all(f.hits for f in reads), [str(c) for c in proxy.calls("list")]
        assert all(f.hits for f in gone), [str(c) for c in proxy.calls("watch")]

        # Removal under faults: the cleanup Jobs' creation and the finalizer's release fail once each.
        removal = [
            proxy.fail("create", "jobs", 500, forward=True),
            proxy.fail("patch", "minimaxm3modelcaches", 503),
            proxy.fail("patch", "nodes", 500),
        ]
        cluster.kubectl("delete", "m3cache", "m3", "-n", NAMESPACE, "--wait=false")
        eventually("the cache removed", lambda: cluster.get("m3cache", "m3", NAMESPACE) is None, 180)
        assert [labelled(cluster, n) for n in POOL] == [None, None]
        assert all(f.hits == 1 for f in removal), [str(c) for c in proxy.calls()]
        cleanups = created(operator, "jobs")[len(POOL) :]
        assert len(cleanups) == len(set(cleanups)) == len(POOL), f"cleanup Jobs created: {cleanups}"
        assert_no_tracebacks(operator)
    finally:
        cluster.kubectl("delete", "m3cache", "m3", "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        for node in POOL:
            cluster.kubectl("label", "node", node, f"{POOL_LABEL}-", check=False)


def rendered_kind(document: dict[str, Any], kind: str, tmp: Path) -> dict[str, Any]:
    """What `m3fleet render` says the operator creates of `kind` for the document."""
    [found] = [d for d in rendered(document, tmp) if d.get("kind") == kind]
    return found


def live_spec(cluster: Cluster, kind: str, name: str) -> Any:
    return (cluster.get(kind, name, NAMESPACE) or {}).get("spec")


def test_network_policy_and_disruption_budget_converge_under_faults(
    cluster: Cluster, proxy: FaultProxy, operator: OperatorProcess, tmp_path: Any
) -> None:
    """Their applies fail (409, 429 with Retry-After, 500 after the apiserver acted, 503), their watches expire
    and are cut, and a change of spec.network lands while the NetworkPolicy's watch is down; a hand edit made
    then is undone from the re-list."""
    name = "guarded"
    document = renamed(sample("vllm-h200-tp8"), name, NAMESPACE)
    policy = rendered_kind(document, "NetworkPolicy", tmp_path)
    budget = rendered_kind(document, "PodDisruptionBudget", tmp_path)
    faults = [
        proxy.fail("patch", "networkpolicies", 409),
        proxy.fail("patch", "networkpolicies", 429, retry_after=1),
        proxy.fail("patch", "poddisruptionbudgets", 500, forward=True),
        proxy.fail("patch", "poddisruptionbudgets", 503),
    ]
    try:
        cluster.apply(document)
        wait_ready(cluster, name, NAMESPACE)
        policy_name, budget_name = policy["metadata"]["name"], budget["metadata"]["name"]
        eventually(
            "the NetworkPolicy as rendered", lambda: live_spec(cluster, "networkpolicy", policy_name) == policy["spec"]
        )
        eventually("the PDB as rendered", lambda: live_spec(cluster, "pdb", budget_name) == budget["spec"])
        assert [f.hits for f in faults] == [1] * len(faults), [str(c) for c in proxy.calls()]

        gone = [proxy.expire(r, times=2) for r in ("networkpolicies", "poddisruptionbudgets", "minimaxm3deployments")]
        cut = proxy.cut("networkpolicies", after=0, times=2)
        again = proxy.fail("patch", "networkpolicies", 500)
        proxy.drop_watches()
        document["spec"]["network"] = {"allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "gateway"}}}]}
        cluster.apply(document)
        changed = rendered_kind(document, "NetworkPolicy", tmp_path)
        assert changed["spec"] != policy["spec"]
        eventually(
            "the changed NetworkPolicy",
            lambda: live_spec(cluster, "networkpolicy", policy_name) == changed["spec"],
            120,
        )
        proxy.drop_watches("poddisruptionbudgets")
        cluster.kubectl(
            "patch", "pdb", budget_name, "-n", NAMESPACE, "--type=merge", "-p", '{"spec":{"maxUnavailable":3}}'
        )
        eventually("the hand edit undone", lambda: live_spec(cluster, "pdb", budget_name) == budget["spec"], 120)
        assert again.hits == 1 and cut.hits >= 1 and all(f.hits for f in gone), [str(c) for c in proxy.calls("watch")]
        assert_no_tracebacks(operator)
    finally:
        delete(cluster, name, NAMESPACE)


PRIORITY = "M3FLEET_PEERING_PRIORITY"
# The chart's peering.lifetimeSeconds at its floor: the standby waits out the silent peer's record (and the Lease)
# in about 35 s instead of kopf's 60 s + 15 s; the order of fencing, takeover and return is the same.
LIFETIME = {"M3FLEET_PEERING_LIFETIME_SECONDS": "20"}


def test_a_cut_off_peer_is_fenced_and_the_standby_takes_over(cluster: Cluster, tmp_path: Any) -> None:
    """kopf's peering alone would leave the cut-off peer active (it never hears that its record expired) and,
    back, both active at once. With the Lease: it stops within its renew deadline, the standby takes over once
    kopf's record of it expires, and back it writes nothing until the standby has let the Lease go."""
    cluster.upgrade_chart(peering__enabled=True)
    name = "fenced"
    document = renamed(sample("vllm-h200-tp8"), name, NAMESPACE)
    with (
        FaultProxy(cluster.control_plane, cluster.workdir).running() as to_high,
        FaultProxy(cluster.control_plane, cluster.workdir).running() as to_low,
        cluster.operator(
            "--all-namespaces", name="operator-high", env={PRIORITY: "200", **LIFETIME}, server=to_high.server
        ) as high,
        cluster.operator(
            "--all-namespaces", name="operator-low", env={PRIORITY: "100", **LIFETIME}, server=to_low.server
        ) as low,
    ):
        try:
            cluster.apply(document)  # the gates start with the first event
            eventually("the high-priority peer leads", lambda: "Leading" in high.log(), 60)
            eventually("the low-priority peer pauses", lambda: "Pausing" in low.log(), 60)
            eventually("both peers' records carry the lifetime set", lambda: _lifetimes(cluster).count(20) == 2, 30)
            wait_ready(cluster, name, NAMESPACE)

            logged = len(high.log())
            to_high.cut_off()
            cut_at = high.mark()
            eventually("the cut-off peer fences itself", lambda: "fenced" in high.log()[logged:], 30)
            cluster.kubectl("scale", f"m3d/{name}", "-n", NAMESPACE, "--replicas=2")
            replicas = lambda: (cluster.get("deployment", name, NAMESPACE) or {})["spec"]["replicas"]  # noqa: E731
            eventually("the standby takes over and applies the change", lambda: replicas() == 2, 150)
            assert "Leading" in low.log()
            assert high.writes(high.requests_since(cut_at)) == [], "a cut-off peer wrote"  # its watches' ends only

            back_at = high.mark()
            to_high.restore()
            eventually("the returning peer leads again", lambda: high.log().count("Leading") >= 2, 120)
            eventually("the standby stands by again", lambda: "standing by" in low.log(), 30)
            cluster.kubectl("scale", f"m3d/{name}", "-n", NAMESPACE, "--replicas=1")
            eventually("the returning peer applies the next change", lambda: replicas() == 1, 60)
            assert replicas() == 1

            # Never both: every write the returning peer made (its Lease aside) follows the standby's last.
            high_writes = _timed_writes(high, back_at)
            low_writes = _timed_writes(low, back_at)
            assert high_writes, "the returning peer wrote nothing"
            assert not low_writes or max(t for t, _ in low_writes) < min(t for t, _ in high_writes), (
                f"both peers wrote at once:\nhigh: {high_writes}\nlow: {low_writes}"
            )
        finally:
            delete(cluster, name, NAMESPACE, wait=False)
    cluster.upgrade_chart(peering__enabled=False)


def _lifetimes(cluster: Cluster) -> list[int]:
    """The lifetime in each peer's record of the cluster-wide peering object (kopf writes its own setting there)."""
    records = ((cluster.get("clusterkopfpeering", "m3fleet") or {}).get("status") or {}).values()
    return [int(r.get("lifetime", 0)) for r in records if isinstance(r, dict)]


def _timed_writes(operator: OperatorProcess, since: int) -> list[tuple[str, str]]:
    events = operator.requests_since(since)
    return sorted(
        (str(e.get("requestReceivedTimestamp")), describe(e))
        for e in events
        if e.get("verb") in ("create", "update", "patch", "delete")
        and not is_dry_run(e)
        and (e.get("objectRef") or {}).get("resource") not in CONTROL
    )


def test_deleting_a_namespace_with_a_fleet_and_a_cache_leaves_no_finalizer_and_no_label(cluster: Cluster) -> None:
    """`kubectl delete namespace` with a staged cache and a fleet in it: the namespace goes, and so do the cache's
    labels. (No cleanup Job can run in a namespace being deleted: the copies stay, and the log says where.)"""
    team = cluster.namespace("teardown")
    weight_volumes(cluster, team)
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", team, "--from-literal=token=hf_x")
    body = model_cache("m3")
    body["metadata"]["namespace"] = team
    label = f"cache.m3fleet.dev/{team}.m3"
    cluster.kubectl("label", "node", POOL[0], f"{POOL_LABEL}=a", "--overwrite")
    with cluster.operator("--all-namespaces", "--standalone", name="operator-teardown", allow_forbidden=True) as op:
        try:
            cluster.apply(body)
            cluster.apply(renamed(sample("vllm-h200-tp8"), "doomed", team))
            eventually("the cache staged", lambda: labelled(cluster, POOL[0], label) == "ready", 120)
            wait_ready(cluster, "doomed", team)
            cluster.kubectl("delete", "namespace", team, "--wait=false")
            eventually("the namespace gone", lambda: cluster.get("namespace", team) is None, 180)
            assert labelled(cluster, POOL[0], label) is None
            assert f"the files in /mnt/nvme/m3fleet/faults stay on {POOL[0]}" in op.log()
            assert_no_tracebacks(op)
            # The apiserver refuses new objects in a namespace being deleted (Forbidden): nothing else may be.
            outside = [f for f in op.forbidden() if f.split(" ")[1].split("/")[1:2] != [team]]  # "verb res/ns/name"
            assert outside == []
        finally:
            cluster.kubectl("label", "node", POOL[0], f"{POOL_LABEL}-", check=False)

"""A fleet's write paths under faults, on the real tier: the operator (`m3fleet run`) talks to the real kube-apiserver
through the fault proxy (tests/support/cluster/faultproxy.py). Ported from the emulator's fault tests.

* Every kind the operator writes for a fleet (each child's apply, the pruning delete, the SSH Secret's create, the
  status write, its Event) fails once, each with another code (409, 422, 429 with Retry-After, 500, 503, a lost
  answer), and the watches expire meanwhile: each fleet converges to what `m3fleet render` says, and no child is
  created twice.
* A throttled apply is retried after the server's Retry-After, not after the first backoff step.
* A rejected apply (422, as an admission webhook answers) is reported as Degraded/ApplyFailed and leaves the running
  children, and the Secret they mount, in place; the user's next change lands at once.
* An operator killed between its applies and its status write: the next one finishes and never makes a new key.
* A watch that ends costs no write.
"""

from __future__ import annotations

import base64
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import dra
from tests.support.cluster.cluster import Cluster, OperatorProcess, assert_no_tracebacks, eventually, is_dry_run
from tests.support.cluster.faultproxy import Fault, FaultProxy
from tests.support.cluster.fleet import condition, delete, renamed, rendered, sample, wait_ready, weight_volumes

NAMESPACE = "faults"  # the chart grants the operator Secrets here (the SSH key of multi-node TensorRT-LLM)
TWO_NODES = {"context": {"minSequencesAtMaxLen": 8}}  # more full-length sequences than one H200 node holds
CHILD_RESOURCES = ("deployments", "leaderworkersets", "services", "configmaps", "secrets", "computedomains")


@pytest.fixture(scope="module", autouse=True)
def faults_namespace(chart: Cluster) -> None:
    chart.namespace(NAMESPACE)
    weight_volumes(chart, NAMESPACE)
    dra.install(chart)  # GB200 groups need the ComputeDomain API


def applied(cluster: Cluster, name: str, generation: int | None = None) -> bool:
    """The operator has applied this generation of the spec and reports no fault (its pods may still start)."""
    body = cluster.get("m3d", name, NAMESPACE) or {}
    observed = (body.get("status") or {}).get("observedGeneration")
    wanted = generation or (body.get("metadata") or {}).get("generation")
    return observed == wanted and condition(body, "Degraded").get("reason") == "AsExpected"


def children_as_rendered(cluster: Cluster, document: dict[str, Any], tmp: Path) -> bool:
    return all(cluster.get(d["kind"].lower(), d["metadata"]["name"], NAMESPACE) for d in rendered(document, tmp))


def creations(operator: OperatorProcess) -> list[str]:
    """Each child the apiserver created for the operator (a create, or a server-side apply that created)."""
    return [
        f"{ref.get('resource')}/{ref.get('name')}"
        for e in operator.requests()
        if (ref := e.get("objectRef") or {}).get("resource") in CHILD_RESOURCES
        and e.get("verb") in ("create", "patch")
        and (e.get("responseStatus") or {}).get("code") == 201
        and not is_dry_run(e)
    ]


def trtllm_gb200(name: str) -> dict[str, Any]:
    """Two GB200 nodes a replica: a LeaderWorkerSet, its engine ConfigMap, ComputeDomain and generated SSH Secret."""
    return renamed(sample("trtllm-gb200-2x4-tep"), name, NAMESPACE)


def test_every_write_path_fails_once_and_each_fleet_converges_with_nothing_created_twice(
    cluster: Cluster, proxy: FaultProxy, operator: OperatorProcess, tmp_path: Path
) -> None:
    """A TensorRT-LLM GB200 group (LeaderWorkerSet, ConfigMap, ComputeDomain, Service, the SSH Secret), and a vLLM
    Deployment that grows into a two-node LeaderWorkerSet (its Deployment pruned)."""
    group, grown = trtllm_gb200("w-group"), renamed(sample("vllm-h200-tp8"), "w-grown", NAMESPACE)
    real = {"namespace": NAMESPACE, "dry_run": False}
    faults: dict[str, Fault] = {
        "apply ConfigMap": proxy.fail("patch", "configmaps", 409, **real),
        "apply ComputeDomain": proxy.fail("patch", "computedomains", 422, **real),
        "apply LeaderWorkerSet": proxy.fail("patch", "leaderworkersets", 429, retry_after=1, **real),
        "apply Service": proxy.fail("patch", "services", 500, **real),
        "apply Deployment": proxy.fail("patch", "deployments", 503, **real),
        "prune Deployment": proxy.fail("delete", "deployments", 500, **real),
        "create Secret": proxy.fail("create", "secrets", 503, **real),
        "write status": proxy.fail("patch", "minimaxm3deployments", 500, subresource="status", forward=True, **real),
        "post Event": proxy.fail("create", "events", 429, retry_after=1, **real),
    }
    try:
        cluster.apply(group)
        cluster.apply(grown)
        for name in ("w-group", "w-grown"):
            eventually(f"{name} applied", lambda name=name: applied(cluster, name), 120)
        # Its history compacted, every watch ends with 410 Gone while the fleet grows: the operator lists again.
        watched = ("minimaxm3deployments", "deployments", "leaderworkersets")
        gone = [proxy.expire(resource, times=2) for resource in watched]
        proxy.drop_watches()
        grown["spec"].update(TWO_NODES)
        cluster.apply(grown)
        eventually("w-grown applied as a group", lambda: applied(cluster, "w-grown", generation=2), 120)
        eventually("its Deployment pruned", lambda: cluster.get("deployment", "w-grown", NAMESPACE) is None, 60)
        for document in (group, grown):
            name = document["metadata"]["name"]
            eventually(f"{name}'s children as rendered", lambda d=document: children_as_rendered(cluster, d, tmp_path))
        assert cluster.get("secret", "w-group-mpi-ssh", NAMESPACE) is not None
        assert {what: f.hits for what, f in faults.items()} == dict.fromkeys(faults, 1), [str(c) for c in proxy.calls()]
        assert all(f.hits for f in gone), [str(c) for c in proxy.calls("watch")]
        made = creations(operator)
        assert len(made) == len(set(made)), f"created twice: {sorted(made)}"
        assert_no_tracebacks(operator)
    finally:
        delete(cluster, "w-group", NAMESPACE, wait=False)
        delete(cluster, "w-grown", NAMESPACE, wait=False)


def test_retry_after_is_honoured(cluster: Cluster, proxy: FaultProxy, operator: OperatorProcess) -> None:
    """The first apply of the Deployment is throttled with Retry-After: 3: the retry comes after 3 s, not after the
    work queue's first backoff step (1 s)."""
    fault = proxy.fail("patch", "deployments", 429, retry_after=3, namespace=NAMESPACE, dry_run=False)
    name = "throttled"
    try:
        cluster.apply(renamed(sample("vllm-h200-tp8"), name, NAMESPACE))
        eventually("the Deployment applied", lambda: cluster.get("deployment", name, NAMESPACE), 60)
        applies = [c for c in proxy.calls("patch", "deployments") if c.name == name and not c.dry_run]
        assert applies[0].status == 429 and applies[1].status in (200, 201), [str(c) for c in applies]  # 201: created
        waited = applies[1].at - applies[0].at
        assert fault.hits == 1 and 2.9 <= waited < 6, waited
        wait_ready(cluster, name, NAMESPACE)
    finally:
        delete(cluster, name, NAMESPACE, wait=False)


def degraded_reason(cluster: Cluster, name: str) -> str | None:
    reason: str | None = condition(cluster.get("m3d", name, NAMESPACE), "Degraded").get("reason")
    return reason


def test_a_rejected_update_is_reported_and_its_fix_applies_at_once(
    cluster: Cluster, proxy: FaultProxy, operator: OperatorProcess
) -> None:
    """The apiserver rejects the new Deployment (422, as an admission webhook would): Degraded/ApplyFailed naming
    the answer, the running Deployment untouched. The user's next change is applied at once, not after a backoff."""
    name = "rejected"
    document = renamed(sample("vllm-h200-tp8"), name, NAMESPACE)
    try:
        cluster.apply(document)
        wait_ready(cluster, name, NAMESPACE)
        running = cluster.get("deployment", name, NAMESPACE)
        assert running is not None
        rejection = proxy.fail("patch", "deployments", 422, namespace=NAMESPACE, dry_run=False, times=None)
        document["spec"].setdefault("engine", {})["extraArgs"] = ["--max-num-seqs=64"]
        cluster.apply(document)
        eventually("Degraded/ApplyFailed", lambda: degraded_reason(cluster, name) == "ApplyFailed", 60)
        assert "422" in condition(cluster.get("m3d", name, NAMESPACE), "Degraded")["message"]
        eventually("retried with a backoff", lambda: rejection.hits >= 3, 30)
        after = cluster.get("deployment", name, NAMESPACE)
        assert after is not None and after["metadata"]["resourceVersion"] == running["metadata"]["resourceVersion"]
        proxy.clear()
        document["spec"]["engine"]["extraArgs"] = ["--max-num-seqs=32"]
        fixed = time.monotonic()
        cluster.apply(document)
        eventually("the fix applied", lambda: applied(cluster, name, generation=3), 30, 0.1)
        assert time.monotonic() - fixed < 5
        container = (cluster.get("deployment", name, NAMESPACE) or {})["spec"]["template"]["spec"]["containers"][0]
        assert "--max-num-seqs=32" in [*container.get("command", []), *container.get("args", [])]
    finally:
        delete(cluster, name, NAMESPACE, wait=False)


def test_a_rejected_workload_keeps_the_secret_the_running_group_mounts(
    cluster: Cluster, proxy: FaultProxy, operator: OperatorProcess
) -> None:
    """A GB200 TensorRT-LLM group mounts its generated SSH Secret. Changed to one H200 node (no Secret needed) and
    its new Deployment rejected, the LeaderWorkerSet keeps running: its Secret must stay. Both go once the
    Deployment is applied."""
    name = "keeps-key"
    document = trtllm_gb200(name)
    try:
        cluster.apply(document)
        eventually("the group applied", lambda: applied(cluster, name), 120)
        [secret] = (cluster.get("m3d", name, NAMESPACE) or {})["status"]["generatedSecrets"]
        rejection = proxy.fail("patch", "deployments", 422, namespace=NAMESPACE, dry_run=False, times=None)
        document["spec"]["accelerator"] = "h200"
        document["spec"]["parallelism"] = {"strategy": "tp-ep", "tensorParallelSize": 8}
        cluster.apply(document)
        eventually("Degraded/ApplyFailed", lambda: degraded_reason(cluster, name) == "ApplyFailed", 60)
        eventually("retried", lambda: rejection.hits >= 2, 30)
        assert cluster.get("secret", secret, NAMESPACE) is not None, "the running group's Secret was deleted"
        assert cluster.get("leaderworkerset", name, NAMESPACE) is not None
        proxy.clear()
        eventually("the Deployment applied", lambda: cluster.get("deployment", name, NAMESPACE), 60)
        left = lambda: cluster.get("secret", secret, NAMESPACE) or cluster.get("leaderworkerset", name, NAMESPACE)  # noqa: E731
        eventually("the group and its Secret gone", lambda: not left(), 60)
    finally:
        delete(cluster, name, NAMESPACE, wait=False)


def test_an_operator_killed_between_its_applies_and_its_status_write_is_finished_by_the_next(
    cluster: Cluster, proxy: FaultProxy
) -> None:
    """Every status write fails, the operator is killed (SIGKILL) with the children applied; the next one (whose
    first dry-run look at the LeaderWorkerSet fails once too) writes the status, creates nothing again and keeps
    the generated SSH key, which no log shows."""
    name = "killed"
    secret = f"{name}-mpi-ssh"
    status = proxy.fail("patch", "minimaxm3deployments", 500, subresource="status", namespace=NAMESPACE, times=None)
    try:
        with cluster.operator("--all-namespaces", "--standalone", name="operator-killed", server=proxy.server) as first:
            cluster.apply(trtllm_gb200(name))
            eventually("status writes failing", lambda: status.hits >= 2, 120)
            key = eventually("the SSH Secret", lambda: cluster.get("secret", secret, NAMESPACE), 30)
            assert cluster.get("leaderworkerset", name, NAMESPACE) is not None
            assert "status" not in (cluster.get("m3d", name, NAMESPACE) or {})
            assert first.process.popen is not None
            os.kill(first.process.popen.pid, signal.SIGKILL)
            first.process.popen.wait(10)
        proxy.clear()
        look = proxy.fail("patch", "leaderworkersets", 500, namespace=NAMESPACE, dry_run=True)
        with cluster.operator("--all-namespaces", "--standalone", name="operator-next", server=proxy.server) as second:
            eventually("the next operator writes the status", lambda: applied(cluster, name), 120)
            assert look.hits == 1
            after = cluster.get("secret", secret, NAMESPACE)
            assert after is not None and after["metadata"]["uid"] == key["metadata"]["uid"]
            assert after["data"] == key["data"]
            made = creations(first) + creations(second)
            assert len(made) == len(set(made)), f"created twice: {sorted(made)}"
            private = base64.b64decode(key["data"]["id_ed25519"]).decode()
            for log in (first.log(), second.log()):
                shown = [s for s in [key["data"]["id_ed25519"], *private.splitlines()[1:-1]] if s in log]
                assert not shown, "a log shows the SSH key"
            assert_no_tracebacks(second)
    finally:
        delete(cluster, name, NAMESPACE, wait=False)


def test_a_watch_that_ends_costs_no_write(cluster: Cluster, proxy: FaultProxy, operator: OperatorProcess) -> None:
    """Every watch is closed under a converged fleet: the operator watches again (from where it was) and writes
    nothing, its children unchanged."""
    name = "rewatched"
    try:
        cluster.apply(renamed(sample("vllm-h200-tp8"), name, NAMESPACE))
        wait_ready(cluster, name, NAMESPACE)
        time.sleep(5)  # the status writes of the rollout are over
        mark = operator.mark()
        proxy.drop_watches()
        watches = lambda: [e for e in operator.requests_since(mark) if e.get("verb") == "watch"]  # noqa: E731
        eventually("the operator watches again", watches, 60)
        time.sleep(10)
        assert operator.writes(operator.requests_since(mark)) == []
        assert_no_tracebacks(operator)
    finally:
        delete(cluster, name, NAMESPACE, wait=False)

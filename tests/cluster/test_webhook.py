"""Planner-backed admission on a real apiserver: the chart's ValidatingWebhookConfiguration (its own CA and
serving certificate, `webhook.url` on loopback: the operator is a host process) and `m3fleet run --webhook-*`.

`kubectl apply` of a spec only the planner refuses fails with the planner's message (what `m3fleet plan`
prints); a valid spec is admitted; an update to a refused spec is refused and what runs is untouched; with the
operator down nothing but MiniMaxM3Deployments is concerned and they behave as the failure policy says;
deletion is never held up; a paused standby serves the webhook as well as the active operator.
"""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.cluster.cluster import BIN, RELEASE, Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import (
    condition,
    delete,
    pods,
    renamed,
    sample,
    wait_ready,
    weight_volumes,
    write_manifest,
)

NAMESPACE = "webhook"
DENIED = 'admission webhook "validate.minimaxm3deployments.m3fleet.dev" denied the request: '


@pytest.fixture(scope="module")
def fleet(chart: Cluster) -> Cluster:
    chart.namespace(NAMESPACE)
    weight_volumes(chart, NAMESPACE)
    return chart


def valid(name: str) -> dict[str, Any]:
    return renamed(sample("vllm-h200-tp8"), name, NAMESPACE)


def kv_does_not_fit(name: str) -> dict[str, Any]:
    """Admitted by the CRD; the planner refuses it: two 512k sequences in BF16 KV on one TP8 H200 node."""
    document = valid(name)
    document["spec"]["parallelism"] = {"strategy": "tp", "tensorParallelSize": 8}
    document["spec"]["context"] = {"maxModelLen": 524288, "kvCacheDtype": "bf16", "minSequencesAtMaxLen": 2}
    return document


def gpus_beyond_the_pool(name: str) -> dict[str, Any]:
    """Admitted by the CRD; the planner refuses it: 9 GPUs a pod on 8-GPU H200 nodes."""
    document = valid(name)
    document["spec"]["nodePool"] = {"extraResources": {"nvidia.com/gpu": 9}}
    return document


def trtllm_language_model_only(name: str) -> dict[str, Any]:
    document = renamed(sample("trtllm-gb200-2x4-tep"), name, NAMESPACE)
    document["spec"]["model"]["languageModelOnly"] = True
    return document


def owned_flag(name: str) -> dict[str, Any]:
    """Admitted by the CRD; the renderer refuses it: a flag the plan owns, in extraArgs."""
    document = valid(name)
    document["spec"]["engine"]["extraArgs"] = ["--block-size", "16"]
    return document


def planner_message(path: Path, name: str) -> str:
    """What `m3fleet plan -f PATH` says about the one resource in PATH (without its `error: file#0 (Kind/name): `)."""
    result = subprocess.run(
        [str(BIN / "m3fleet"), "plan", "-f", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    prefix = f"error: {path}#0 (MiniMaxM3Deployment/{name}): "
    assert result.returncode == 2 and result.stderr.startswith(prefix), result.stderr
    return result.stderr.removeprefix(prefix).rstrip("\n")


def serving(cluster: Cluster, tmp: Path) -> bool:
    """The webhook answers: a dry run of a refused spec is denied."""
    path = write_manifest(tmp, kv_does_not_fit("probe"))
    result = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-f", str(path), check=False)
    return DENIED in result.stderr


@pytest.fixture()
def operator(fleet: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator as the chart's pod runs it, webhook included (serving certificate from the chart)."""
    args = ["--all-namespaces", "--standalone", *fleet.webhook_args()]
    with fleet.operator(*args, name="operator-webhook") as running:
        eventually("the webhook answering", lambda: serving(fleet, tmp_path), 60)
        yield running


@pytest.mark.parametrize(
    "make",
    [kv_does_not_fit, gpus_beyond_the_pool, trtllm_language_model_only, owned_flag],
    ids=["kv-cache", "gpus", "trtllm-lmo", "owned-flag"],
)
def test_a_spec_the_planner_refuses_is_refused_at_apply_with_its_message(
    fleet: Cluster, operator: OperatorProcess, tmp_path: Path, make: Any
) -> None:
    document = make("refused")
    path = write_manifest(tmp_path, document)
    message = planner_message(path, "refused")
    for verb in (("apply", "--server-side"), ("create",)):
        result = fleet.kubectl(*verb, "-f", str(path), check=False)
        assert result.returncode != 0, result.stdout
        assert DENIED + message in result.stderr, result.stderr
    assert fleet.get("m3d", "refused", NAMESPACE) is None


def _review(request: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _request(**changes: Any) -> dict[str, Any]:
    """A CREATE of a valid resource as the API server sends it, with `changes` applied (None: key removed)."""
    request: dict[str, Any] = {
        "uid": "0f0e0d0c-malformed",
        "kind": {"group": "m3fleet.dev", "version": "v1alpha1", "kind": "MiniMaxM3Deployment"},
        "resource": {"group": "m3fleet.dev", "version": "v1alpha1", "resource": "minimaxm3deployments"},
        "operation": "CREATE",
        "userInfo": {"username": "someone"},
        "object": valid("malformed"),
    }
    request.update(changes)
    return {k: v for k, v in request.items() if v is not None}


# Bodies no API server sends; each must get a well-formed answer: a 400 (or aiohttp's 413 past its 1 MiB
# limit) when the body names no request uid, else a denial of that request.
MALFORMED: dict[str, tuple[bytes, int]] = {
    "empty": (b"", 400),
    "not json": (b"{not json", 400),
    "not utf-8": (b'{"kind": "' + bytes([0xFF, 0xFE]) + b'"}', 400),
    "nested past the parser": (b"[" * 100_000 + b"]" * 100_000, 400),
    "a list": (b"[]", 400),
    "a number": (b"8", 400),
    "wrong apiVersion": (json.dumps({**_review(_request()), "apiVersion": "admission.k8s.io/v1beta2"}).encode(), 400),
    "wrong kind": (json.dumps({**_review(_request()), "kind": "TokenReview"}).encode(), 400),
    "no request": (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), 400),
    "request not an object": (json.dumps(_review("x")).encode(), 400),  # type: ignore[arg-type]
    "no uid": (json.dumps(_review(_request(uid=None))).encode(), 400),
    "uid not a string": (json.dumps(_review(_request(uid=7))).encode(), 400),
    "huge": (b'{"pad": "' + b"x" * (2 * 1024 * 1024) + b'"}', 413),
    "object a string": (json.dumps(_review(_request(object="spec"))).encode(), 200),
    "object a list": (json.dumps(_review(_request(object=[1, 2]))).encode(), 200),
    "metadata a string": (json.dumps(_review(_request(object={"metadata": "x"}))).encode(), 200),
    "no object at all": (json.dumps(_review(_request(object=None))).encode(), 200),
    "no resource": (json.dumps(_review(_request(resource=None))).encode(), 200),
    "resource not ours": (
        json.dumps(_review(_request(resource={"group": "", "version": "v1", "resource": "pods"}))).encode(),
        200,
    ),
    "no userInfo": (json.dumps(_review(_request(userInfo=None))).encode(), 200),
    "operation a number": (json.dumps(_review(_request(operation=1))).encode(), 200),
}


def _post(port: int, body: bytes) -> tuple[int, dict[str, Any]]:
    """POST `body` to the webhook's path as the API server would (TLS; the certificate is not what is tested)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
    try:
        connection.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read().decode("utf-8", errors="replace")
    finally:
        connection.close()
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {"text": text}
    return response.status, answer if isinstance(answer, dict) else {"value": answer}


def test_malformed_admission_reviews_get_an_answer_and_never_crash_the_webhook(
    fleet: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    port = fleet.webhook_ports[RELEASE]
    for case, (body, expected) in MALFORMED.items():
        status, answer = _post(port, body)
        assert status == expected, f"{case}: HTTP {status} {answer}"
        if status == 400:
            assert answer.get("message"), f"{case}: a 400 without a message: {answer}"
        if status == 200:
            response = answer["response"]
            assert response["uid"] == "0f0e0d0c-malformed" and response["allowed"] is False, f"{case}: {answer}"
            assert response["status"]["code"] == 400 and response["status"]["message"], f"{case}: {answer}"
    # a well-formed review still gets its verdict, and the real apiserver path still works
    status, answer = _post(port, json.dumps(_review(_request())).encode())
    assert status == 200 and answer["response"]["allowed"] is True, answer
    assert serving(fleet, tmp_path)
    assert "Traceback" not in operator.log(), operator.log()[-4000:]


def test_a_spec_naming_a_model_cache_not_yet_applied_is_admitted(
    fleet: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """GitOps may apply the MiniMaxM3ModelCache after the deployment: the webhook cannot look it up, and admits; the
    operator says ModelCacheNotFound in status until it exists."""
    name = "cache-later"
    document = valid(name)
    document["spec"]["model"]["cacheRef"] = {"name": "not-yet"}
    result = fleet.kubectl("apply", "--server-side", "-f", str(write_manifest(tmp_path, document)), check=False)
    try:
        assert result.returncode == 0, result.stderr

        def reason() -> str:
            return str(condition(fleet.get("m3d", name, NAMESPACE), "Degraded").get("reason"))

        eventually("Degraded ModelCacheNotFound", lambda: reason() == "ModelCacheNotFound", 30)
    finally:
        delete(fleet, name, NAMESPACE)


def test_a_valid_spec_is_admitted_and_an_update_to_a_refused_one_leaves_it_running(
    fleet: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = "running"
    admitted = fleet.apply(valid(name))
    assert "Warning" not in admitted.stderr, admitted.stderr
    try:
        wait_ready(fleet, name, NAMESPACE)
        before = fleet.get("m3d", name, NAMESPACE)
        deployment = fleet.get("deployment", name, NAMESPACE)
        assert before is not None and deployment is not None
        path = write_manifest(tmp_path, kv_does_not_fit(name))
        message = planner_message(path, name)
        refused = fleet.kubectl("apply", "--server-side", "-f", str(path), check=False)
        assert refused.returncode != 0 and DENIED + message in refused.stderr, refused.stderr
        after = fleet.get("m3d", name, NAMESPACE)
        assert after is not None
        assert after["metadata"]["generation"] == before["metadata"]["generation"]
        assert after["spec"] == before["spec"]
        assert condition(after, "Ready")["status"] == "True"
        untouched = fleet.get("deployment", name, NAMESPACE)
        assert untouched is not None
        assert untouched["metadata"]["resourceVersion"] == deployment["metadata"]["resourceVersion"]
        assert [p["status"].get("phase") for p in pods(fleet, name, NAMESPACE)] == ["Running"]
        # an update that leaves the spec alone is never judged
        fleet.kubectl("label", f"m3d/{name}", "-n", NAMESPACE, "team=search")
    finally:
        delete(fleet, name, NAMESPACE)
    assert fleet.get("m3d", name, NAMESPACE) is None


def test_with_the_operator_down_only_our_resources_wait_and_as_documented(fleet: Cluster, tmp_path: Path) -> None:
    """No operator serves the webhook here. failurePolicy Ignore (the default): a refused spec is admitted and
    the operator, once back, reports it as InvalidSpec. Fail: creates and updates of MiniMaxM3Deployments are
    refused until an operator answers, deletes go through. Either way no other object is concerned."""
    name = "while-down"
    path = write_manifest(tmp_path, kv_does_not_fit(name))
    message = planner_message(path, name)
    secret_before = fleet.get("secret", "m3fleet-webhook-tls", "m3fleet-system")

    def config_map(key: str) -> None:
        document = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": key, "namespace": NAMESPACE}}
        fleet.apply(document)  # fails the test if refused
        fleet.kubectl("delete", "configmap", key, "-n", NAMESPACE)

    config_map("unrelated-ignore")
    fleet.apply(path)  # Ignore: admitted unchecked (schema and CEL still ran)
    try:
        with fleet.operator("--all-namespaces", "--standalone", *fleet.webhook_args(), name="operator-back"):

            def invalid() -> dict[str, Any] | None:
                found = condition(fleet.get("m3d", name, NAMESPACE), "Degraded")
                return found if found.get("reason") == "InvalidSpec" else None

            degraded = eventually("the operator reports the refused spec", invalid, 60)
            assert message in degraded["message"]
            assert fleet.list("deployments", NAMESPACE, f"m3fleet.dev/name={name}") == []
        fleet.upgrade_chart(webhook__failurePolicy="Fail")
        # the same CA and serving certificate after an upgrade (the chart looks them up)
        secret_after = fleet.get("secret", "m3fleet-webhook-tls", "m3fleet-system")
        assert secret_before is not None and secret_after is not None
        assert secret_after["data"] == secret_before["data"]
        config_map("unrelated-fail")
        other = fleet.apply(valid("created-while-down"), check=False)
        assert other.returncode != 0 and "failed calling webhook" in other.stderr, other.stderr
        assert fleet.get("m3d", "created-while-down", NAMESPACE) is None
    finally:
        deleted = fleet.kubectl("delete", f"m3d/{name}", "-n", NAMESPACE, "--timeout=30s", check=False)
        fleet.upgrade_chart(webhook__failurePolicy="Ignore")
    assert deleted.returncode == 0, deleted.stderr  # deletion is never held up, even with Fail and no operator
    assert fleet.get("m3d", name, NAMESPACE) is None


def test_a_paused_standby_serves_the_webhook(fleet: Cluster, tmp_path: Path) -> None:
    """With peering, every replica serves the webhook (the chart's Service sends requests to any of them): here
    the paused low-priority operator holds the webhook's port, the active one does not serve it at all."""
    fleet.upgrade_chart(peering__enabled=True)
    name = "standby-served"
    try:
        with (
            fleet.operator("--all-namespaces", name="operator-active", env={"M3FLEET_PEERING_PRIORITY": "200"}),
            fleet.operator(
                "--all-namespaces",
                *fleet.webhook_args(),
                name="operator-standby",
                env={"M3FLEET_PEERING_PRIORITY": "100"},
            ) as standby,
        ):
            eventually("the standby pauses", lambda: "Pausing" in standby.log(), 60)
            eventually("the standby answering", lambda: serving(fleet, tmp_path), 60)
            path = write_manifest(tmp_path, kv_does_not_fit(name))
            refused = fleet.kubectl("apply", "--server-side", "-f", str(path), check=False)
            assert refused.returncode != 0 and DENIED + planner_message(path, name) in refused.stderr
            fleet.apply(valid(name))
            wait_ready(fleet, name, NAMESPACE)  # reconciled by the active operator
            assert "Resuming" not in standby.log()
            assert standby.writes([e for e in standby.requests() if "kopfpeerings" not in str(e)]) == []
    finally:
        delete(fleet, name, NAMESPACE)
        fleet.upgrade_chart(peering__enabled=False)


def at_one_million(name: str, sequences: int) -> dict[str, Any]:
    """MXFP8 at 1M tokens: two full-length sequences fit one H200 node (a Deployment), three need two (a group)."""
    document = valid(name)
    document["spec"]["model"] = {"variant": "mxfp8", "source": {"pvc": {"claimName": "m3-weights-mxfp8"}}}
    document["spec"]["context"] = {"maxModelLen": 1_048_576, "minSequencesAtMaxLen": sequences}
    return document


ROLES = {1: ["single"], 2: ["leader", "worker"]}  # the pods' m3fleet.dev/role: a Deployment's, a group's
RESOURCE_OF = {"Deployment": "deployment", "LeaderWorkerSet": "leaderworkerset"}


def test_a_replica_that_outgrows_its_node_moves_to_a_group_and_back_with_a_warning_and_an_event(
    fleet: Cluster, operator: OperatorProcess
) -> None:
    name = "regrouped"

    def roles() -> list[str]:
        return sorted(p["metadata"]["labels"]["m3fleet.dev/role"] for p in pods(fleet, name, NAMESPACE))

    def replaced_events() -> list[str]:
        events = fleet.list("events", NAMESPACE)
        return [
            e["message"]
            for e in events
            if e["involvedObject"].get("name") == name and e["reason"] == "WorkloadReplaced"
        ]

    try:
        assert "Warning" not in fleet.apply(at_one_million(name, 1)).stderr
        wait_ready(fleet, name, NAMESPACE)
        assert roles() == ROLES[1]
        moves = [(3, 2, "Deployment", "LeaderWorkerSet"), (1, 1, "LeaderWorkerSet", "Deployment")]
        for done, (sequences, nodes, running, replacement) in enumerate(moves, start=1):
            notice = f"each replica now spans {nodes} node(s): the {running} is replaced by a {replacement}"
            applied = fleet.apply(at_one_million(name, sequences))
            assert f"Warning: spec: {notice}" in applied.stderr, applied.stderr
            eventually(
                f"the {running} gone, the {replacement} there",
                lambda running=running, replacement=replacement: (
                    fleet.get(RESOURCE_OF[running], name, NAMESPACE) is None
                    and fleet.get(RESOURCE_OF[replacement], name, NAMESPACE) is not None
                ),
                60,
            )
            eventually(f"only the {replacement}'s pods", lambda nodes=nodes: roles() == ROLES[nodes], 120)
            body = wait_ready(fleet, name, NAMESPACE)
            assert body["status"]["plan"]["nodesPerReplica"] == nodes
            assert condition(body, "Ready")["observedGeneration"] == body["metadata"]["generation"]
            said = eventually(
                f"{done} WorkloadReplaced Event(s)",
                lambda done=done: len(replaced_events()) == done and replaced_events(),
                30,
            )
            assert any(message.startswith(notice) for message in said), said
    finally:
        delete(fleet, name, NAMESPACE)


def _stand_in_crd(kind: str, plural: str) -> dict[str, Any]:
    """cert-manager's API as far as the apiserver and Helm need it: the kind exists. No cert-manager runs here (its
    controller is not built on this tier), so the test writes the Secret it would."""
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.cert-manager.io"},
        "spec": {
            "group": "cert-manager.io",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }


def test_switching_the_webhook_certificate_to_cert_manager_and_back_is_a_plain_upgrade(fleet: Cluster) -> None:
    """A Secret cert-manager wrote has no Helm ownership, and Helm refuses to render an object of its name into a
    release: cert-manager's Secret is named apart from the chart's own, so both switches are `helm upgrade`."""
    release, namespace = "cm-switch", "m3fleet-cm-switch"
    for kind, plural in (("Certificate", "certificates"), ("Issuer", "issuers")):
        fleet.apply(_stand_in_crd(kind, plural))
    fleet.kubectl(
        "wait", "--for=condition=Established", "crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io"
    )
    # Namespace scope: the webhook this release configures (nobody serves it) concerns its own namespace only.
    scoped = ("--set", "scope=namespace", "--set", f"watchNamespace={namespace}")
    try:
        fleet.install_chart(release, namespace, *scoped, "--set", "webhook.certManager.enabled=true")
        certificate = fleet.get("certificate", "cm-switch-m3fleet-webhook", namespace)
        assert certificate is not None
        secret = certificate["spec"]["secretName"]
        assert secret == "cm-switch-m3fleet-webhook-cert-manager"
        tls = {"tls.crt": "Y3J0", "tls.key": "a2V5", "ca.crt": "Y2E="}  # what cert-manager writes, annotated as it does
        annotations = {"cert-manager.io/certificate-name": "cm-switch-m3fleet-webhook"}
        fleet.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": secret, "namespace": namespace, "annotations": annotations},
                "data": tls,
            }
        )

        def mounted() -> str:
            deployment = fleet.get("deployment", "cm-switch-m3fleet", namespace) or {}
            volumes = deployment["spec"]["template"]["spec"]["volumes"]
            return str(next(v for v in volumes if v["name"] == "webhook-tls")["secret"]["secretName"])

        assert mounted() == secret

        # Back to the chart's own certificate: a plain upgrade; cert-manager's Secret is left for the user.
        fleet.upgrade_chart(release, webhook__certManager__enabled=False)
        own = fleet.get("secret", "cm-switch-m3fleet-webhook-tls", namespace)
        assert own is not None and own["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert mounted() == "cm-switch-m3fleet-webhook-tls"
        assert fleet.get("certificate", "cm-switch-m3fleet-webhook", namespace) is None
        assert fleet.get("secret", secret, namespace) is not None

        # And to cert-manager again: Helm removes its own Secret, the pod mounts cert-manager's.
        fleet.upgrade_chart(release, webhook__certManager__enabled=True)
        assert mounted() == secret
        assert fleet.get("secret", "cm-switch-m3fleet-webhook-tls", namespace) is None
    finally:
        fleet.helm("uninstall", release, "-n", namespace, "--wait", check=False)
        fleet.installed.pop(release, None)
        fleet.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)
        fleet.kubectl("delete", "crd", "certificates.cert-manager.io", "issuers.cert-manager.io", check=False)

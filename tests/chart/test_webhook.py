"""The chart's admission webhook, rendered: what the API server is told to call, with which CA, for what; and
that the operator pod serves it with the certificate the chart made (the real tier calls it: tests/cluster)."""

from __future__ import annotations

import base64
from typing import Any

import helm_python as helm
import pytest
from cryptography import x509

from m3fleet.cli import build_parser
from m3fleet.controller.webhook import CERT_FILE, KEY_FILE, WEBHOOK_ID
from tests.support.chart import NAMESPACE, by_kind, one, render

HOOK = "validate.minimaxm3deployments.m3fleet.dev"


def webhook_objects(values: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    objects = render(values)
    configuration = one(objects, "ValidatingWebhookConfiguration")
    assert [h["name"] for h in configuration["webhooks"]] == [HOOK]
    return objects, configuration["webhooks"][0]


def pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def certificates(secret: dict[str, Any]) -> tuple[x509.Certificate, x509.Certificate]:
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    return ca, serving


def sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return names.get_values_for_type(x509.DNSName), [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]


def test_only_our_resources_only_create_and_update_and_unrelated_objects_never_wait() -> None:
    _, hook = webhook_objects({})
    assert hook["rules"] == [
        {
            "apiGroups": ["m3fleet.dev"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            # not /status (the operator's writes), not /scale
            "resources": ["minimaxm3deployments", "minimaxm3modelcaches"],
            "scope": "Namespaced",
        }
    ]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 5 and hook["admissionReviewVersions"] == ["v1"]
    assert "namespaceSelector" not in hook and "objectSelector" not in hook  # every namespace: scope=cluster


def test_the_service_reaches_every_operator_pod_on_the_port_it_serves() -> None:
    objects, hook = webhook_objects({"replicas": 2, "peering": {"enabled": True}})
    service = next(s for s in by_kind(objects, "Service") if s["metadata"]["name"] == "m3fleet-webhook")
    assert hook["clientConfig"]["service"] == {
        "name": "m3fleet-webhook",
        "namespace": NAMESPACE,
        "path": f"/{WEBHOOK_ID}",
        "port": 443,
    }
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    template = one(objects, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    container = template["spec"]["containers"][0]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    args = build_parser().parse_args(container["args"])
    assert (args.webhook_port, args.webhook_address) == (9443, "0.0.0.0")
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == args.webhook_cert_dir)
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "m3fleet-webhook-tls"
    assert {i["path"] for i in volume["secret"]["items"]} == {CERT_FILE, KEY_FILE}  # what --webhook-cert-dir reads


def test_the_ca_bundle_signs_the_serving_certificate_for_the_service_name() -> None:
    objects, hook = webhook_objects({})
    secret = one(objects, "Secret")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    ca, serving = certificates(secret)
    serving.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    dns, ips = sans(serving)
    assert f"m3fleet-webhook.{NAMESPACE}.svc" in dns and ips == []


def test_an_operator_outside_the_cluster_gets_a_url_and_a_certificate_for_its_host() -> None:
    url = "https://127.0.0.1:9443/validate"
    objects, hook = webhook_objects({"webhook": {"url": url, "failurePolicy": "Fail"}})
    assert hook["clientConfig"]["url"] == url and "service" not in hook["clientConfig"]
    assert hook["failurePolicy"] == "Fail"
    assert "m3fleet-webhook" not in [s["metadata"]["name"] for s in by_kind(objects, "Service")]
    ca, serving = certificates(one(objects, "Secret"))
    serving.verify_directly_issued_by(ca)
    assert sans(serving) == ([], ["127.0.0.1"])
    _, named = webhook_objects({"webhook": {"url": "https://ops.example.com/validate"}})
    assert named["clientConfig"]["url"] == "https://ops.example.com/validate"


def test_namespace_scope_judges_only_the_watched_namespace() -> None:
    _, hook = webhook_objects({"scope": "namespace", "watchNamespace": "llm"})
    assert hook["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "llm"}}


@pytest.mark.parametrize(
    ("issuer", "expected"),
    [
        ({}, {"kind": "Issuer", "name": "m3fleet-webhook"}),
        ({"name": "internal-ca", "kind": "ClusterIssuer"}, {"name": "internal-ca", "kind": "ClusterIssuer"}),
    ],
    ids=["self-signed", "cluster-issuer"],
)
def test_cert_manager_issues_its_certificate(issuer: dict[str, str], expected: dict[str, str]) -> None:
    objects, hook = webhook_objects({"webhook": {"certManager": {"enabled": True, "issuerRef": issuer}}})
    configuration = one(objects, "ValidatingWebhookConfiguration")
    injected = {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/m3fleet-webhook"}
    assert configuration["metadata"]["annotations"] == injected
    assert "caBundle" not in hook["clientConfig"]  # the CA injector fills it
    certificate = one(objects, "Certificate")
    assert certificate["metadata"]["name"] == "m3fleet-webhook"
    # A Secret of its own (Helm would not take one cert-manager wrote over on a switch back), mounted by the pod.
    assert certificate["spec"]["secretName"] == "m3fleet-webhook-cert-manager"
    (deployment,) = by_kind(objects, "Deployment")
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == "m3fleet-webhook-cert-manager"
    assert f"m3fleet-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert expected.items() <= certificate["spec"]["issuerRef"].items()
    assert len(by_kind(objects, "Issuer")) == (0 if issuer else 1)
    assert by_kind(objects, "Secret") == []  # cert-manager writes it


def test_turned_off_nothing_of_it_is_rendered() -> None:
    objects = render({"webhook": {"enabled": False}})
    kinds = {o["kind"] for o in objects}
    assert "ValidatingWebhookConfiguration" not in kinds and "Secret" not in kinds
    spec = pod(objects)
    args = build_parser().parse_args(spec["containers"][0]["args"])
    assert args.webhook_port == 0 and all(v["name"] != "webhook-tls" for v in spec["volumes"])


def test_the_operator_needs_no_rbac_for_it() -> None:
    """The chart owns the configuration; the operator never reads or writes admissionregistration."""
    for role in by_kind(render({}), "ClusterRole"):
        for rule in role.get("rules") or []:
            assert "admissionregistration.k8s.io" not in rule.get("apiGroups", []), role["metadata"]["name"]
            assert "*" not in rule.get("verbs", []) and "*" not in rule.get("resources", [])


BAD = [
    ({"webhook": {"failurePolicy": "Never"}}, "at '/webhook/failurePolicy': value must be one of"),
    ({"webhook": {"url": "http://127.0.0.1:9443/validate"}}, "at '/webhook/url'"),
    ({"webhook": {"url": "https://127.0.0.1:9443/"}}, "at '/webhook/url'"),
    ({"webhook": {"timeoutSeconds": 60}}, "at '/webhook/timeoutSeconds'"),
    ({"webhook": {"port": 443}}, "at '/webhook/port'"),
    ({"webhook": {"certManager": {"issuerRef": {"kind": "Vault"}}}}, "at '/webhook/certManager/issuerRef/kind'"),
    ({"webhook": {"enable": False}}, "additional properties 'enable' not allowed"),
]


@pytest.mark.parametrize(("values", "message"), BAD, ids=[m for _, m in BAD])
def test_schema_rejects_bad_webhook_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as exc:
        render(values)
    assert message in str(exc.value)

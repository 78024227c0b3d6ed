"""The operator's Prometheus client on the real tier: whatever `spec.autoscaling.prometheus.url` answers, no
byte of the answer reaches status, Events or the operator's log (status code and a fixed message only);
https is verified against the CA in the Secret `caSecretRef` names (read by the operator with the chart's
RBAC), or the system CAs; `insecureSkipVerify` works and is announced with a warning Event. Only http(s)
URLs are admitted (the apiserver's CEL rule and the CLI say the same)."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from tests.support.cluster.cluster import BIN, Cluster, OperatorProcess, eventually
from tests.support.cluster.fleet import advisory_fleet, operated_namespace
from tests.support.cluster.pki import Authority
from tests.support.scripted_http import EMPTY_RESULT, SECRET, serving

NAMESPACE = "prom-safety"


@pytest.fixture(scope="module")
def operator(chart: Cluster) -> Iterator[OperatorProcess]:
    with operated_namespace(chart, NAMESPACE, "operator-prom-safety") as running:
        yield running


def _reason(cluster: Cluster, name: str) -> str:
    body = cluster.get("m3d", name, NAMESPACE) or {}
    return str(((body.get("status") or {}).get("autoscaling") or {}).get("reason") or "")


def test_no_answer_body_reaches_status_events_or_logs_and_tls_is_verified(
    chart: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    ca = Authority(tmp_path / "ca")
    pair = ca.serving("prometheus")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert, pair.key)
    chart.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "prom-ca", "namespace": NAMESPACE},
            "data": {"ca.crt": base64.b64encode(ca.pem).decode()},
        }
    )
    with (
        serving(500, f"internal error: {SECRET}") as failing,
        serving(200, f"<html>{SECRET}</html>") as not_json,
        serving(200, EMPTY_RESULT, tls=context) as https,
    ):
        cases = {
            "http-500": ({"url": failing}, "HTTP 500: the answer is not from the Prometheus query API"),
            "http-200-html": ({"url": not_json}, "HTTP 200: the answer is not from the Prometheus query API"),
            "tls-system-cas": ({"url": https}, "TLS verification failed"),
            "tls-no-secret": ({"url": https, "caSecretRef": {"name": "absent"}}, "Secret absent does not exist"),
            "tls-wrong-key": ({"url": https, "caSecretRef": {"name": "prom-ca", "key": "x"}}, "has no key 'x'"),
        }
        verified = {"tls-ca": {"url": https, "caSecretRef": {"name": "prom-ca"}}}
        insecure = {"tls-insecure": {"url": https, "insecureSkipVerify": True}}
        everything = {**{n: p for n, (p, _) in cases.items()}, **verified, **insecure}
        try:
            for name, prometheus in everything.items():
                chart.apply(advisory_fleet(name, NAMESPACE, prometheus))
            for name, (_, expected) in cases.items():
                eventually(f"{name}: {expected}", lambda n=name, e=expected: e in _reason(chart, n), 90)
            for name in (*verified, *insecure):  # Prometheus answered: the decision is on the (empty) metrics
                reason = eventually(f"{name} decided", lambda n=name: _reason(chart, n), 90)
                assert "metrics unavailable" not in reason, (name, reason)
            warned = eventually(
                "an InsecureSkipVerify warning Event",
                lambda: [
                    e
                    for e in chart.list("events", NAMESPACE)
                    if e.get("reason") == "InsecureSkipVerify" and e["involvedObject"]["name"] == "tls-insecure"
                ],
                60,
            )
            assert warned[0]["type"] == "Warning" and "caSecretRef" in warned[0]["message"]
            # Each unreadable source is said once in an Event (its status says it every 5 s tick), none for the others.
            unavailable = [e for e in chart.list("events", NAMESPACE) if e.get("reason") == "MetricsUnavailable"]
            said = {n: [e for e in unavailable if e["involvedObject"]["name"] == n] for n in everything}
            for name, (_, expected) in cases.items():
                assert len(said[name]) == 1 and said[name][0]["type"] == "Warning", (name, said[name])
                assert expected in said[name][0]["message"] and "holds" in said[name][0]["message"], said[name]
            assert not any(said[n] for n in (*verified, *insecure)), said
            statuses = json.dumps([chart.get("m3d", n, NAMESPACE) for n in everything])
            events = json.dumps(chart.list("events", NAMESPACE))
            assert SECRET not in statuses and SECRET not in events and SECRET not in operator.log()
            assert "HTTP 500" in statuses  # the status code is what is said
        finally:
            for name in everything:
                chart.kubectl("delete", "m3d", name, "-n", NAMESPACE, "--wait=false", check=False)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://127.0.0.1:70/_", "http://u:p@prom:9090"])
def test_only_http_urls_are_admitted_and_the_cli_agrees(
    chart: Cluster, operator: OperatorProcess, url: str, tmp_path: Path
) -> None:
    document = advisory_fleet("bad-url", NAMESPACE, {"url": url})
    result = chart.apply(document, "--dry-run=server", check=False)
    assert result.returncode != 0 and "spec.autoscaling.prometheus.url" in result.stderr, result.stderr
    assert "http:// or https://" in result.stderr
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    cli = subprocess.run([str(BIN / "m3fleet"), "plan", "-f", str(path)], capture_output=True, text=True, check=False)
    assert cli.returncode == 2 and "spec.autoscaling.prometheus.url" in cli.stderr, cli.stderr
    assert "http:// or https://" in cli.stderr and "Traceback" not in cli.stderr

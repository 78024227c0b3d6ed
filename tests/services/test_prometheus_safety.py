"""The Prometheus client is safe to point at any URL: only http/https, TLS verified by default (against a CA
given in memory, or the system's), never a redirect followed, and never a byte of the answer repeated.

Real servers on loopback: a scripted HTTP(S) server answering with a secret-looking body, and a real
Prometheus serving https with a certificate from a CA generated here.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from m3fleet.autoscaling.prometheus import MAX_ANSWER_BYTES, PrometheusAdapter, PrometheusError, PrometheusHttp, Tls
from tests.support.autoscaling.prom import prometheus
from tests.support.cluster.pki import Authority
from tests.support.scripted_http import EMPTY_RESULT, SECRET, served, serving


def _read(url: str, tls: Tls | None = None) -> str:
    snapshot = PrometheusAdapter.for_engine("vllm", url, tls=tls or Tls(), timeout_seconds=3).read()
    assert snapshot.error is not None
    return snapshot.error


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            500,
            f"internal error: {SECRET}",
            "HTTP 500: the answer is not from the Prometheus query API (is url its base URL?)",
        ),
        (
            404,
            f"<html>{SECRET}</html>",
            "HTTP 404: the answer is not from the Prometheus query API (is url its base URL?)",
        ),
        (200, f"not json {SECRET}", "HTTP 200: the answer is not from the Prometheus query API (is url its base URL?)"),
        (
            200,
            json.dumps({"secret": SECRET}),
            "HTTP 200: the answer is not from the Prometheus query API (is url its base URL?)",
        ),
        (
            400,
            json.dumps({"status": "error", "errorType": "bad_data", "error": f"parse error near {SECRET}"}),
            "HTTP 400: Prometheus refused the query (bad_data)",
        ),
        (
            503,
            json.dumps({"status": "error", "errorType": SECRET, "error": SECRET}),
            "HTTP 503: Prometheus refused the query",
        ),
        (200, json.dumps({"status": "success", "data": SECRET}), "HTTP 200: the answer has no query result"),
    ],
)
def test_a_failed_answer_is_reported_by_status_code_never_by_body(status: int, body: str, expected: str) -> None:
    with serving(status, body) as url:
        error = _read(url)
    assert error == f"prometheus at {url}: {expected}"
    assert SECRET not in error


def test_a_retry_after_header_never_holds_a_tick() -> None:
    """urllib3 obeys Retry-After on a 503 (up to 6 h) unless told not to: the tick would sleep that long."""
    with serving(503, "busy", {"Retry-After": "30"}) as url:
        started = time.monotonic()
        error = _read(url)
    assert time.monotonic() - started < 10 and "HTTP 503" in error


@contextmanager
def trickling(total_bytes: int, pause: float) -> Iterator[str]:
    """A server that answers 200 with `total_bytes` of a JSON string, a byte every `pause` seconds."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(total_bytes))
            self.end_headers()
            try:
                for _ in range(total_bytes):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(pause)
            except OSError:
                pass  # the client gave up

        def log_message(self, format: str, *args: object) -> None:
            pass

    with served(Handler) as url:
        yield url


def test_an_answer_that_trickles_in_is_cut_off() -> None:
    """Each byte comes within the socket timeout, so only a whole-answer deadline ends it."""
    with trickling(100_000, 0.2) as url:
        started = time.monotonic()
        error = PrometheusHttp(url, timeout=1.0)
        with pytest.raises(PrometheusError) as info:
            error.custom_query("up")
    assert time.monotonic() - started < 5 and "no whole answer within 2s" in str(info.value)


def test_an_answer_too_large_is_refused_before_it_fills_memory() -> None:
    with serving(200, " " * (MAX_ANSWER_BYTES + 1)) as url, pytest.raises(PrometheusError) as info:
        PrometheusHttp(url, timeout=5.0).custom_query("up")
    assert "larger than 16 MiB" in str(info.value)


def test_redirects_are_not_followed() -> None:
    with (
        serving(200, f'{{"status":"success","data":{{"result":[],"x":"{SECRET}"}}}}') as target,
        serving(302, SECRET, {"Location": f"{target}/api/v1/query"}) as url,
    ):
        error = _read(url)
    assert error.endswith("HTTP 302: redirects are not followed; set url to Prometheus itself")
    assert SECRET not in error


@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://127.0.0.1:70/", "ftp://x/", "127.0.0.1:9090"])
def test_only_http_and_https_are_dialled(url: str) -> None:
    with pytest.raises(PrometheusError, match="must start with http:// or https://"):
        PrometheusHttp(url)
    assert _read(url).endswith("the URL must start with http:// or https://")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Authority, Authority]:
    """Two unrelated CAs: the one that signed the server, and another."""
    return Authority(tmp_path_factory.mktemp("ca")), Authority(tmp_path_factory.mktemp("other-ca"))


def _context(authority: Authority, *names: str, ips: tuple[str, ...] = ("127.0.0.1",)) -> ssl.SSLContext:
    pair = authority.issue(
        f"server-{'-'.join(names) or 'ip'}", names[0] if names else "server", server=True, dns=names, ips=ips
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert, pair.key)
    return context


def test_https_is_verified_against_the_given_ca_only(pki: tuple[Authority, Authority]) -> None:
    ca, other = pki
    with serving(200, EMPTY_RESULT, tls=_context(ca)) as url:
        trusted = PrometheusAdapter.for_engine("vllm", url, tls=Tls(ca_pem=ca.pem.decode())).read()
        assert trusted.error is None, trusted.error
        for tls in (Tls(), Tls(ca_pem=other.pem.decode())):  # the system CAs, or an unrelated CA: refused
            error = _read(url, tls)
            assert "TLS verification failed" in error and "caSecretRef" in error, error
        insecure = PrometheusAdapter.for_engine("vllm", url, tls=Tls(insecure_skip_verify=True)).read()
        assert insecure.error is None, insecure.error
    with pytest.raises(PrometheusError, match="not a PEM certificate"):
        PrometheusHttp("https://127.0.0.1:1", Tls(ca_pem=f"-----BEGIN CERTIFICATE-----\n{SECRET}\n"))


def test_a_certificate_for_another_host_name_is_refused(pki: tuple[Authority, Authority]) -> None:
    ca, _ = pki
    with serving(200, EMPTY_RESULT, tls=_context(ca, "prometheus.elsewhere", ips=())) as url:
        error = _read(url, Tls(ca_pem=ca.pem.decode()))
    assert "TLS verification failed" in error, error


@pytest.mark.prometheus
def test_a_real_prometheus_over_tls_with_a_generated_ca(tmp_path: Path, pki: tuple[Authority, Authority]) -> None:
    ca, other = pki
    pair = ca.serving("prometheus")
    config = "global:\n  scrape_interval: 1s\nscrape_configs: []\n"
    with prometheus(tmp_path, config, tls=(pair.cert, pair.key, ca.cert)) as url:
        assert url.startswith("https://")
        client = PrometheusHttp(url, Tls(ca_pem=ca.pem.decode()))
        assert client.custom_query("vector(7)")[0]["value"][1] == "7"
        snapshot = PrometheusAdapter.for_engine("vllm", url, tls=Tls(ca_pem=ca.pem.decode())).read()
        assert snapshot.error is None and snapshot.replicas == ()
        assert "TLS verification failed" in _read(url, Tls(ca_pem=other.pem.decode()))
        assert "TLS verification failed" in _read(url)  # not signed by a system CA
        bad = PrometheusAdapter.for_engine(
            "vllm", url, tls=Tls(ca_pem=ca.pem.decode()), overrides={"up": f"up{{{SECRET}"}
        ).read()
        assert bad.error == f"prometheus at {url}: HTTP 400: Prometheus refused the query (bad_data)"

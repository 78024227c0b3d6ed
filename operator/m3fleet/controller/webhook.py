"""The validating admission webhook: kopf's WebhookServer (TLS) and one `on.validate` handler.

The handler only asks the pure core (`m3fleet.admission.review`) and answers; it reads nothing from the
cluster and keeps no state, so every operator replica — the active one and standbys paused by peering
(kopf never pauses its webhook server) — gives the same answer, and the Service in front of them may send
a request to any of them.

The ValidatingWebhookConfiguration is the chart's (charts/m3fleet/templates/webhook.yaml), not kopf's
(`settings.admission.managed` stays unset): the operator needs no RBAC on admissionregistration.k8s.io, and
the configuration outlives the operator, so its failure policy decides what happens while it is down.
The serving certificate is read from a directory holding tls.crt and tls.key (a kubernetes.io/tls Secret
mounted as a volume); kopf reloads it when the files change (a rotated cert-manager certificate).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf

from m3fleet.admission import REVIEW_API_VERSION, REVIEW_KIND, Malformed, malformed, review
from m3fleet.api.cache import CACHE_PLURAL
from m3fleet.api.models import GROUP, PLURAL, VERSION

WEBHOOK_ID = "validate"  # kopf serves a handler at /<its id>: the chart's clientConfig path is /validate
CERT_FILE, KEY_FILE = "tls.crt", "tls.key"
REFUSED = 422  # Unprocessable: the request is well-formed, the spec is not one the operator can run

log = logging.getLogger(__name__)


class WebhookError(Exception):
    """The webhook cannot serve as configured: say what to fix."""


@dataclass(frozen=True)
class Webhook:
    port: int
    address: str
    cert_dir: Path

    @property
    def certfile(self) -> Path:
        return self.cert_dir / CERT_FILE

    @property
    def keyfile(self) -> Path:
        return self.cert_dir / KEY_FILE

    def check(self) -> None:
        missing = [str(p) for p in (self.certfile, self.keyfile) if not p.is_file()]
        if missing:
            raise WebhookError(
                f"--webhook-cert-dir {self.cert_dir}: no {' or '.join(missing)}; give the directory of the "
                f"webhook's serving certificate ({CERT_FILE}, {KEY_FILE}: a kubernetes.io/tls Secret mounted as a "
                "volume), or --webhook-port 0 to run without the webhook"
            )

    def server(self) -> kopf.WebhookServer:
        return GuardedWebhookServer(
            addr=self.address, port=self.port, certfile=str(self.certfile), pkeyfile=str(self.keyfile)
        )


def _answer(problem: Malformed) -> aiohttp.web.Response:
    """A request that names its uid is denied as an AdmissionReview; one that does not gets a plain 400."""
    if problem.uid is None:
        return aiohttp.web.json_response({"message": problem.message}, status=400)
    status = {"code": 400, "message": f"malformed AdmissionReview: {problem.message}"}
    response = {"uid": problem.uid, "allowed": False, "status": status}
    return aiohttp.web.json_response({"apiVersion": REVIEW_API_VERSION, "kind": REVIEW_KIND, "response": response})


class GuardedWebhookServer(kopf.WebhookServer):
    """kopf's server, with every body checked before kopf's admission code reads it: kopf indexes the
    AdmissionReview's keys unchecked, so a body that is not JSON text (bytes that are not UTF-8, nesting deep
    enough to exhaust the parser), not an AdmissionReview, or one without `request.uid` ended in a 500 and a
    traceback. Now each gets a 400, or a denial of the request it names; a body over aiohttp's 1 MiB limit gets
    its 413. An error inside the handling is a denial too: the failure policy never sees a crash."""

    @staticmethod
    async def _serve(fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        raw = await request.read()  # raises HTTPRequestEntityTooLarge (a plain 413) past client_max_size
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return _answer(Malformed(f"the body is not JSON text ({type(exc).__name__})"))
        problem = malformed(data)
        if problem is not None:
            log.warning("Refused a malformed admission request: %s", problem.message)
            return _answer(problem)
        uid = data["request"]["uid"]
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            response = await fn(
                data, webhook=request.match_info.get("id"), sslpeer=sslpeer, headers=dict(request.headers)
            )
        except Exception as exc:  # kopf's own errors included: answered as a denial, never a 500
            log.warning("Could not judge admission request %s: %s", uid, exc)
            return _answer(Malformed(f"{type(exc).__name__}: {exc}", uid))
        return aiohttp.web.json_response(response)


def register(registry: kopf.OperatorRegistry, webhook: Webhook) -> None:
    @kopf.on.startup(registry=registry)
    def serve(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.admission.server = webhook.server()
        log.info("Serving the validating webhook at https://%s:%d/%s", webhook.address, webhook.port, WEBHOOK_ID)

    def validate(body: kopf.Body, warnings: list[str], **kwargs: Any) -> None:
        old = kwargs.get("old")  # kopf passes the request's operation and oldObject by keyword
        verdict = review(str(kwargs.get("operation") or ""), dict(body), None if old is None else dict(old))
        warnings.extend(verdict.warnings)
        if not verdict.allowed:
            raise kopf.AdmissionError(verdict.message, code=REFUSED)

    # One path (/validate) for both kinds: kopf picks the handler by the request's resource, and `review`
    # judges each document by its own kind. DELETE is not listed (kopf also never calls a validating handler
    # for a DELETE it is not made for): deletion is never refused, whatever the spec.
    for plural in (PLURAL, CACHE_PLURAL):
        kopf.on.validate(GROUP, VERSION, plural, id=WEBHOOK_ID, operations=["CREATE", "UPDATE"], registry=registry)(
            validate
        )

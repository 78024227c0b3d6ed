"""The admission decision: is this MiniMaxM3Deployment (or MiniMaxM3ModelCache) one the operator can run? (pure)

The validating webhook (m3fleet.controller.admission) asks this for every CREATE and UPDATE the API server
sends it, after the CRD's schema and CEL rules have passed. It refuses what only the planner can see — the KV
cache of maxModelLen does not fit, an engine that does not run that variant on that accelerator, a
parallelism the node cannot hold, and every other refusal of `m3fleet plan` / `m3fleet render` — with the
planner's own message (field, numbers, fix): the text `m3fleet plan` prints for the same document.

What it never does:

* decide what the schema decides: a document our models cannot read (which the CRD admitted, or the webhook
  would not have been asked) is admitted with a warning; the CRD is the authority on shape, and the
  operator reports the problem in status (InvalidSpec) as it would without a webhook;
* refuse an update that leaves `spec` as it was (labels, annotations, finalizers, owner references): a
  resource admitted before (while the webhook was down, or by an older operator) can always be relabelled,
  and a finalizer can always be removed, so deletion is never held up;
* refuse anything about an object that is being deleted.

An update that moves the replicas to the other workload kind (a replica that now spans nodes, or no longer
does) is admitted with a warning: the running replicas are replaced, not rolled.

Pure: same document, same verdict — so every operator replica (active or standby) answers alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from m3fleet.api import parse_resource
from m3fleet.api.cache import CACHE_KIND, label_key_problem
from m3fleet.api.models import Plan
from m3fleet.api.parse import parse_cache
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.planner import plan
from m3fleet.render import check, replacement_notice, workload_kind


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""  # why not, when not allowed: "field: problem; fix: ..."
    warnings: tuple[str, ...] = ()


ALLOWED = Verdict(True)


def review(operation: str, new: Mapping[str, Any] | None, old: Mapping[str, Any] | None = None) -> Verdict:
    """The verdict on one admission request: `operation` is CREATE, UPDATE, DELETE or CONNECT; `new` and
    `old` are the request's object and oldObject (either may be absent)."""
    if operation not in ("CREATE", "UPDATE") or not isinstance(new, Mapping):
        return ALLOWED
    meta = new.get("metadata")
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return ALLOWED
    if operation == "UPDATE" and isinstance(old, Mapping) and old.get("spec") == new.get("spec"):
        return ALLOWED
    if new.get("kind") == CACHE_KIND:
        return _review_cache(new)
    try:
        resource = parse_resource(new)
    except (SpecError, SpecErrors) as exc:
        return Verdict(
            True,
            warnings=(
                f"the operator cannot read this spec and will report it in status (InvalidSpec): {exc}; "
                "the CRD admitted it, so the CRD and the operator disagree: please report this",
            ),
        )
    try:
        planned = plan(resource.spec)
        check(resource, planned)  # a cacheRef's MiniMaxM3ModelCache may come later: status says if it is missing
    except (SpecError, SpecErrors) as exc:
        return Verdict(False, str(exc))
    notice = _replacement(old, planned) if operation == "UPDATE" else None
    return Verdict(True, warnings=(f"spec: {notice}",)) if notice else ALLOWED


def _review_cache(new: Mapping[str, Any]) -> Verdict:
    """A MiniMaxM3ModelCache: its CRD's contract (as the CLI judges it), then what CEL cannot see (the node
    label `<namespace>.<name>` must fit 63 characters; CEL reads no namespace)."""
    try:
        cache = parse_cache(new)
    except (SpecError, SpecErrors) as exc:
        return Verdict(True, warnings=(f"the operator cannot read this cache and will report it in status: {exc}",))
    problem = label_key_problem(cache.metadata.namespace, cache.metadata.name)
    return Verdict(False, f"metadata.name: {problem}") if problem else ALLOWED


def _replacement(old: Mapping[str, Any] | None, planned: Plan) -> str | None:
    """The warning for an update that changes the workload kind; None when the old spec did not plan (there
    was nothing running to replace) or the kind stays."""
    if not isinstance(old, Mapping):
        return None
    try:
        previous = plan(parse_resource(old).spec)
    except (SpecError, SpecErrors):
        return None
    return replacement_notice(workload_kind(previous), planned, previous.disaggregation is not None)


REVIEW_API_VERSION = "admission.k8s.io/v1"  # the chart's admissionReviewVersions
REVIEW_KIND = "AdmissionReview"


@dataclass(frozen=True)
class Malformed:
    """Why an AdmissionReview body cannot be judged. `uid`: the request's uid when it has one, so the answer can be
    a denial of that request; without one only an HTTP 400 can be given."""

    message: str
    uid: str | None = None


def malformed(review_body: object) -> Malformed | None:
    """What makes a decoded AdmissionReview body unusable, or None when it has the shape the API server sends
    (kopf's admission code indexes these keys without checking them)."""
    if not isinstance(review_body, Mapping):
        return Malformed(f"the body is a JSON {type(review_body).__name__}, not an {REVIEW_KIND} object")
    api_version, kind = review_body.get("apiVersion"), review_body.get("kind")
    if api_version != REVIEW_API_VERSION or kind != REVIEW_KIND:
        return Malformed(f"apiVersion/kind {api_version!r}/{kind!r}: expected {REVIEW_API_VERSION}/{REVIEW_KIND}")
    request = review_body.get("request")
    if not isinstance(request, Mapping):
        return Malformed(f"{REVIEW_KIND}.request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        return Malformed(f"{REVIEW_KIND}.request.uid is missing or not a non-empty string")
    resource = request.get("resource")
    if not isinstance(resource, Mapping) or not all(
        isinstance(resource.get(key), str) for key in ("group", "version", "resource")
    ):
        return Malformed("request.resource needs string group, version and resource", uid)
    if not isinstance(request.get("operation"), str):
        return Malformed("request.operation is missing or not a string", uid)
    if not isinstance(request.get("userInfo"), Mapping):
        return Malformed("request.userInfo is missing or not an object", uid)
    new, old = request.get("object"), request.get("oldObject")
    for field_name, value in (("object", new), ("oldObject", old)):
        if value is not None and not isinstance(value, Mapping):
            return Malformed(f"request.{field_name} is a JSON {type(value).__name__}, not an object", uid)
        if value is not None and not isinstance(value.get("metadata", {}), Mapping):
            return Malformed(f"request.{field_name}.metadata is not an object", uid)
    if new is None and old is None:
        return Malformed("request has neither object nor oldObject", uid)
    return None

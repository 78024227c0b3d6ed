"""Documents drawn from the CRD's own schema (valid ones and mutated ones), and the two verdicts on them:
the CLI's (`m3fleet.api.parse.parse_resource`, what `m3fleet plan`/`render` and the operator call) and a real
kube-apiserver's (`POST ...?dryRun=All&fieldValidation=Strict`, what `kubectl apply --dry-run=server` sends
with kubectl's default `--validate=strict`). Used by tests/cluster/test_contract.py and
tests/bench/bench_contract.py.

Agreement means: both admit, or both reject naming the same fields. The apiserver sometimes names a field
more coarsely or more finely than the CLI (a CEL rule that cannot read a float reports the rule's node,
spec.parallelism, where the CLI names spec.parallelism.tensorParallelSize), so two paths agree when one
is the other or contains it.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypothesis import strategies as st
from pydantic.alias_generators import to_snake

from m3fleet.api.cache import CACHE_KIND, CACHE_PLURAL
from m3fleet.api.contract import crd_schema
from m3fleet.api.models import API_VERSION, KIND, MAX_NAME_LENGTH, PLURAL
from m3fleet.api.parse import parse_cache, parse_resource
from m3fleet.errors import SpecErrors
from tests.support.cluster.controlplane import ControlPlane

NAMESPACE = "contract"
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12)

# Every strategy is built once and reused. Built anew on each draw, each new strategy object was validated again by
# Hypothesis (a regular expression parsed again, a filter wrapped again): 35 ms of CPU per document, most of
# tests/cluster/test_contract.py's time. Reusing them draws exactly the same documents (the same strategies, only
# not rebuilt): a derandomized run gives the same documents before and after.
_BUILT: dict[Hashable, st.SearchStrategy[Any]] = {}


def _once(key: Hashable, build: Callable[[], st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    if key not in _BUILT:
        _BUILT[key] = build()
    return _BUILT[key]


@cache
def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high)


def _one_of(values: tuple[Hashable, ...]) -> st.SearchStrategy[Any]:
    # keyed with each value's type: (0, 1) == (0.0, 1.0) == (False, True), but they draw different documents
    return _once(("one of", tuple((type(v), v) for v in values)), lambda: st.sampled_from(values))


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    fields: frozenset[str]
    detail: str = ""


# --- drawing documents from the schema ---------------------------------------------------------------


WRONG_VALUES = st.sampled_from(["8", "yes", "true", [1], {"a": 1}, True, 7, 2.5, 8.0, None, "", 2**70])


def _wrong_value(draw: st.DrawFn, kind: str | None) -> Any:
    """A value of another type than `kind` (the strict-typing cases: "8" for 8, "yes" for true...)."""
    value = draw(WRONG_VALUES)
    return value


_MATCHES = re.compile(r"^(?:self == '' \|\| )?self\.matches\('((?:[^'\\]|\\.)*)'\)")


def _cel_pattern(schema: dict[str, Any]) -> str | None:
    """The regular expression a string's own CEL rule requires (`self.matches('...')`: names, keys, images),
    unescaped from the CEL string literal, so valid draws mostly pass it."""
    for entry in schema.get("x-kubernetes-validations") or []:
        match = _MATCHES.match(entry["rule"])
        if match:
            return match.group(1).replace("\\\\", "\\")
    return None


def _scalar(draw: st.DrawFn, schema: dict[str, Any], valid: bool) -> Any:
    kind = schema.get("type")
    if "enum" in schema:
        return draw(_one_of(tuple(schema["enum"]))) if valid else draw(_one_of(("a100", "VLLM", "", "auto ")))
    if kind in ("integer", "number"):
        low, high = schema.get("minimum", -5), schema.get("maximum", 10**6)
        if valid:
            if kind == "integer":
                small = tuple(v for v in (0, 1, 2, 4, 8, 16, 32) if low <= v <= high) or (low,)
                key = ("mostly small", small, int(low), int(high))
                return draw(_once(key, lambda: _one_of(small) | _one_of(small) | _integers(int(low), int(high))))
            return draw(_once(("floats", low, high), lambda: st.floats(float(low), float(high), allow_nan=False)))
        out = draw(_one_of((low - 1, high + 1, low, high, -(2**40), 2**40)))
        return out if kind == "integer" else float(out)
    if kind == "boolean":
        return draw(st.booleans())
    if kind == "string":
        pattern = schema.get("pattern")
        required = _cel_pattern(schema)
        if required and valid and draw(_integers(0, 5)):
            limit = schema.get("maxLength", 64)
            matching = ("matching", required, limit)
            return draw(
                _once(
                    matching, lambda: st.from_regex(required.rstrip("$") + r"\Z").filter(lambda t: 0 < len(t) <= limit)
                )
            )
        if pattern and valid:
            return draw(_once(("pattern", pattern), lambda: st.from_regex(pattern.rstrip("$") + r"\Z")))
        if pattern:
            return draw(_one_of(("9:00", "24:00", "09:00\n", "0900", "12:60")))
        limit = schema.get("maxLength", 64)
        if not valid:
            return draw(_one_of(("", "x" * (limit + 1), "x" * limit)))
        shortest = schema.get("minLength", 0)
        return draw(_once(("text", shortest), lambda: TEXT.filter(lambda t: len(t) >= shortest) | st.just("w")))
    return draw(TEXT)


LABEL_VALUES = st.sampled_from(["", "true", "h200", "nvidia-h200-141gb"])
PRESERVED = st.dictionaries(TEXT, st.integers() | TEXT | st.booleans(), max_size=2)  # preserve-unknown-fields
MAP_KEYS = st.sampled_from(["a", "rdma/ib", "kubernetes.io/arch", "x y"])


def value_for(schema: dict[str, Any], path: str, depth: int = 0) -> st.SearchStrategy[Any]:
    """A value for `schema`: mostly valid, sometimes one mutation (wrong type, out of range, unknown key,
    missing required field). The schemas are crd_schema's, built once per kind: one strategy per node."""
    return _once((id(schema), path, depth), lambda: _value_for(schema, path, depth))


@st.composite
def _value_for(draw: st.DrawFn, schema: dict[str, Any], path: str, depth: int) -> Any:
    mutate = draw(_integers(0, 80)) == 0
    kind = schema.get("type")
    if mutate and draw(st.booleans()):
        return _wrong_value(draw, kind)
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return draw(PRESERVED)
    if kind == "object" and "properties" in schema:
        out: dict[str, Any] = {}
        required = set(schema.get("required") or [])
        for name, sub in schema["properties"].items():
            if name in required or draw(_integers(0, 2)) == 0:
                out[name] = draw(value_for(sub, f"{path}.{name}", depth + 1))
        if mutate:
            action = draw(_one_of(("unknown", "snake", "drop")))
            names = sorted(schema["properties"])
            if action == "unknown":
                out[draw(_one_of(("foo", "contxt", "replica", "Name")))] = 1
            elif action == "snake" and names:
                name = draw(_one_of(tuple(names)))
                if to_snake(name) != name:
                    out[to_snake(name)] = out.pop(name, draw(value_for(schema["properties"][name], path)))
            elif required:
                out.pop(draw(_one_of(tuple(sorted(required)))), None)
        return out
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return draw(_once((id(schema), path, depth, "map"), lambda: _map(schema, path, depth)))
    if kind == "array":
        items = schema.get("items") or {}
        limit = schema.get("maxItems", 4)
        count = draw(_one_of((0, 1, 2, limit + 1) if mutate else (0, 1, 2)))
        return [draw(value_for(items, f"{path}[]", depth + 1)) for _ in range(count)]
    return _scalar(draw, schema, valid=not mutate)


def _map(schema: dict[str, Any], path: str, depth: int) -> st.SearchStrategy[dict[Any, Any]]:
    values = value_for(schema["additionalProperties"], path, depth + 1)
    if schema["additionalProperties"].get("type") == "string":  # label maps: mostly label values, as users write
        values = st.one_of(LABEL_VALUES, LABEL_VALUES, values)
    return st.dictionaries(MAP_KEYS, values, max_size=2)


VALID_NAMES = st.from_regex(r"[a-z]([-a-z0-9]*[a-z0-9])?", fullmatch=True).filter(lambda n: len(n) <= MAX_NAME_LENGTH)
NAMES = st.one_of(
    VALID_NAMES,
    VALID_NAMES,
    VALID_NAMES,
    st.sampled_from(["m3-chat", "a", "m" + "3" * (MAX_NAME_LENGTH - 1), "m" + "3" * MAX_NAME_LENGTH]),
    st.sampled_from(["Chat", "chat.v2", "2chat", "chat-", "chat_v2", "-x", "x" * 254, "a.b-", "x" * 60]),
    st.text(st.sampled_from("abz09-.A_"), min_size=1, max_size=MAX_NAME_LENGTH + 3),
)


NOT_NAMES = st.sampled_from([5, True, ["x"]])
SOURCES = st.sampled_from([{"pvc": {"claimName": "w"}}, {"huggingFace": {"cacheClaimName": "hf"}}])


@st.composite
def documents(draw: st.DrawFn, kind: str = KIND) -> dict[str, Any]:
    """A MiniMaxM3Deployment (or, with `kind`, a MiniMaxM3ModelCache) drawn from its CRD's schema."""
    spec_schema = crd_schema(kind)["properties"]["spec"]
    metadata: dict[str, Any] = {"name": draw(NAMES)}
    if draw(_integers(0, 60)) == 0:
        metadata["name"] = draw(NOT_NAMES)
    if draw(_integers(0, 40)) == 0:
        metadata[draw(_one_of(("labels", "annotations")))] = {draw(_one_of(("a", "a b", "x/"))): "v"}
    doc = {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata}
    doc["spec"] = draw(value_for(spec_schema, "spec"))
    spec = doc["spec"]
    if kind == CACHE_KIND:
        if isinstance(spec, dict) and draw(_integers(0, 4)):  # mostly one source and a plausible path
            spec["source"] = {"pvc": {"claimName": "w"}}
            spec["path"] = draw(_one_of(("/mnt/nvme/m3fleet/m3", "/var/lib/m3fleet/m3", "/x")))
    elif isinstance(spec, dict) and draw(_integers(0, 4)):  # mostly one source (the CEL rule wants exactly one)
        model = spec.setdefault("model", {})
        if isinstance(model, dict):
            model["source"] = draw(SOURCES)
    if draw(_integers(0, 60)) == 0:
        doc[draw(_one_of(("spec_", "Spec", "extra")))] = {}
    return doc


# --- the two verdicts ------------------------------------------------------------------------------------


def cli_verdict(document: dict[str, Any]) -> Verdict:
    try:
        (parse_cache if document.get("kind") == CACHE_KIND else parse_resource)(document)
    except SpecErrors as exc:
        return Verdict(False, frozenset(e.field for e in exc.errors), str(exc))
    return Verdict(True, frozenset())


_UNKNOWN = re.compile(r'(?:unknown|duplicate) field "([^"]+)"')
_GO_FIELD = re.compile(r"Go struct field (\w+)\.([\w.]+) of type")


def _server_fields(status: int, body: Any) -> frozenset[str]:
    if not isinstance(body, dict):
        return frozenset({"?"})
    causes = (body.get("details") or {}).get("causes") or []
    fields = {c["field"].lstrip(".") for c in causes if c.get("field") and c["field"] != "<nil>"}
    message = str(body.get("message", ""))
    fields |= set(_UNKNOWN.findall(message))
    for struct, field in _GO_FIELD.findall(message):
        fields.add(f"metadata.{field}" if struct == "ObjectMeta" else field)
    return frozenset(fields)


class Apiserver:
    """One keep-alive HTTPS connection to the control plane as its admin, for thousands of dry runs."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.control_plane = control_plane
        context = ssl.create_default_context(cafile=str(control_plane.ca.cert))
        context.load_cert_chain(str(control_plane.admin_cert.cert), str(control_plane.admin_cert.key))
        self.context = context
        self.connection: http.client.HTTPSConnection | None = None

    def _post(self, path: str, payload: bytes) -> tuple[int, Any]:
        for attempt in range(2):
            if self.connection is None:
                self.connection = http.client.HTTPSConnection(
                    "127.0.0.1", self.control_plane.port, context=self.context, timeout=30
                )
            try:
                self.connection.request(
                    "POST",
                    path,
                    body=payload,
                    headers={"Content-Type": "application/json", "Accept": "application/json"},
                )
                response = self.connection.getresponse()
                data = response.read()
                return response.status, json.loads(data) if data else {}
            except (http.client.HTTPException, OSError):
                self.connection.close()
                self.connection = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def verdict(self, document: Any, namespace: str = NAMESPACE) -> Verdict:
        """`kubectl create --dry-run=server` of one JSON document in `namespace`, to the endpoint of its kind
        (a MiniMaxM3ModelCache's, else a MiniMaxM3Deployment's: a document of no kind of ours is refused there).
        A refusal by the validating webhook (the operator's, when one runs) counts as the apiserver's."""
        plural = CACHE_PLURAL if isinstance(document, dict) and document.get("kind") == CACHE_KIND else PLURAL
        body = document
        if isinstance(document, dict) and isinstance(document.get("metadata"), dict):
            body = {**document, "metadata": {**document["metadata"], "namespace": namespace}}
        path = f"/apis/m3fleet.dev/v1alpha1/namespaces/{namespace}/{plural}?dryRun=All&fieldValidation=Strict"
        status, answer = self._post(path, json.dumps(body, allow_nan=False).encode())
        if status < 300:
            return Verdict(True, frozenset())
        if status not in (400, 403, 422):
            raise AssertionError(f"unexpected answer {status}: {answer}")
        return Verdict(False, _server_fields(status, answer), str(answer.get("message", answer))[:2000])


_QUOTED = re.compile(r'\[("(?:[^"\\]|\\.)*")\]')


def _plain(path: str) -> str:
    """The CLI quotes odd keys (`x["a b"]`); the apiserver writes them as they are (`x.a b`)."""
    return _QUOTED.sub(lambda m: "." + json.loads(m.group(1)), path)


def _related(a: str, b: str) -> bool:
    a, b = _plain(a), _plain(b)
    return a == b or a.startswith((b + ".", b + "[")) or b.startswith((a + ".", a + "["))


def disagreement(cli: Verdict, server: Verdict) -> str | None:
    """Why the two verdicts differ, or None when they agree."""
    if cli.admitted != server.admitted:
        return f"CLI {'admits' if cli.admitted else 'rejects'}, apiserver {'admits' if server.admitted else 'rejects'}"
    if cli.admitted:
        return None
    unmatched_cli = [f for f in cli.fields if not any(_related(f, s) for s in server.fields)]
    unmatched_server = [s for s in server.fields if not any(_related(s, f) for f in cli.fields)]
    if unmatched_cli or unmatched_server:
        return f"fields differ: CLI only {sorted(unmatched_cli)}, apiserver only {sorted(unmatched_server)}"
    return None


def install_crd(kubectl: Callable[..., Any], control_plane: ControlPlane, crd_dir: str) -> None:
    kubectl("apply", "--server-side", "-f", crd_dir)
    for plural in (PLURAL, CACHE_PLURAL):
        control_plane.wait_established(f"{plural}.m3fleet.dev")
    control_plane.admin.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )

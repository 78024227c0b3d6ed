"""
A Kubernetes API server emulator for tests of kopf operators (run as processes of their own, pointed at it
by a kubeconfig), where a fault must be injected on demand.

:class:`ApiServerEmulator` is a subclass of kmock 0.8's ``KubernetesEmulator``. It keeps kmock's
HTTP server, discovery, request log, reaction DSL (``kmock[...] << ...``) and object store
(``kmock.objects[res, ns, name]`` with ``.history``), and replaces kmock's simplistic
create/patch/delete/list/watch handling with one that behaves like a real apiserver wherever
kopf or a controller relies on it. Select it in a test module with::

    pytestmark = pytest.mark.kmock(cls=ApiServerEmulator)

What it adds over plain kmock (each item exists because kopf or a controller depends on it):

* **Server-assigned metadata**: ``uid``, ``creationTimestamp``, one global, monotonically increasing
  ``resourceVersion`` bumped on every write, ``generation`` (1 on create, +1 when anything other
  than ``metadata`` changes; with a ``status`` subresource, ``status`` changes do not count either,
  exactly the CRD rule; none at all on the kinds that have none: ConfigMap, Service, Secret, Event,
  Namespace, ...), ``generateName``. Writes that change nothing are no-ops: no new
  resourceVersion, no watch event (as on a real server).
* **LIST** with the collection ``resourceVersion``, ``kind: <Kind>List``, ``apiVersion``,
  ``labelSelector`` (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``),
  ``fieldSelector`` (``=``, ``==``, ``!=`` on dotted paths such as ``metadata.name``) and
  ``limit``/``continue`` chunking over a consistent snapshot.
* **WATCH** from ``?resourceVersion=N``: only events after N are sent, replayed from an event
  history, so nothing between kopf's LIST and its WATCH is lost. The starting point and the
  subscription are taken atomically. Without a resourceVersion (or with "0") the stream starts
  with synthetic ``ADDED`` events for the current state. ``sendInitialEvents=true`` ends that
  initial state with the ``k8s.io/initial-events-end`` BOOKMARK. ``timeoutSeconds`` closes the
  stream. Selectors apply to events; an object that stops matching is sent as ``DELETED`` and one
  that starts matching as ``ADDED`` (the apiserver's watch-cache rule). A resourceVersion older
  than the kept history (see ``watch_history`` and :meth:`ApiServerEmulator.expire_watches`) gets
  an ``ERROR`` event with a proper ``410 Expired`` Status object.
* **Patches**: ``application/merge-patch+json`` (RFC 7386), ``application/json-patch+json``
  (RFC 6902; a failed ``test`` op gives 422 and not 500), ``application/strategic-merge-patch+json``
  (associative lists merged by key, see approximations), and **server-side apply**
  (``application/apply-patch+yaml``): creates a missing object (201), requires ``fieldManager``
  (422 otherwise), records ``metadata.managedFields``, removes fields the same manager applied
  before and no longer applies, reports conflicts with other managers (409) unless ``force=true``,
  merges associative lists item by item (``containers`` and ``env`` by name, ``ports`` by port and
  protocol, ``volumes`` by name, ``ownerReferences`` by uid, ...) and set-lists (``finalizers``) by
  value, and answers ``?dryRun=All`` with the result without storing it.
  Also ``PUT`` (replace). A ``metadata.resourceVersion`` in a PUT/patch/apply body that differs
  from the stored one gives 409 Conflict (optimistic concurrency).
* **Subresources**: ``/status`` writes change only ``status``; writes to the main resource ignore
  ``status`` when the resource declares a status subresource; on create such a ``status`` is
  dropped. ``/scale`` (``autoscaling/v1`` Scale) reads and writes through configurable paths.
* **DELETE** honours finalizers (``deletionTimestamp`` and a generation bump first, removal once
  the finalizers are gone), ``propagationPolicy`` (``Foreground`` adds the ``foregroundDeletion``
  finalizer, ``Orphan`` the ``orphan`` finalizer), ``preconditions``, and collection deletes.
  :meth:`ApiServerEmulator.collect_garbage` plays the garbage collector on demand.
* **Fault injection that rejects without mutation** (:meth:`ApiServerEmulator.inject_error`),
  returning a proper ``Status`` body and ``Retry-After``; a watch ``ERROR 410`` for new or open
  watch streams.
* **A write counter** for benchmarks (:meth:`ApiServerEmulator.writes`; dry runs counted apart,
  :meth:`ApiServerEmulator.dry_runs`), and the open watches (:meth:`ApiServerEmulator.watching`).
* ``GET/POST /api/v1/namespaces`` works (kmock 0.8's URL parser raises on it), so kopf can run
  with namespace scanning enabled.

Approximations (where this is *not* a real apiserver; keep these in mind when reading a test):

* **Server-side apply** tracks ownership per *leaf path*: nested maps are merged key by key, and
  the items of associative lists and set-lists through ``k:{...}``/``v:...`` path elements, as in
  the real ``fieldsV1``. Which lists are associative, and their keys, comes from one table by field
  name (``LIST_MAP_KEYS``), not from per-kind schemas; every other list is atomic. Key fields that
  the apiserver defaults (a port's ``protocol``) are assumed at their default. An apply merges the
  intent into the object. Fields that the same manager's previous apply owned
  and the new intent omits are removed, unless another manager also owns them. Maps emptied that
  way are pruned below the top level (``spec`` stays, ``metadata.labels`` goes). Conflicts are
  detected against other managers (Apply and Update) when a co-owned leaf (or a prefix of it)
  would get a different value; ``force=true`` takes ownership. Non-apply writes take ownership of
  the leaves they change, under ``fieldManager`` or, like the real server, a manager named after
  the User-Agent's product (``kopf``, ``kmock``, ...). Internal writes (GC) record no ownership.
  An apply to ``/scale`` is treated as a merge-patch.
* **Strategic merge patch** merges like an apply without ownership (no ``$patch`` directives, no
  ``$setElementOrder``; list items are never deleted by it).
* **No defaulting, schema validation, admission, quotas, RBAC, namespace existence checks,
  namespace-deletion cascades or pod lifecycle.** Garbage collection happens only when a test
  calls ``collect_garbage()``. The ``fieldSelector`` accepts any dotted path (the real server only
  a few per kind). ``dryRun`` is honoured for writes.
* The event history is kept in memory up to ``watch_history`` events; list ``continue`` tokens are
  kept for the emulator's lifetime.

Objects are stored in kmock's ``objects`` array, one history entry per committed write, so tests
can assert on ``kmock.objects[res, ns, name]`` and ``.history`` as usual. Objects put into
``kmock.objects`` directly get server metadata on the next request; prefer :meth:`seed`.
All state changes happen synchronously, without ``await``, so they are atomic in the event loop.

kmock's own reactions still work and take precedence, but unlike plain kmock, a request answered
by a reaction (``kmock['patch', kmock.resource(...)] << 500``) is *not* applied to the state: the
emulation runs only for requests that reach it. Prefer :meth:`ApiServerEmulator.inject_error`
for faults. Resources must be declared (:meth:`ApiServerEmulator.declare`); undeclared ones get 404.

kopf 1.45.2 runs against it, unmodified, inside the real operator process (tests/operator): with its
default login from a kubeconfig, resource and namespace scanning, standalone and in peering mode.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import datetime
import json
import random
import re
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Final, Literal

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal.rendering import Response as KmockResponse  # KmockResponse, but not in its __all__

__all__ = ["ApiError", "ApiServerEmulator", "InjectedError", "ScalePaths"]

Body = dict[str, Any]
Path = tuple[str, ...]
ObjectKey = tuple[kmock.resource, str | None, str]

APPLY_PATCH: Final = "application/apply-patch+yaml"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"

DEFAULT_VERBS: Final = frozenset({"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"})
MUTATING_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# Metadata fields that only the server sets: user writes to them are ignored (the stored values are kept).
SERVER_METADATA: Final = frozenset(
    {
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    }
)
# Fields that identify an object rather than being its content: nobody "owns" them in managedFields.
_UNOWNED_METADATA: Final = SERVER_METADATA | {"name", "namespace", "generateName"}

_REASONS: Final = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_NAME_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's generateName alphabet
_MISSING: Final = object()


# ---------------------------------------------------------------------------------------------
# Errors and Status bodies
# ---------------------------------------------------------------------------------------------


def status_body(
    code: int, message: str, *, reason: str | None = None, details: Mapping[str, Any] | None = None
) -> Body:
    """A ``kind: Status`` failure body, as the apiserver returns with every error."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "details": dict(details or {}),
        "code": code,
    }


class ApiError(Exception):
    """An API error answered with an HTTP status and a Status body; raised by the request handlers."""

    def __init__(
        self, code: int, message: str, *, reason: str | None = None, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.body = status_body(code, message, reason=reason, details=details)


# ---------------------------------------------------------------------------------------------
# Small pure helpers: time, paths, merging, selectors, managedFields
# ---------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _api_version(resource: kmock.resource) -> str:
    return f"{resource.group}/{resource.version}" if resource.group else str(resource.version)


def _qualified(resource: kmock.resource) -> str:
    """E.g. ``widgets.example.test`` or ``configmaps``, as in the apiserver's messages."""
    return f"{resource.plural}.{resource.group}" if resource.group else str(resource.plural)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge-patch: maps merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Associative lists, merged item by item by server-side apply (and strategic merge patch), keyed as the
# Kubernetes schemas declare them (x-kubernetes-list-type: map, x-kubernetes-list-map-keys). Looked up by
# the field's name wherever it is: close enough for the kinds these tests use. Lists not named here are
# atomic (replaced whole: args, command, tolerations, ...), except the set-lists (items are their own key).
LIST_MAP_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "imagePullSecrets": ("name",),
    "resourceClaims": ("name",),
    "hostAliases": ("ip",),
    "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
    "ownerReferences": ("uid",),
    "conditions": ("type",),
}
SET_LISTS: Final = frozenset({"finalizers"})
_ITEM_KEY_DEFAULTS: Final = {"protocol": "TCP"}  # defaulted by the apiserver before lists are merged


def _map_keys(field: str, items: list[Any]) -> tuple[str, ...] | None:
    """The key fields of an associative list named `field`, or None when it is atomic (or a set)."""
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    if field == "ports":  # a container's ports, or a Service's
        return ("containerPort", "protocol") if "containerPort" in items[0] else ("port", "protocol")
    return LIST_MAP_KEYS.get(field)


def _item_element(keys: tuple[str, ...], item: Mapping[str, Any]) -> str:
    """A list item's path element, in FieldsV1 notation: ``k:{"name":"engine"}``."""
    values = {k: item.get(k, _ITEM_KEY_DEFAULTS.get(k)) for k in keys}
    return "k:" + json.dumps(values, sort_keys=True, separators=(",", ":"))


def _set_element(value: Any) -> str:
    return "v:" + json.dumps(value, sort_keys=True, separators=(",", ":"))


def _is_item(element: str) -> bool:
    return element.startswith(("k:", "v:"))


def _find_item(items: list[Any], element: str, field: str) -> int | None:
    """The index of the item a ``k:``/``v:`` path element names, or None."""
    for index, item in enumerate(items):
        if element.startswith("v:") and _set_element(item) == element:
            return index
        keys = _map_keys(field, [item])
        if keys is not None and isinstance(item, dict) and _item_element(keys, item) == element:
            return index
    return None


def _leaf_paths(value: Any, prefix: Path = ()) -> set[Path]:
    """Paths to the leaves: through maps, and through the items of associative and set lists (``k:``/``v:``
    elements). Atomic lists, scalars and empty maps are leaves."""
    if isinstance(value, dict) and value:
        paths: set[Path] = set()
        for key, sub in value.items():
            paths |= _leaf_paths(sub, (*prefix, str(key)))
        return paths
    if isinstance(value, list) and value and prefix:
        if prefix[-1] in SET_LISTS:
            return {(*prefix, _set_element(item)) for item in value}
        keys = _map_keys(prefix[-1], value)
        if keys is not None:
            paths = set()
            for item in value:
                paths |= _leaf_paths(item, (*prefix, _item_element(keys, item)))
            return paths
    return {prefix} if prefix else set()


def _get_path(obj: Any, path: Path) -> Any:
    field = ""
    for key in path:
        if isinstance(obj, list) and _is_item(key):
            index = _find_item(obj, key, field)
            if index is None:
                return _MISSING
            obj = obj[index]
        elif isinstance(obj, dict) and key in obj:
            obj = obj[key]
        else:
            return _MISSING
        field = key
    return obj


def _delete_path(obj: Body, path: Path) -> None:
    """Delete a leaf; prune the maps and list items it leaves empty, except top-level ones like ``spec``.
    The key fields of a list item stay while anything else of the item does (they identify it)."""
    trail: list[tuple[Any, Any]] = []  # (container, key or index) from the top down to the leaf
    node: Any = obj
    field = ""
    for key in path:
        if isinstance(node, list) and _is_item(key):
            index = _find_item(node, key, field)
            if index is None:
                return
            trail.append((node, index))
            node = node[index]
        elif isinstance(node, dict) and key in node:
            trail.append((node, key))
            node = node[key]
        else:
            return
        field = key
    container, last = trail[-1]
    item_keys = _map_keys(path[-3], [container]) if len(path) >= 3 and _is_item(path[-2]) else None
    if isinstance(container, dict) and item_keys and last in item_keys:
        pass  # a key field: removed with its item, below
    else:
        del container[last]
    for depth in range(len(trail) - 1, 1, -1):  # never prune the top level (e.g. `spec`, `metadata`)
        parent, key = trail[depth - 1]
        child = parent[key]
        keys = _map_keys(str(path[depth - 2]), [child]) if depth >= 2 and isinstance(parent, list) else None
        emptied = child in ({}, []) or (keys is not None and set(child) <= set(keys))
        if not emptied:
            break
        del parent[key]


def _apply_merge(live: Any, intent: Any, field: str = "") -> Any:
    """Merge an apply intent (or a strategic merge patch) into an object: maps key by key (``null`` deletes),
    associative lists item by item in the live order (new items appended), set-lists as unions, every
    other value replaced."""
    if isinstance(intent, dict):
        result = dict(live) if isinstance(live, dict) else {}
        for key, value in intent.items():
            if value is None:
                result.pop(key, None)
            else:
                result[key] = _apply_merge(result.get(key), value, str(key))
        return result
    if isinstance(intent, list) and isinstance(live, list):
        if field in SET_LISTS:
            return [*live, *(v for v in intent if v not in live)]
        keys = _map_keys(field, [*live, *intent])
        if keys is not None:
            merged = [copy.deepcopy(item) for item in live]
            for item in intent:
                index = _find_item(merged, _item_element(keys, item), field)
                if index is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[index] = _apply_merge(merged[index], item, "")
            return merged
    return copy.deepcopy(intent)


def _related(a: Path, b: Path) -> bool:
    """Whether one path is a prefix of (or equal to) the other."""
    return a[: len(b)] == b or b[: len(a)] == a


def _dotted(path: str) -> Path:
    """``.spec.replicas`` -> ``('spec', 'replicas')``."""
    return tuple(part for part in path.split(".") if part)


def _set_dotted(obj: Body, path: str, value: Any) -> None:
    *parents, leaf = _dotted(path)
    node = obj
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _owned_paths(body: Body, *, scope: Literal["main", "status", "all"]) -> set[Path]:
    """The leaf paths a write of ``body`` sets, without identity and server-managed fields."""
    paths = set()
    for path in _leaf_paths(body):
        if path[0] in ("apiVersion", "kind"):
            continue
        if path[0] == "metadata" and (len(path) < 2 or path[1] in _UNOWNED_METADATA):
            continue
        if scope == "status" and path[0] != "status":
            continue
        if scope == "main" and path[0] == "status":
            continue
        paths.add(path)
    return paths


def _to_fields_v1(paths: Iterable[Path]) -> Body:
    """Leaf paths -> the (simplified) FieldsV1 notation: ``{'f:spec': {'f:replicas': {}}}``."""
    root: Body = {}
    all_paths = set(paths)
    for path in sorted(all_paths):
        node = root
        for key in path:
            node = node.setdefault(key if _is_item(key) else f"f:{key}", {})
        if any(other != path and other[: len(path)] == path for other in all_paths):
            node["."] = {}  # the node is owned itself *and* has owned children (real FieldsV1 rule)
    return root


def _from_fields_v1(node: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    paths: set[Path] = set()
    for key, child in node.items():
        if key == ".":
            paths.add(prefix)
            continue
        path = (*prefix, key[2:] if key.startswith("f:") else key)
        paths |= _from_fields_v1(child, path) if child else {path}
    return paths


@dataclasses.dataclass
class _ManagedEntry:
    """One ``metadata.managedFields`` entry, with its fieldsV1 unpacked into leaf paths."""

    manager: str
    operation: str  # 'Apply' | 'Update'
    api_version: str
    subresource: str | None
    time: str | None
    paths: set[Path]

    @classmethod
    def load_all(cls, obj: Body) -> list[_ManagedEntry]:
        return [
            cls(
                manager=raw.get("manager", ""),
                operation=raw.get("operation", "Update"),
                api_version=raw.get("apiVersion", ""),
                subresource=raw.get("subresource"),
                time=raw.get("time"),
                paths=_from_fields_v1(raw.get("fieldsV1") or {}),
            )
            for raw in obj.get("metadata", {}).get("managedFields") or []
        ]

    @staticmethod
    def dump_all(entries: Iterable[_ManagedEntry]) -> list[Body]:
        dumped = []
        for entry in entries:
            if not entry.paths:
                continue  # the apiserver drops entries that own nothing
            raw: Body = {"manager": entry.manager, "operation": entry.operation, "apiVersion": entry.api_version}
            if entry.time is not None:
                raw["time"] = entry.time
            raw["fieldsType"] = "FieldsV1"
            raw["fieldsV1"] = _to_fields_v1(entry.paths)
            if entry.subresource:
                raw["subresource"] = entry.subresource
            dumped.append(raw)
        return dumped

    def same_actor(self, manager: str, operation: str, subresource: str | None) -> bool:
        return (self.manager, self.operation, self.subresource) == (manager, operation, subresource)


def _without_times(managed_fields: Any) -> Any:
    if not isinstance(managed_fields, list):
        return managed_fields
    return [{k: v for k, v in entry.items() if k != "time"} for entry in managed_fields if isinstance(entry, dict)]


# Label selectors: (key, operator, values), operator in: '=', '!=', 'in', 'notin', 'exists', '!'.
LabelRequirement = tuple[str, str, frozenset[str]]
_SET_TERM = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)\s*$")
_LABEL_KEY = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _split_selector(selector: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term.strip() for term in terms if term.strip()]


def parse_label_selector(selector: str) -> list[LabelRequirement]:
    """Parse a ``labelSelector`` string; raises ``ValueError`` for syntax errors."""
    requirements: list[LabelRequirement] = []
    for term in _split_selector(selector):
        if match := _SET_TERM.match(term):
            values = frozenset(v.strip() for v in match[3].split(",") if v.strip())
            key, op = match[1], match[2]
        elif term.startswith("!"):
            key, op, values = term[1:].strip(), "!", frozenset()
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            op, values = "!=", frozenset({value})
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=", 1).split("=", 1))
            op, values = "=", frozenset({value})
        else:
            key, op, values = term, "exists", frozenset()
        if not _LABEL_KEY.match(key):
            raise ValueError(f"invalid label key {key!r} in selector {selector!r}")
        requirements.append((key, op, values))
    return requirements


def labels_match(labels: Mapping[str, str], requirements: Iterable[LabelRequirement]) -> bool:
    for key, op, values in requirements:
        present = key in labels
        ok = (
            (op == "=" and present and labels[key] in values)
            or (op == "in" and present and labels[key] in values)
            or (op == "!=" and (not present or labels[key] not in values))
            or (op == "notin" and (not present or labels[key] not in values))
            or (op == "exists" and present)
            or (op == "!" and not present)
        )
        if not ok:
            return False
    return True


FieldRequirement = tuple[Path, bool, str]  # (path, must_equal, value)


def parse_field_selector(selector: str) -> list[FieldRequirement]:
    requirements: list[FieldRequirement] = []
    for term in _split_selector(selector):
        if "!=" in term:
            field, value = term.split("!=", 1)
            equal = False
        elif "=" in term:
            field, value = term.replace("==", "=", 1).split("=", 1)
            equal = True
        else:
            raise ValueError(f"invalid field selector term {term!r}")
        requirements.append((_dotted(field.strip()), equal, value.strip()))
    return requirements


def fields_match(obj: Body, requirements: Iterable[FieldRequirement]) -> bool:
    for path, equal, value in requirements:
        actual = _get_path(obj, path)
        if actual is _MISSING or actual is None:
            text = ""
        elif isinstance(actual, bool):
            text = str(actual).lower()
        else:
            text = str(actual)
        if (text == value) != equal:
            return False
    return True


def _selector_to_string(selector: Any) -> str:
    """A ``LabelSelector`` dict (``matchLabels`` + ``matchExpressions``) as a selector string."""
    if isinstance(selector, str):
        return selector
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr.get("operator"), expr.get("key"), expr.get("values") or []
        match op:
            case "In" | "NotIn":
                terms.append(f"{key} {op.lower()} ({','.join(sorted(values))})")
            case "Exists":
                terms.append(key)
            case "DoesNotExist":
                terms.append(f"!{key}")
    return ",".join(terms)


# ---------------------------------------------------------------------------------------------
# Declarations, faults, URL targets, watch internals
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScalePaths:
    """Where the ``/scale`` subresource reads and writes (the CRD ``subresources.scale`` paths)."""

    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = ".status.selector"  # a string, or a LabelSelector dict (serialised)


@dataclasses.dataclass(eq=False)
class InjectedError:
    """A pending injected fault; see :meth:`ApiServerEmulator.inject_error`."""

    method: str
    resource: kmock.resource
    status: int
    subresource: str | None
    name: str | None
    namespace: str | None
    times: int | None  # None: forever
    retry_after: float | None
    body: Body
    dry_run: bool | None = None  # True: only dry runs, False: only real writes, None: either
    hits: int = 0

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times


@dataclasses.dataclass(frozen=True)
class _Target:
    """What a resource URL addresses: ``/apis/{g}/{v}[/namespaces/{ns}]/{plural}[/{name}[/{sub}]]``."""

    resource: kmock.resource
    namespace: str | None
    name: str | None
    subresource: str | None


def _parse_target(path: str) -> _Target | None:
    """Parse a resource URL; ``None`` for non-resource URLs (discovery, /version, etc)."""
    parts = [part for part in path.split("/") if part]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    # `/namespaces/{ns}/{plural}/...` is a namespaced URL -- except `/api/v1/namespaces/{ns}/status`
    # and `.../finalize`, which are the Namespace object's own subresources.
    namespace_own_subresource = group == "" and len(rest) == 3 and rest[2] in ("status", "finalize")
    if rest[0] == "namespaces" and len(rest) >= 3 and not namespace_own_subresource:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return _Target(kmock.resource(group, version, plural), namespace, name, subresource)


@dataclasses.dataclass(frozen=True)
class _Event:
    rv: int
    resource: kmock.resource
    type: str  # ADDED | MODIFIED | DELETED
    obj: Body
    old: Body | None  # the previous state for MODIFIED (needed for selector transitions)


@dataclasses.dataclass(eq=False)
class _WatchSession:
    """One open watch stream: its filters and the queue the emulator pushes new events into."""

    resource: kmock.resource
    namespace: str | None
    name: str | None
    labels: list[LabelRequirement]
    fields: list[FieldRequirement]
    host: str = ""  # the Host header the client used (which server of the emulator it reached)
    queue: asyncio.Queue[_Event | None] = dataclasses.field(default_factory=lambda: asyncio.Queue())

    def in_scope(self, obj: Body) -> bool:
        meta = obj.get("metadata", {})
        return (self.namespace is None or meta.get("namespace") == self.namespace) and (
            self.name is None or meta.get("name") == self.name
        )

    def selects(self, obj: Body) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return self.in_scope(obj) and labels_match(labels, self.labels) and fields_match(obj, self.fields)

    def render(self, event: _Event) -> Body | None:
        """The event as this watcher sees it, or ``None`` if it is not selected."""
        if event.resource != self.resource:
            return None
        new_ok = self.selects(event.obj)
        if event.type != "MODIFIED":
            return {"type": event.type, "object": event.obj} if new_ok else None
        old_ok = event.old is not None and self.selects(event.old)
        if new_ok:
            return {"type": "MODIFIED" if old_ok else "ADDED", "object": event.obj}
        if old_ok and event.old is not None:
            # As the watch cache does: the old content, but with the event's resourceVersion.
            gone = copy.deepcopy(event.old)
            gone["metadata"]["resourceVersion"] = str(event.rv)
            return {"type": "DELETED", "object": gone}
        return None


# ---------------------------------------------------------------------------------------------
# The emulator
# ---------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's ``KubernetesEmulator`` with the apiserver semantics kopf and controllers rely on."""

    random_seed: int = 0  # for uids and generated names, so that runs are reproducible
    watch_history: int | None = 10_000  # events kept for watch resumption; older resourceVersions get 410

    _rv: int = attrs.field(default=0, init=False)
    _rng: random.Random = attrs.field(
        init=False, default=attrs.Factory(lambda self: random.Random(self.random_seed), takes_self=True)
    )
    _scale: dict[kmock.resource, ScalePaths] = attrs.field(factory=dict, init=False)
    _event_log: collections.deque[_Event] = attrs.field(factory=collections.deque, init=False)
    _compacted_rv: int = attrs.field(default=0, init=False)  # events up to this rv are forgotten
    _watchers: set[_WatchSession] = attrs.field(factory=set, init=False)
    _faults: list[InjectedError] = attrs.field(factory=list, init=False)
    _write_counts: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    _list_snapshots: dict[str, tuple[str, list[Body]]] = attrs.field(factory=dict, init=False)
    _dry_run_counts: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    _without_generation: set[kmock.resource] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        # Keep kmock's discovery endpoints and its 404 for unknown URLs, but not KubernetesEmulator's
        # own object handlers: every resource URL is served by `_serve` (as a fallback, so user
        # reactions such as `kmock['get', ...] << {...}` still take precedence over the emulation).
        kmock.KubernetesScaffold.__attrs_post_init__(self)
        self.fallback[self._is_resource_request] << self._serve

    # -- public API: declarations ---------------------------------------------------------------

    def declare(
        self,
        group_version_plural: str,
        kind: str,
        *,
        namespaced: bool = True,
        subresources: Iterable[str] = (),
        scale_paths: ScalePaths | None = None,
        verbs: Iterable[str] = DEFAULT_VERBS,
        shortnames: Iterable[str] = (),
        categories: Iterable[str] = (),
        generation: bool = True,
    ) -> kmock.resource:
        """Declare a served resource, e.g. ``declare('example.test/v1/widgets', 'Widget', subresources={'status'})``.
        ``generation=False`` for kinds without ``metadata.generation`` (ConfigMaps, Services, Secrets, ...;
        custom resources always have one)."""
        resource = kmock.resource(group_version_plural)
        if resource.group is None or resource.version is None or not resource.plural:
            raise ValueError(f'Expected "group/version/plural" or "v1/plural", got {group_version_plural!r}')
        subresources = set(subresources)
        self.resources[resource] = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            singular=kind.lower(),
            verbs=set(verbs),
            shortnames=set(shortnames),
            categories=set(categories),
            subresources=subresources,
        )
        if not generation:
            self._without_generation.add(resource)
        if "scale" in subresources:
            self._scale[resource] = scale_paths or ScalePaths()
        elif scale_paths is not None:
            raise ValueError('scale_paths given, but "scale" is not among the subresources')
        return resource

    def declare_builtin(self) -> None:
        """Declare what kopf needs (namespaces, events, CRDs, peerings) and the usual children kinds."""
        self.declare(
            "v1/namespaces",
            "Namespace",
            namespaced=False,
            subresources={"status"},
            shortnames={"ns"},
            generation=False,
        )
        self.declare("v1/events", "Event", shortnames={"ev"}, generation=False)
        self.declare("v1/configmaps", "ConfigMap", shortnames={"cm"}, generation=False)
        self.declare("v1/secrets", "Secret", generation=False)
        self.declare("v1/services", "Service", subresources={"status"}, shortnames={"svc"}, generation=False)
        self.declare("v1/serviceaccounts", "ServiceAccount", shortnames={"sa"}, generation=False)
        self.declare("v1/pods", "Pod", subresources={"status"}, shortnames={"po"})  # generation since 1.33
        for plural, kind in [("deployments", "Deployment"), ("statefulsets", "StatefulSet")]:
            self.declare(
                f"apps/v1/{plural}",
                kind,
                subresources={"status", "scale"},
                scale_paths=ScalePaths(label_selector=".spec.selector"),
            )
        self.declare("networking.k8s.io/v1/networkpolicies", "NetworkPolicy", shortnames={"netpol"})
        self.declare(
            "policy/v1/poddisruptionbudgets", "PodDisruptionBudget", subresources={"status"}, shortnames={"pdb"}
        )
        self.declare("coordination.k8s.io/v1/leases", "Lease", generation=False)
        self.declare(
            "apiextensions.k8s.io/v1/customresourcedefinitions",
            "CustomResourceDefinition",
            namespaced=False,
            subresources={"status"},
            shortnames={"crd", "crds"},
        )
        # kopf's peering resources (no status subresource in kopf's peering.yaml).
        self.declare("kopf.dev/v1/kopfpeerings", "KopfPeering")
        self.declare("kopf.dev/v1/clusterkopfpeerings", "ClusterKopfPeering", namespaced=False)

    # -- public API: state ------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion (of the latest write)."""
        return str(self._rv)

    def get_object(self, resource: str | kmock.resource, namespace: str | None, name: str) -> Body | None:
        """A deep copy of the current state of an object, or ``None`` if it does not exist."""
        return self._current((kmock.resource(resource), namespace, name))

    def seed(self, resource: str | kmock.resource, body: Body) -> Body:
        """
        Create an object directly, as if POSTed, but keeping its ``status``; emits ADDED. Returns it.

        The fields are owned by the field manager ``seed`` (so an apply of other values without
        ``force`` conflicts with them, as with any pre-existing object made by someone else).
        """
        res = kmock.resource(resource)
        info = self._require_info(res)
        namespace = body.get("metadata", {}).get("namespace") if info.namespaced else None
        target = _Target(res, namespace, None, None)
        return self._create(target, info, body, manager="seed", keep_status=True)

    def collect_garbage(self) -> list[ObjectKey]:
        """
        Do what the garbage collector would do now; return the keys of the objects deleted.

        * Owners being deleted with the ``orphan`` finalizer: strip the owner references to them from
          their dependents, then remove the finalizer.
        * Owners being deleted with ``foregroundDeletion``: delete their dependents; once none are
          left, remove the finalizer.
        * Every object whose owner references all point to uids that no longer exist is deleted
          (in the background; finalizers of the dependents are honoured).

        Repeats until nothing changes, so cascades (owner -> child -> grandchild) are followed.
        """
        deleted: list[ObjectKey] = []
        while self._gc_step(deleted):
            pass
        return deleted

    def _gc_step(self, deleted: list[ObjectKey]) -> bool:
        """One garbage-collector action on a fresh view of the objects; False when there is nothing to do."""
        live = {obj["metadata"]["uid"]: (key, obj) for key, obj in self._live_objects()}
        dependents: dict[str, dict[ObjectKey, Body]] = collections.defaultdict(dict)
        for key, obj in live.values():
            for ref in obj["metadata"].get("ownerReferences") or []:
                dependents[ref.get("uid")][key] = obj

        for uid, (key, obj) in live.items():
            finalizers = list(obj["metadata"].get("finalizers") or [])
            if not obj["metadata"].get("deletionTimestamp"):
                continue
            deps = dependents.get(uid, {})
            if "orphan" in finalizers:
                for dep_key, dep in deps.items():
                    new = copy.deepcopy(dep)
                    refs = [ref for ref in dep["metadata"]["ownerReferences"] if ref.get("uid") != uid]
                    new["metadata"]["ownerReferences"] = refs
                    if not refs:
                        del new["metadata"]["ownerReferences"]
                    self._commit_update(dep_key, self._require_info(dep_key[0]), dep, new)
                finalizers.remove("orphan")
                self._set_finalizers(key, obj, finalizers, deleted)
                return True
            if "foregroundDeletion" in finalizers:
                pending = {k: d for k, d in deps.items() if not d["metadata"].get("deletionTimestamp")}
                for dep_key, dep in pending.items():
                    if self._delete_object(dep_key, dep, policy="Background") is None:
                        deleted.append(dep_key)
                if pending:
                    return True
                if not deps:  # all dependents are gone (not just being deleted): release the owner
                    finalizers.remove("foregroundDeletion")
                    self._set_finalizers(key, obj, finalizers, deleted)
                    return True

        for key, obj in live.values():
            refs = obj["metadata"].get("ownerReferences") or []
            if refs and not obj["metadata"].get("deletionTimestamp") and not any(r.get("uid") in live for r in refs):
                if self._delete_object(key, obj, policy="Background") is None:
                    deleted.append(key)
                return True
        return False

    # -- public API: faults ---------------------------------------------------------------------

    def inject_error(
        self,
        method: str,
        plural: str,
        status: int,
        *,
        subresource: str | None = None,
        times: int | None = 1,
        retry_after: float | None = None,
        name: str | None = None,
        namespace: str | None = None,
        reason: str | None = None,
        message: str | None = None,
        dry_run: bool | None = None,
    ) -> InjectedError:
        """
        Make the next ``times`` matching requests fail with ``status``, before any state change.

        ``method`` is ``GET`` (one object), ``LIST``, ``WATCH``, ``POST``, ``PUT``, ``PATCH``,
        ``DELETE`` or ``*``. ``plural`` is ``"configmaps"``, or any kmock resource notation such as
        ``"example.test/v1/widgets"``. ``subresource=None`` matches the main resource only
        (``"*"`` matches any). ``times=None`` means forever. The response carries a ``kind: Status``
        body; with ``retry_after``, also a ``Retry-After`` header and ``details.retryAfterSeconds``
        (a 429 gets ``retry_after=1`` unless given, as the apiserver's throttling always says).
        A ``WATCH`` with 410 is answered like the apiserver does for an expired resourceVersion:
        HTTP 200 with one ``ERROR`` event carrying the 410 Status. ``dry_run=True`` matches only
        ``?dryRun=All`` writes, ``False`` only real ones. Returns a handle with ``.hits``.
        """
        method = method.upper()
        if status == 429 and retry_after is None:
            retry_after = 1
        if method not in {"GET", "LIST", "WATCH", "POST", "PUT", "PATCH", "DELETE", "*"}:
            raise ValueError(f"Unsupported method for fault injection: {method!r}")
        resource = kmock.resource(plural)
        what = f'{_qualified(resource)} "{name or "..."}"'
        default_messages = {
            409: f"Operation cannot be fulfilled on {what}: the object has been modified; "
            f"please apply your changes to the latest version and try again",
            410: "too old resource version (injected)",
            429: "Too many requests, please try again later (injected).",
        }
        details: Body = {"retryAfterSeconds": int(retry_after)} if retry_after is not None else {}
        body = status_body(
            status, message or default_messages.get(status, f"Injected error {status}"), reason=reason, details=details
        )
        fault = InjectedError(
            method=method,
            resource=resource,
            status=status,
            subresource=subresource,
            name=name,
            namespace=namespace,
            times=times,
            retry_after=retry_after,
            body=body,
            dry_run=dry_run,
        )
        self._faults.append(fault)
        return fault

    def clear_errors(self) -> None:
        """Forget all injected errors, used up or not."""
        self._faults.clear()

    def expire_watches(self, plural: str | None = None, *, compact: bool = True) -> int:
        """
        End the open watch streams (of one resource, or all) with an ``ERROR`` 410 Expired event.

        With ``compact=True`` (default) the event history is also dropped, like an etcd compaction:
        any watch resuming from an older resourceVersion then gets 410 too, so the client must
        re-list (kopf does). Returns how many open streams were expired.
        """
        resource = kmock.resource(plural) if plural is not None else None
        if compact:
            self._compacted_rv = self._rv
            self._event_log.clear()
        sessions = [s for s in self._watchers if resource is None or resource.check(s.resource)]
        for session in sessions:
            session.queue.put_nowait(None)  # the expiry marker
        return len(sessions)

    # -- public API: write counter --------------------------------------------------------------

    def writes(self, *, by_method: bool = False) -> collections.Counter[str]:
        """
        Mutating requests received (POST/PUT/PATCH/DELETE), including rejected ones, but not dry runs
        (which store nothing), as a Counter keyed ``"plural"`` or ``"plural/subresource"``
        (``"PATCH plural/status"`` with ``by_method``).
        """
        return self._totals(self._write_counts, by_method)

    def dry_runs(self, *, by_method: bool = False) -> collections.Counter[str]:
        """Mutating requests with ``?dryRun=All``, counted like :meth:`writes`."""
        return self._totals(self._dry_run_counts, by_method)

    @staticmethod
    def _totals(counts: collections.Counter[str], by_method: bool) -> collections.Counter[str]:
        if by_method:
            return collections.Counter(counts)
        totals: collections.Counter[str] = collections.Counter()
        for key, count in counts.items():
            totals[key.split(" ", 1)[1]] += count
        return totals

    def reset_writes(self) -> None:
        self._write_counts.clear()
        self._dry_run_counts.clear()

    def watching(self, plural: str, *, host: str | None = None) -> int:
        """How many watch streams of a resource are open (from clients that reached `host`, if given)."""
        resource = kmock.resource(plural)
        return sum(1 for s in self._watchers if resource.check(s.resource) and host in (None, s.host))

    # -- request entry points -------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.path.rstrip("/") != "/api/v1/namespaces":
            return await super().__call__(raw_request)

        # kmock 0.8's URL parser raises ValueError on exactly this URL (the cluster-wide namespace
        # collection), so kopf's namespace observer and `kubectl get ns` would get a 500. Record the
        # request the way kmock does and handle it like any other.
        body = await raw_request.read()
        text = body.decode("utf-8", errors="replace")
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        watch = raw_request.query.get("watch") == "true"
        action = (
            kmock.action.WATCH
            if raw_request.method == "GET" and watch
            else kmock.action.LIST
            if raw_request.method == "GET"
            else kmock.action.CREATE
            if raw_request.method == "POST"
            else None
        )
        request = kmock.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=text,
            data=data,
            action=action,
            resource=kmock.resource("", "v1", "namespaces"),
        )
        self._requests.append(request)
        try:
            return await self._handle(request)
        except Exception as e:  # as kmock does: accumulate for `strict` and answer 500
            if not self._errors:
                raise
            self._errors[-1].append(e)
            return await self._render_error(e)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        target = _parse_target(request.url.path)
        if target is not None:
            self._adopt_foreign_objects()
            verb = self._verb(request, target)
            dry_run = self._dry_run(request)
            if verb in MUTATING_METHODS:
                plural = str(target.resource.plural)
                where = f"{plural}/{target.subresource}" if target.subresource else plural
                (self._dry_run_counts if dry_run else self._write_counts)[f"{verb} {where}"] += 1
            fault = self._take_fault(verb, target, dry_run)
            if fault is not None:
                return await self._fault_response(fault, verb)(request)
        # Skip KubernetesEmulator._handle (which mutates state itself); go to the reaction matching.
        response: aiohttp.web.StreamResponse = await super(kmock.KubernetesEmulator, self)._handle(request)
        return response

    def _is_resource_request(self, request: kmock.Request) -> bool:
        return _parse_target(request.url.path) is not None

    def _serve(self, request: kmock.Request) -> KmockResponse:
        """Serve one resource request. Synchronous on purpose: every state change is atomic."""
        target = _parse_target(request.url.path)
        assert target is not None  # guaranteed by _is_resource_request
        try:
            status, payload = self._dispatch(request, target)
        except ApiError as e:
            status, payload = e.code, e.body
        return KmockResponse(status=status, payload=payload)

    def _dispatch(self, request: kmock.Request, target: _Target) -> tuple[int, Any]:
        info = self._require_info(target.resource)
        self._check_scope(target, info)
        if target.subresource is not None and target.subresource not in info.subresources:
            raise ApiError(
                404,
                f"the server could not find the requested resource "
                f"({_qualified(target.resource)}/{target.subresource})",
            )
        method, name = self._verb(request, target), target.name
        if method == "WATCH":
            return 200, self._watch(request, target, info)
        if method == "LIST":
            return 200, self._list(request, target, info)
        if method == "GET":
            current = self._require(target)
            return 200, self._scale_of(target.resource, current) if target.subresource == "scale" else current
        if method == "POST" and name is None:
            body = self._require_dict(self._body_data(request))
            return 201, self._create(target, info, body, manager=self._manager(request), dry_run=self._dry_run(request))
        if method == "PUT" and name is not None:
            return 200, self._replace(request, target, info)
        if method == "PATCH" and name is not None:
            return self._patch(request, target, info)
        if method == "DELETE" and name is not None:
            return 200, self._delete(request, target)
        if method == "DELETE":
            return 200, self._delete_collection(request, target, info)
        raise ApiError(405, f"{method} is not supported on {request.url.path}")

    # -- reads ----------------------------------------------------------------------------------

    def _list(self, request: kmock.Request, target: _Target, info: kmock.ResourceInfo) -> Body:
        params = request.params
        token = params.get("continue")
        if token:
            if token not in self._list_snapshots:
                raise ApiError(
                    410,
                    "The provided continue parameter is too old to display a consistent "
                    "list result. You can start a new list without the continue parameter.",
                )
            list_rv, items = self._list_snapshots[token]
            offset = int(token.rsplit(":", 1)[1])
        else:
            labels, fields = self._selectors(request)
            list_rv, offset = str(self._rv), 0
            items = [
                obj
                for _, obj in self._live_objects(target.resource, target.namespace)
                if labels_match(obj["metadata"].get("labels") or {}, labels) and fields_match(obj, fields)
            ]
        limit_param = params.get("limit", "")
        limit = int(limit_param) if limit_param.isdigit() and int(limit_param) > 0 else None
        end = len(items) if limit is None else min(len(items), offset + limit)
        metadata: Body = {"resourceVersion": list_rv}
        if end < len(items):
            next_token = f"{len(self._list_snapshots)}:{end}"
            self._list_snapshots[next_token] = (list_rv, items)
            metadata["continue"] = next_token
            metadata["remainingItemCount"] = len(items) - end
        return {
            "apiVersion": _api_version(target.resource),
            "kind": f"{info.kind}List",
            "metadata": metadata,
            "items": items[offset:end],
        }

    def _watch(self, request: kmock.Request, target: _Target, info: kmock.ResourceInfo) -> AsyncIterator[Any]:
        params = request.params
        since_param = params.get("resourceVersion") or "0"
        if not since_param.isdigit():
            raise ApiError(400, f"invalid resource version: {since_param!r}")
        labels, fields = self._selectors(request)
        session = _WatchSession(
            resource=target.resource,
            namespace=target.namespace,
            name=target.name,
            labels=labels,
            fields=fields,
            host=self._header(request, "Host"),
        )
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        initial = params.get("sendInitialEvents") == "true"
        return self._watch_stream(session, info, since=int(since_param), initial=initial, timeout=timeout)

    async def _watch_stream(
        self, session: _WatchSession, info: kmock.ResourceInfo, *, since: int, initial: bool, timeout: float | None
    ) -> AsyncIterator[Any]:
        yield b""  # make kmock send the HTTP headers right away, even if no events follow

        # The starting point and the subscription are taken together, with no `await` in between,
        # so no write can fall between them (kmock 0.8 marked its bus only after the snapshot).
        backlog: list[Body]
        if since == 0 or initial:  # "any"/"most recent": synthetic ADDED for the current state
            backlog = [
                {"type": "ADDED", "object": obj}
                for _, obj in self._live_objects(session.resource)
                if session.selects(obj)
            ]
            if initial:
                backlog.append(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "apiVersion": _api_version(session.resource),
                            "kind": info.kind,
                            "metadata": {
                                "resourceVersion": str(self._rv),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    }
                )
        elif since < self._compacted_rv:
            yield self._gone_event(since)
            return
        else:  # "exact": replay the history after `since`
            backlog = [
                rendered
                for event in self._event_log
                if event.rv > since and (rendered := session.render(event)) is not None
            ]
        self._watchers.add(session)
        try:
            for item in backlog:
                yield item
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return  # timeoutSeconds: the server closes the stream; clients reconnect
                try:
                    event = await asyncio.wait_for(session.queue.get(), remaining)
                except TimeoutError:
                    return
                if event is None:  # expired by expire_watches()
                    yield self._gone_event(since)
                    return
                rendered = session.render(event)
                if rendered is not None:
                    yield rendered
        finally:
            self._watchers.discard(session)

    def _gone_event(self, since: int) -> Body:
        message = f"too old resource version: {since} ({self._compacted_rv})"
        return {"type": "ERROR", "object": status_body(410, message, reason="Expired")}

    def _selectors(self, request: kmock.Request) -> tuple[list[LabelRequirement], list[FieldRequirement]]:
        try:
            labels = parse_label_selector(request.params.get("labelSelector", ""))
            fields = parse_field_selector(request.params.get("fieldSelector", ""))
        except ValueError as e:
            raise ApiError(400, f"unable to parse requirement: {e}") from e
        return labels, fields

    def _scale_of(self, resource: kmock.resource, obj: Body) -> Body:
        paths = self._scale[resource]
        meta = obj["metadata"]
        spec_replicas = _get_path(obj, _dotted(paths.spec_replicas))
        status_replicas = _get_path(obj, _dotted(paths.status_replicas))
        status: Body = {"replicas": status_replicas if isinstance(status_replicas, int) else 0}
        if paths.label_selector is not None:
            selector = _get_path(obj, _dotted(paths.label_selector))
            if selector is not _MISSING and selector is not None:
                status["selector"] = _selector_to_string(selector)
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                key: meta[key]
                for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if key in meta
            },
            "spec": {"replicas": spec_replicas if isinstance(spec_replicas, int) else 0},
            "status": status,
        }

    # -- writes: create, replace, patch, apply ---------------------------------------------------

    def _create(
        self,
        target: _Target,
        info: kmock.ResourceInfo,
        body: Body,
        *,
        manager: str,
        operation: str = "Update",
        keep_status: bool = False,
        dry_run: bool = False,
    ) -> Body:
        obj = copy.deepcopy(body)
        self._check_type(obj, target.resource, info)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "metadata must be an object")
        if info.namespaced:
            if target.namespace and meta.get("namespace") and meta["namespace"] != target.namespace:
                raise ApiError(
                    400, "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = target.namespace or meta.get("namespace")
            if not meta["namespace"]:
                raise ApiError(400, "the namespace is required for a namespaced resource")
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "metadata.name: Required value: name or generateName is required")
            meta["name"] = self._generate_name(target.resource, meta.get("namespace"), meta["generateName"])
        key: ObjectKey = (target.resource, meta.get("namespace"), meta["name"])
        if self._current(key) is not None:
            raise ApiError(
                409,
                f'{_qualified(target.resource)} "{meta["name"]}" already exists',
                reason="AlreadyExists",
                details={"name": meta["name"], "group": target.resource.group, "kind": target.resource.plural},
            )

        for field in SERVER_METADATA:
            meta.pop(field, None)
        meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = _now()
        if target.resource not in self._without_generation:
            meta["generation"] = 1
        if "status" in info.subresources and not keep_status:
            obj.pop("status", None)
        scope: Literal["main", "all"] = "main" if "status" in info.subresources and not keep_status else "all"
        meta["managedFields"] = _ManagedEntry.dump_all(
            [
                _ManagedEntry(
                    manager=manager,
                    operation=operation,
                    api_version=_api_version(target.resource),
                    subresource=None,
                    time=meta["creationTimestamp"],
                    paths=_owned_paths(obj, scope=scope),
                )
            ]
        )
        if not meta["managedFields"]:
            del meta["managedFields"]
        if target.resource == kmock.resource("v1/namespaces"):
            obj.setdefault("status", {}).setdefault("phase", "Active")  # no namespace controller here
        if dry_run:
            return obj
        meta["resourceVersion"] = self._next_rv()
        self._store(key, obj)
        self._publish("ADDED", target.resource, obj, None)
        return obj

    def _replace(self, request: kmock.Request, target: _Target, info: kmock.ResourceInfo) -> Body:
        key, current = self._key(target), self._require(target)
        body = self._require_dict(self._body_data(request))
        if target.subresource == "scale":
            return self._write_scale(request, target, current, body)
        self._check_type(body, target.resource, info)
        self._check_identity(body, target)
        self._check_precondition(body, current, target)
        new = self._scoped(current, body, info, target.subresource)
        self._track_update(current, new, self._manager(request), target)
        return self._commit_update(key, info, current, new, dry_run=self._dry_run(request))

    def _patch(self, request: kmock.Request, target: _Target, info: kmock.ResourceInfo) -> tuple[int, Body]:
        content_type = self._content_type(request)
        if content_type == APPLY_PATCH and target.subresource != "scale":
            return self._server_side_apply(request, target, info)
        if "force" in request.params and content_type != APPLY_PATCH:
            raise ApiError(422, "force: Forbidden: may not be specified for non-apply patch", reason="Invalid")
        current = self._require(target)
        # What the patch applies to: the whole object, or the Scale view of it.
        base = self._scale_of(target.resource, current) if target.subresource == "scale" else current
        candidate = self._apply_patch(content_type, base, request)
        if target.subresource == "scale":
            return 200, self._write_scale(request, target, current, candidate)
        self._check_precondition(candidate, current, target)
        new = self._scoped(current, candidate, info, target.subresource)
        self._track_update(current, new, self._manager(request), target)
        return 200, self._commit_update(self._key(target), info, current, new, dry_run=self._dry_run(request))

    def _apply_patch(self, content_type: str, base: Body, request: kmock.Request) -> Body:
        if content_type in (MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH):
            patch = self._require_dict(self._body_data(request))
            result = _apply_merge(base, patch) if content_type == STRATEGIC_PATCH else merge_patch(base, patch)
            assert isinstance(result, dict)
            return result
        if content_type == JSON_PATCH:
            ops = self._body_data(request)
            if not isinstance(ops, list):
                raise ApiError(400, "a JSON patch must be a list of operations")
            try:
                result = jsonpatch.apply_patch(copy.deepcopy(base), ops)
            except jsonpatch.InvalidJsonPatch as e:
                raise ApiError(400, f"invalid JSON patch: {e}") from e
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                # Including JsonPatchTestFailed: kopf relies on 422 here (kmock 0.8 answered 500).
                raise ApiError(
                    422, f"the server rejected our request due to an error in our request: {e}", reason="Invalid"
                ) from e
            if not isinstance(result, dict):
                raise ApiError(422, "the patched object is not an object", reason="Invalid")
            return result
        raise ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types "
            f"include: {JSON_PATCH}, {MERGE_PATCH}, {APPLY_PATCH}, {STRATEGIC_PATCH} "
            f"(got {content_type or 'no content type'!r})",
        )

    def _server_side_apply(self, request: kmock.Request, target: _Target, info: kmock.ResourceInfo) -> tuple[int, Body]:
        manager = request.params.get("fieldManager")
        if not manager:
            raise ApiError(
                422,
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
                reason="Invalid",
            )
        force = request.params.get("force") in ("true", "1")
        intent = self._require_dict(self._body_data(request))
        if not intent.get("apiVersion") or not intent.get("kind"):
            raise ApiError(400, "invalid object type: apiVersion and kind must be set in an apply patch")
        self._check_type(intent, target.resource, info)
        self._check_identity(intent, target)
        dry_run = self._dry_run(request)

        current = self._current(self._key(target))
        if current is None:
            if target.subresource is not None:
                raise self._not_found(target)
            intent.setdefault("metadata", {})["name"] = target.name
            return 201, self._create(target, info, intent, manager=manager, operation="Apply", dry_run=dry_run)

        self._check_precondition(intent, current, target)
        # Which part of the intent this endpoint applies: only `status` on /status; no `status` on the main
        # endpoint if there is a status subresource; never the identity or server-managed metadata.
        scope: Literal["main", "status", "all"] = (
            "status" if target.subresource == "status" else "main" if "status" in info.subresources else "all"
        )
        if scope == "status":
            scoped_intent = {"status": intent["status"]} if "status" in intent else {}
        else:
            scoped_intent = {k: v for k, v in intent.items() if not (scope == "main" and k == "status")}
            scoped_intent["metadata"] = {
                k: v for k, v in (intent.get("metadata") or {}).items() if k not in _UNOWNED_METADATA
            }
        new_paths = _owned_paths(scoped_intent, scope=scope)

        # Conflicts: another manager owns a related path and the intent would set a different value.
        entries = _ManagedEntry.load_all(current)
        conflicts: list[tuple[_ManagedEntry, Path]] = []
        for entry in entries:
            if entry.manager == manager:
                continue
            for owned in entry.paths:
                for path in new_paths:
                    if _related(owned, path):
                        shorter = owned if len(owned) <= len(path) else path
                        if _get_path(current, shorter) != _get_path(intent, shorter):
                            conflicts.append((entry, owned))
        if conflicts and not force:
            fields = sorted({"." + ".".join(path) for _, path in conflicts})
            managers = sorted({entry.manager for entry, _ in conflicts})
            message = (
                f"Apply failed with {len(fields)} conflict(s): conflict with "
                f"{', '.join(repr(m) for m in managers)}: {', '.join(fields)}"
            )
            raise ApiError(
                409,
                message,
                reason="Conflict",
                details={
                    "causes": [
                        {
                            "reason": "FieldManagerConflict",
                            "field": f,
                            "message": f"conflict with {', '.join(managers)}",
                        }
                        for f in fields
                    ]
                },
            )
        for entry, owned in conflicts:  # force: the applier takes the ownership
            entry.paths.discard(owned)

        # Merge the intent, then drop what this manager applied before but no longer applies.
        new = _apply_merge(current, scoped_intent)
        assert isinstance(new, dict)
        mine = next((e for e in entries if e.same_actor(manager, "Apply", target.subresource)), None)
        if mine is None:
            mine = _ManagedEntry(
                manager=manager,
                operation="Apply",
                api_version=_api_version(target.resource),
                subresource=target.subresource,
                time=None,
                paths=set(),
            )
            entries.append(mine)
        kept: set[Path] = set(new_paths).union(*(e.paths for e in entries if e is not mine))
        for path in sorted(mine.paths - new_paths, key=len, reverse=True):
            if not any(_related(path, other) for other in kept):  # nobody else owns it, and not re-applied
                _delete_path(new, path)
        mine.paths = new_paths
        new = self._scoped(current, new, info, target.subresource)
        new["metadata"]["managedFields"] = _ManagedEntry.dump_all(entries)
        self._stamp(new, manager, "Apply", target.subresource)
        return 200, self._commit_update(self._key(target), info, current, new, dry_run=dry_run)

    def _write_scale(self, request: kmock.Request, target: _Target, current: Body, scale: Body) -> Body:
        if scale.get("kind", "Scale") != "Scale":
            raise ApiError(400, f"expected a Scale object, got kind {scale.get('kind')!r}")
        replicas = scale.get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiError(
                422,
                f'Scale.autoscaling "{target.name}" is invalid: spec.replicas: Invalid value: '
                f"{replicas!r}: must be a non-negative integer",
                reason="Invalid",
            )
        self._check_precondition(scale, current, target)
        info = self._require_info(target.resource)
        new = copy.deepcopy(current)
        _set_dotted(new, self._scale[target.resource].spec_replicas, replicas)
        self._track_update(current, new, self._manager(request), target)
        committed = self._commit_update(self._key(target), info, current, new, dry_run=self._dry_run(request))
        return self._scale_of(target.resource, committed)

    # -- writes: delete -------------------------------------------------------------------------

    def _delete(self, request: kmock.Request, target: _Target) -> Body:
        key, current = self._key(target), self._require(target)
        options = request.data if isinstance(request.data, dict) else {}
        preconditions = options.get("preconditions") or {}
        meta = current["metadata"]
        if preconditions.get("uid") not in (None, meta["uid"]):
            raise ApiError(
                409,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, UID in object meta: {meta['uid']}",
            )
        if preconditions.get("resourceVersion") not in (None, meta["resourceVersion"]):
            raise ApiError(
                409,
                f"Precondition failed: ResourceVersion in precondition: "
                f"{preconditions['resourceVersion']}, ResourceVersion in object meta: "
                f"{meta['resourceVersion']}",
            )
        policy = request.params.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
        if policy not in ("Background", "Foreground", "Orphan"):
            raise ApiError(422, f"propagationPolicy: Unsupported value: {policy!r}", reason="Invalid")
        if self._dry_run(request):
            return current
        result = self._delete_object(key, current, policy=policy)
        return result if result is not None else self._last_seen(key)

    def _delete_collection(self, request: kmock.Request, target: _Target, info: kmock.ResourceInfo) -> Body:
        labels, fields = self._selectors(request)
        policy = request.params.get("propagationPolicy") or "Background"
        for key, obj in self._live_objects(target.resource, target.namespace):
            selected = labels_match(obj["metadata"].get("labels") or {}, labels) and fields_match(obj, fields)
            if selected and not self._dry_run(request):
                self._delete_object(key, obj, policy=policy)
        return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success"}

    def _delete_object(self, key: ObjectKey, current: Body, *, policy: str) -> Body | None:
        """Delete now, or mark for deletion if finalizers block it. Returns the marked object or None."""
        if current["metadata"].get("deletionTimestamp"):
            return current  # already being deleted; the finalizers' owners will finish it
        finalizers = list(current["metadata"].get("finalizers") or [])
        policy_finalizer = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}.get(policy)
        if policy_finalizer and policy_finalizer not in finalizers:
            finalizers.append(policy_finalizer)
        if not finalizers:
            self._remove(key, current)
            return None
        new = copy.deepcopy(current)
        new["metadata"]["finalizers"] = finalizers
        new["metadata"]["deletionTimestamp"] = _now()
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        if "generation" in current["metadata"]:
            new["metadata"]["generation"] = current["metadata"]["generation"] + 1  # as the apiserver does
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._store(key, new)
        self._publish("MODIFIED", key[0], new, current)
        return new

    def _set_finalizers(self, key: ObjectKey, current: Body, finalizers: list[str], deleted: list[ObjectKey]) -> None:
        new = copy.deepcopy(current)
        new["metadata"]["finalizers"] = finalizers
        if not finalizers:
            del new["metadata"]["finalizers"]
        self._commit_update(key, self._require_info(key[0]), current, new)
        if self._current(key) is None:
            deleted.append(key)

    # -- the write pipeline ---------------------------------------------------------------------

    def _scoped(self, current: Body, candidate: Body, info: kmock.ResourceInfo, subresource: str | None) -> Body:
        """Limit a write to what its endpoint may change, and keep the server-managed metadata."""
        if subresource == "status":
            new = copy.deepcopy(current)
            if "status" in candidate:
                new["status"] = candidate["status"]
            else:
                new.pop("status", None)
        else:
            new = candidate
            if "status" in info.subresources:  # the main endpoint ignores status changes
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            meta = new["metadata"] = {}
        for field in ("name", "namespace", *SERVER_METADATA):
            if field in current["metadata"]:
                meta[field] = copy.deepcopy(current["metadata"][field])
            else:
                meta.pop(field, None)
        new["apiVersion"], new["kind"] = current.get("apiVersion"), current.get("kind")
        if meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(current["metadata"].get("finalizers") or [])
            if added:
                raise ApiError(
                    422,
                    f"metadata.finalizers: Forbidden: no new finalizers can be added if the "
                    f"object is being deleted, found new finalizers {sorted(added)!r}",
                    reason="Invalid",
                )
        return new

    def _track_update(self, current: Body, new: Body, manager: str, target: _Target) -> None:
        """Non-apply writes take ownership of the leaves they change (like the apiserver's Update entries)."""
        scope: Literal["main", "status", "all"] = "status" if target.subresource == "status" else "all"
        new_leaves, old_leaves = _owned_paths(new, scope=scope), _owned_paths(current, scope=scope)
        changed = {p for p in new_leaves if _get_path(current, p) != _get_path(new, p)}
        removed = {p for p in old_leaves if _get_path(new, p) is _MISSING}
        entries = _ManagedEntry.load_all(current)
        for entry in entries:
            entry.paths = {p for p in entry.paths if not any(_related(p, q) for q in changed | removed)}
        if changed:
            mine = next((e for e in entries if e.same_actor(manager, "Update", target.subresource)), None)
            if mine is None:
                mine = _ManagedEntry(
                    manager=manager,
                    operation="Update",
                    api_version=_api_version(target.resource),
                    subresource=target.subresource,
                    time=None,
                    paths=set(),
                )
                entries.append(mine)
            mine.paths |= changed
        new["metadata"]["managedFields"] = _ManagedEntry.dump_all(entries)
        if not new["metadata"]["managedFields"]:
            del new["metadata"]["managedFields"]
        self._stamp(new, manager, "Update", target.subresource)

    @staticmethod
    def _stamp(new: Body, manager: str, operation: str, subresource: str | None) -> None:
        """Time-stamp the acting manager's entry. (A no-op write is not stored, so old times stay.)"""
        for raw in new["metadata"].get("managedFields") or []:
            if (raw["manager"], raw["operation"], raw.get("subresource")) == (manager, operation, subresource):
                raw["time"] = _now()

    @staticmethod
    def _differs(current: Body, new: Body) -> bool:
        def strip(obj: Body) -> Body:
            stripped = copy.copy(obj)
            stripped["metadata"] = dict(obj.get("metadata") or {})
            stripped["metadata"]["managedFields"] = _without_times(stripped["metadata"].get("managedFields"))
            return stripped

        return strip(current) != strip(new)

    def _commit_update(
        self, key: ObjectKey, info: kmock.ResourceInfo, current: Body, new: Body, *, dry_run: bool = False
    ) -> Body:
        """Persist an update: generation, resourceVersion, the event; deletion if finalizers are gone."""
        if not self._differs(current, new):
            return current  # a no-op write: no new resourceVersion, no event (as on a real apiserver)
        ignored = {"metadata", "status"} if "status" in info.subresources else {"metadata"}
        keys = (set(current) | set(new)) - ignored
        if "generation" in current["metadata"] and any(current.get(k) != new.get(k) for k in keys):
            new["metadata"]["generation"] = current["metadata"]["generation"] + 1
        if dry_run:
            return new
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._store(key, new)
        self._publish("MODIFIED", key[0], new, current)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self._remove(key, new)
        return new

    def _remove(self, key: ObjectKey, current: Body) -> None:
        final = copy.deepcopy(current)
        final["metadata"]["resourceVersion"] = self._next_rv()
        self._objects[key].history.append(final)  # the last state, as served in the DELETE response
        self._objects[key].delete()
        self._publish("DELETED", key[0], final, None)

    def _store(self, key: ObjectKey, obj: Body) -> None:
        snapshot = copy.deepcopy(obj)
        if key in self._objects:
            self._objects[key].history.append(snapshot)
        else:
            self._objects[key] = snapshot

    def _publish(self, event_type: str, resource: kmock.resource, obj: Body, old: Body | None) -> None:
        event = _Event(
            rv=int(obj["metadata"]["resourceVersion"]),
            resource=resource,
            type=event_type,
            obj=copy.deepcopy(obj),
            old=copy.deepcopy(old) if old is not None else None,
        )
        if self.watch_history is not None and len(self._event_log) >= self.watch_history:
            self._compacted_rv = self._event_log.popleft().rv
        self._event_log.append(event)
        for session in self._watchers:
            if session.resource == resource:
                session.queue.put_nowait(event)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # -- lookups and request details --------------------------------------------------------------

    def _require_info(self, resource: kmock.resource) -> kmock.ResourceInfo:
        if resource not in self.resources:
            raise ApiError(
                404,
                f"the server could not find the requested resource ({_qualified(resource)}); "
                f"declare it with emulator.declare(...)",
            )
        return self.resources[resource]

    def _check_scope(self, target: _Target, info: kmock.ResourceInfo) -> None:
        if not info.namespaced and target.namespace is not None:
            raise ApiError(404, f"{_qualified(target.resource)} is cluster-scoped; no namespace in the URL")
        if info.namespaced and target.namespace is None and target.name is not None:
            raise ApiError(404, f"{_qualified(target.resource)} is namespaced; the URL needs a namespace")

    def _check_type(self, body: Body, resource: kmock.resource, info: kmock.ResourceInfo) -> None:
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version not in (None, _api_version(resource)) or kind not in (None, info.kind):
            raise ApiError(
                400,
                f"the API version in the data ({api_version}/{kind}) does not match the "
                f"expected API version ({_api_version(resource)}/{info.kind})",
            )
        body["apiVersion"], body["kind"] = _api_version(resource), info.kind

    @staticmethod
    def _check_identity(body: Body, target: _Target) -> None:
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, target.name):
            raise ApiError(
                400, f"the name of the object ({meta['name']}) does not match the name on the URL ({target.name})"
            )
        if target.namespace and meta.get("namespace") not in (None, target.namespace):
            raise ApiError(400, "the namespace of the provided object does not match the namespace sent on the request")

    @staticmethod
    def _check_precondition(body: Body, current: Body, target: _Target) -> None:
        """Optimistic concurrency: a resourceVersion in the body must match the stored one."""
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                f"Operation cannot be fulfilled on {_qualified(target.resource)} "
                f'"{target.name}": the object has been modified; please apply your changes '
                f"to the latest version and try again",
                reason="Conflict",
                details={"name": target.name, "group": target.resource.group, "kind": target.resource.plural},
            )

    def _key(self, target: _Target) -> ObjectKey:
        assert target.name is not None
        return target.resource, target.namespace, target.name

    def _current(self, key: ObjectKey) -> Body | None:
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(self._objects[key].raw)  # never share dicts with the stored versions

    def _last_seen(self, key: ObjectKey) -> Body:
        return self._objects[key].last.raw

    def _require(self, target: _Target) -> Body:
        current = self._current(self._key(target))
        if current is None:
            raise self._not_found(target)
        return current

    @staticmethod
    def _not_found(target: _Target) -> ApiError:
        return ApiError(
            404,
            f'{_qualified(target.resource)} "{target.name}" not found',
            details={"name": target.name, "group": target.resource.group, "kind": target.resource.plural},
        )

    def _live_objects(
        self, resource: kmock.resource | None = None, namespace: str | None = None
    ) -> list[tuple[ObjectKey, Body]]:
        """Existing objects (deep copies), sorted by namespace and name (as etcd keys are)."""
        found = [
            (key, copy.deepcopy(obj.raw))
            for key, obj in self._objects.items()
            if not obj.deleted
            and (resource is None or key[0] == resource)
            and (namespace is None or key[1] == namespace)
        ]
        return sorted(found, key=lambda item: (item[0][1] or "", item[0][2]))

    def _generate_name(self, resource: kmock.resource, namespace: str | None, prefix: str) -> str:
        while True:
            name = prefix + "".join(self._rng.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5))
            if self._current((resource, namespace, name)) is None:
                return name

    def _adopt_foreign_objects(self) -> None:
        """Give server metadata to objects a test put into `kmock.objects` directly (and emit ADDED)."""
        for key, obj in list(self._objects.items()):
            if obj.deleted or key[0] not in self.resources:
                continue
            raw = obj.raw
            if isinstance(raw.get("metadata"), dict) and raw["metadata"].get("resourceVersion"):
                continue
            body = copy.deepcopy(raw)
            body.setdefault("metadata", {}).update({"name": key[2], "namespace": key[1]})
            del obj.history[-1]
            if not obj.history:
                del self._objects[key]
            self.seed(key[0], body)

    @staticmethod
    def _verb(request: kmock.Request, target: _Target) -> str:
        """GET (one object), LIST, WATCH, or the HTTP method as is."""
        method = str(request.method.value)
        if method == "GET" and request.params.get("watch") in ("true", "1"):
            return "WATCH"
        if method == "GET" and target.name is None:
            return "LIST"
        return method

    def _take_fault(self, verb: str, target: _Target, dry_run: bool) -> InjectedError | None:
        for fault in self._faults:
            if fault.exhausted or fault.dry_run not in (None, dry_run):
                continue
            if fault.method not in ("*", verb) or not fault.resource.check(target.resource):
                continue
            if fault.subresource != "*" and fault.subresource != target.subresource:
                continue
            if fault.name is not None and fault.name != target.name:
                continue
            if fault.namespace is not None and fault.namespace != target.namespace:
                continue
            fault.hits += 1
            return fault
        return None

    @staticmethod
    def _fault_response(fault: InjectedError, verb: str) -> KmockResponse:
        if verb == "WATCH" and fault.status == 410:  # as the apiserver does: in-stream ERROR event
            return KmockResponse(status=200, payload=({"type": "ERROR", "object": copy.deepcopy(fault.body)},))
        headers = {"Retry-After": str(int(fault.retry_after))} if fault.retry_after is not None else None
        return KmockResponse(status=fault.status, payload=copy.deepcopy(fault.body), headers=headers)

    @staticmethod
    def _header(request: kmock.Request, name: str) -> str:
        for key, value in request.headers.items():
            if key.lower() == name.lower():
                return value
        return ""

    def _content_type(self, request: kmock.Request) -> str:
        return self._header(request, "Content-Type").split(";", 1)[0].strip().lower()

    def _manager(self, request: kmock.Request) -> str:
        """``fieldManager``, or (as the apiserver does) the product part of the User-Agent."""
        manager = request.params.get("fieldManager")
        if manager:
            return manager
        user_agent = self._header(request, "User-Agent")
        return user_agent.split("/", 1)[0].split(" ", 1)[0] or "unknown"

    @staticmethod
    def _dry_run(request: kmock.Request) -> bool:
        return bool(request.params.get("dryRun"))

    @staticmethod
    def _body_data(request: kmock.Request) -> Any:
        """The request body: JSON (parsed by kmock) or YAML (apply patches may be YAML)."""
        if request.data is not None:
            return request.data
        try:
            return yaml.safe_load(request.text) if request.text else None
        except yaml.YAMLError as e:
            raise ApiError(400, f"the request body is neither JSON nor YAML: {e}") from e

    @staticmethod
    def _require_dict(data: Any) -> Body:
        if not isinstance(data, dict):
            raise ApiError(400, f"expected an object in the request body, got {type(data).__name__}")
        return copy.deepcopy(data)  # never modify kmock's request log

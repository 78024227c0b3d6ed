"""
Tests of the API server emulator itself (``tests/kube/emulator.py``).

Each feature is exercised through plain HTTP against the kmock server, as kopf or a controller
would use it. kopf itself runs against it in tests/operator, inside the real operator process.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import kmock
import pytest

from tests.kube.emulator import ApiServerEmulator, ScalePaths

# strict=True: any exception inside the emulator (a bug, not an API error) fails the test at teardown.
pytestmark = pytest.mark.kmock(cls=ApiServerEmulator, strict=True)

WIDGETS = "example.test/v1/widgets"
NS_URL = "/apis/example.test/v1/namespaces/ns1/widgets"
CM_URL = "/api/v1/namespaces/ns1/configmaps"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}
STRATEGIC = "application/strategic-merge-patch+json"
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture()
def emulator(kmock: ApiServerEmulator) -> ApiServerEmulator:
    kmock.declare_builtin()
    kmock.declare(WIDGETS, "Widget", subresources={"status", "scale"})
    kmock.declare("example.test/v1/plainthings", "PlainThing")  # no subresources at all
    return kmock


async def call(
    em: ApiServerEmulator,
    method: str,
    url: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """One request; returns (HTTP status, parsed JSON body, response headers)."""
    data = json.dumps(body) if body is not None else None
    headers = {"Content-Type": "application/json", **(headers or {})} if body is not None else headers
    async with em.request(method, url, data=data, headers=headers, params=params) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


async def create(em: ApiServerEmulator, name: str, *, url: str = NS_URL, **fields: Any) -> dict[str, Any]:
    status, body, _ = await call(em, "POST", url, {"metadata": {"name": name, **fields.pop("metadata", {})}, **fields})
    assert status == 201, body
    return dict(body)


async def read_events(resp: aiohttp.ClientResponse, count: int, timeout: float = 3) -> list[dict[str, Any]]:
    """Read up to `count` watch events (fewer if the server closes the stream)."""
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while len(events) < count:
            line = await resp.content.readline()
            if not line:
                break
            if line.strip():
                events.append(json.loads(line))
    return events


def existing(em: ApiServerEmulator, resource: str, namespace: str | None, name: str) -> dict[str, Any]:
    obj = em.get_object(resource, namespace, name)
    assert obj is not None, f"{resource} {namespace}/{name} does not exist"
    return obj


def has(actual: dict[str, Any], pattern: dict[str, Any]) -> bool:
    """kmock's partial matching: every key of `pattern` is in `actual` with an equal value (recursively)."""
    return kmock.ObjectVersion(actual) >= pattern


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["type"], e["object"].get("metadata", {}).get("name")) for e in events]


# -------------------------------------------------------------------------------------------------
# Server-assigned metadata and generation
# -------------------------------------------------------------------------------------------------


async def test_create_assigns_server_metadata(emulator: ApiServerEmulator) -> None:
    w1 = await create(emulator, "w1", spec={"size": 1})
    w2 = await create(emulator, "w2", spec={"size": 1})
    meta = w1["metadata"]
    assert re.fullmatch(r"[0-9a-f-]{36}", meta["uid"]) and meta["uid"] != w2["metadata"]["uid"]
    assert TIMESTAMP.match(meta["creationTimestamp"])
    assert meta["generation"] == 1
    assert int(w2["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert (w1["apiVersion"], w1["kind"]) == ("example.test/v1", "Widget")
    assert emulator.objects[WIDGETS, "ns1", "w1"] >= {"metadata": {"uid": meta["uid"]}}

    status, body, _ = await call(emulator, "POST", NS_URL, {"metadata": {"name": "w1"}})
    assert (status, body["kind"], body["reason"]) == (409, "Status", "AlreadyExists")

    status, body, _ = await call(emulator, "POST", CM_URL, {"metadata": {"generateName": "cfg-"}})
    assert status == 201 and re.fullmatch(r"cfg-[a-z0-9]{5}", body["metadata"]["name"])
    status, body, _ = await call(emulator, "POST", CM_URL, {"metadata": {}})
    assert (status, body["reason"]) == (422, "Invalid")
    status, body, _ = await call(emulator, "POST", CM_URL, {"metadata": {"name": "x", "namespace": "other"}})
    assert status == 400

    # dryRun: the full answer, nothing stored.
    status, body, _ = await call(emulator, "POST", NS_URL, {"metadata": {"name": "dry"}}, params={"dryRun": "All"})
    assert status == 201 and body["metadata"]["uid"] and emulator.get_object(WIDGETS, "ns1", "dry") is None


async def test_generation_changes_only_with_spec(emulator: ApiServerEmulator) -> None:
    w1 = await create(emulator, "w1", spec={"size": 1})
    rv0 = int(w1["metadata"]["resourceVersion"])

    _, body, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"size": 2}}, headers=MERGE)
    assert body["metadata"]["generation"] == 2
    rv1 = int(body["metadata"]["resourceVersion"])
    assert rv1 > rv0

    _, body, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", {"metadata": {"labels": {"a": "b"}}}, headers=MERGE)
    assert body["metadata"]["generation"] == 2 and int(body["metadata"]["resourceVersion"]) > rv1

    _, body, _ = await call(emulator, "PATCH", f"{NS_URL}/w1/status", {"status": {"ready": True}}, headers=MERGE)
    assert body["metadata"]["generation"] == 2 and body["status"] == {"ready": True}
    rv2 = body["metadata"]["resourceVersion"]

    # A write that changes nothing is a no-op: no new resourceVersion (and no watch event).
    _, body, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"size": 2}}, headers=MERGE)
    assert body["metadata"]["resourceVersion"] == rv2 and emulator.resource_version == rv2

    # Kinds without a generation (ConfigMaps, Services, Secrets, ...) never get one.
    cm = await create(emulator, "cfg", url=CM_URL, data={"a": "1"})
    _, body, _ = await call(emulator, "PATCH", f"{CM_URL}/cfg", {"data": {"a": "2"}}, headers=MERGE)
    assert "generation" not in cm["metadata"] and "generation" not in body["metadata"]

    # The CRD rule: without a status subresource, every change outside `metadata` (status too) counts.
    await create(emulator, "p1", url="/apis/example.test/v1/namespaces/ns1/plainthings", spec={"a": 1})
    _, body, _ = await call(
        emulator, "PATCH", "/apis/example.test/v1/namespaces/ns1/plainthings/p1", {"status": {"x": 1}}, headers=MERGE
    )
    assert body["metadata"]["generation"] == 2 and body["status"] == {"x": 1}


# -------------------------------------------------------------------------------------------------
# LIST
# -------------------------------------------------------------------------------------------------


async def test_list_has_kind_version_and_collection_resource_version(emulator: ApiServerEmulator) -> None:
    await create(emulator, "w1")
    await create(emulator, "w2", url="/apis/example.test/v1/namespaces/ns2/widgets")
    status, body, _ = await call(emulator, "GET", NS_URL)
    assert status == 200
    assert (body["kind"], body["apiVersion"]) == ("WidgetList", "example.test/v1")
    assert body["metadata"]["resourceVersion"] == emulator.resource_version
    assert [item["metadata"]["name"] for item in body["items"]] == ["w1"]

    _, body, _ = await call(emulator, "GET", "/apis/example.test/v1/widgets")  # all namespaces
    assert [item["metadata"]["name"] for item in body["items"]] == ["w1", "w2"]
    _, body, _ = await call(emulator, "GET", "/api/v1/namespaces/ns1/configmaps")
    assert (body["kind"], body["apiVersion"], body["items"]) == ("ConfigMapList", "v1", [])


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("app=web", ["a", "b"]),
        ("app==web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("tier", ["a", "c"]),
        ("!tier", ["b", "d"]),
        ("app in (web,db)", ["a", "b", "c"]),
        ("app notin (web)", ["c", "d"]),
        ("app=web,tier=front", ["a"]),
        ("app in (web, db),!tier", ["b"]),
    ],
)
async def test_list_label_selectors(emulator: ApiServerEmulator, selector: str, expected: list[str]) -> None:
    await create(emulator, "a", metadata={"labels": {"app": "web", "tier": "front"}})
    await create(emulator, "b", metadata={"labels": {"app": "web"}})
    await create(emulator, "c", metadata={"labels": {"app": "db", "tier": "back"}})
    await create(emulator, "d")
    _, body, _ = await call(emulator, "GET", NS_URL, params={"labelSelector": selector})
    assert [item["metadata"]["name"] for item in body["items"]] == expected


async def test_list_field_selector_bad_selector_and_chunking(emulator: ApiServerEmulator) -> None:
    for name in ["a", "b", "c", "d", "e"]:
        await create(emulator, name)
    _, body, _ = await call(emulator, "GET", NS_URL, params={"fieldSelector": "metadata.name=c"})
    assert [item["metadata"]["name"] for item in body["items"]] == ["c"]
    _, body, _ = await call(emulator, "GET", NS_URL, params={"fieldSelector": "metadata.name!=c"})
    assert len(body["items"]) == 4

    status, body, _ = await call(emulator, "GET", NS_URL, params={"labelSelector": "a in (b"})
    assert (status, body["reason"]) == (400, "BadRequest")

    # Chunks come from one snapshot, with one resourceVersion, even if objects change in between.
    _, first, _ = await call(emulator, "GET", NS_URL, params={"limit": "2"})
    await create(emulator, "aa")
    names = [item["metadata"]["name"] for item in first["items"]]
    token = first["metadata"]["continue"]
    assert first["metadata"]["remainingItemCount"] == 3
    while token:
        _, chunk, _ = await call(emulator, "GET", NS_URL, params={"limit": "2", "continue": token})
        assert chunk["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        names += [item["metadata"]["name"] for item in chunk["items"]]
        token = chunk["metadata"].get("continue")
    assert names == ["a", "b", "c", "d", "e"]


# -------------------------------------------------------------------------------------------------
# WATCH
# -------------------------------------------------------------------------------------------------


async def test_watch_from_resource_version_sends_only_later_events(emulator: ApiServerEmulator) -> None:
    await create(emulator, "w1")
    _, listed, _ = await call(emulator, "GET", NS_URL)
    list_rv = listed["metadata"]["resourceVersion"]
    # Changes between LIST and WATCH must not be lost (they are replayed from the history)...
    await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"x": 1}}, headers=MERGE)
    await create(emulator, "w2")
    async with emulator.get(NS_URL, params={"watch": "true", "resourceVersion": list_rv}) as resp:
        assert resp.status == 200
        # ...and what existed at LIST time is not replayed as ADDED.
        assert summary(await read_events(resp, 2)) == [("MODIFIED", "w1"), ("ADDED", "w2")]
        await call(emulator, "DELETE", f"{NS_URL}/w2")
        [event] = await read_events(resp, 1)
        assert summary([event]) == [("DELETED", "w2")]
        assert int(event["object"]["metadata"]["resourceVersion"]) == int(emulator.resource_version)


@pytest.mark.looptime  # the server-side timeoutSeconds passes in fake time
async def test_watch_without_resource_version_starts_with_the_current_state(emulator: ApiServerEmulator) -> None:
    await create(emulator, "w1")
    await create(emulator, "w2")
    params = {"watch": "true", "timeoutSeconds": "1"}
    async with emulator.get(NS_URL, params=params) as resp:
        assert summary(await read_events(resp, 2)) == [("ADDED", "w1"), ("ADDED", "w2")]
        await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"x": 1}}, headers=MERGE)
        assert summary(await read_events(resp, 1)) == [("MODIFIED", "w1")]
        assert await read_events(resp, 1) == []  # timeoutSeconds: the server closes the stream

    async with emulator.get(
        NS_URL, params={"watch": "true", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
    ) as resp:
        events = await read_events(resp, 3)
    assert summary(events)[:2] == [("ADDED", "w1"), ("ADDED", "w2")]
    assert events[2]["type"] == "BOOKMARK"
    assert events[2]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_watch_start_is_atomic_with_concurrent_writes(emulator: ApiServerEmulator) -> None:
    """Whatever is written while a watch starts is either in its initial state or arrives as an event."""
    for attempt in range(10):
        namespace, stop = f"atomic{attempt}", asyncio.Event()

        async def writer(namespace: str = namespace, stop: asyncio.Event = stop) -> None:
            for i in range(1000):  # one new object per event-loop tick, until stopped
                if stop.is_set():
                    return
                emulator.seed(WIDGETS, {"metadata": {"name": f"w{i:04d}", "namespace": namespace}})
                await asyncio.sleep(0)

        task = asyncio.create_task(writer())
        try:
            async with emulator.get(
                f"/apis/example.test/v1/namespaces/{namespace}/widgets", params={"watch": "true"}
            ) as resp:
                names = [e["object"]["metadata"]["name"] for e in await read_events(resp, 50)]
        finally:
            stop.set()
            await task
        assert names == [f"w{i:04d}" for i in range(50)]  # no gaps: nothing lost in between


async def test_watch_label_selector_applies_to_events_and_transitions(emulator: ApiServerEmulator) -> None:
    await create(emulator, "w1", metadata={"labels": {"app": "web"}})
    await create(emulator, "w2", metadata={"labels": {"app": "db"}})
    async with emulator.get(NS_URL, params={"watch": "true", "labelSelector": "app=web"}) as resp:
        assert summary(await read_events(resp, 1)) == [("ADDED", "w1")]
        await call(emulator, "PATCH", f"{NS_URL}/w2", {"spec": {"x": 1}}, headers=MERGE)  # not selected
        await call(emulator, "PATCH", f"{NS_URL}/w1", {"metadata": {"labels": {"app": "db"}}}, headers=MERGE)
        await call(emulator, "PATCH", f"{NS_URL}/w2", {"metadata": {"labels": {"app": "web"}}}, headers=MERGE)
        events = await read_events(resp, 2)
    # Leaving the selection is a DELETED (with the old content), entering it an ADDED.
    assert summary(events) == [("DELETED", "w1"), ("ADDED", "w2")]
    assert events[0]["object"]["metadata"]["labels"] == {"app": "web"}


async def test_watch_gone_for_compacted_history_and_expired_streams(emulator: ApiServerEmulator) -> None:
    w1 = await create(emulator, "w1")
    old_rv = w1["metadata"]["resourceVersion"]
    async with emulator.get(NS_URL, params={"watch": "true", "resourceVersion": old_rv}) as resp:
        await create(emulator, "w2")
        assert summary(await read_events(resp, 1)) == [("ADDED", "w2")]
        assert emulator.expire_watches("widgets") == 1
        events = await read_events(resp, 5)
    assert [e["type"] for e in events] == ["ERROR"]  # and then the stream ends
    expected = {"kind": "Status", "apiVersion": "v1", "code": 410, "reason": "Expired"}
    assert has(events[0]["object"], expected)

    # After the compaction, resuming from an old resourceVersion is "too old" as well.
    async with emulator.get(NS_URL, params={"watch": "true", "resourceVersion": old_rv}) as resp:
        events = await read_events(resp, 5)
    assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)]

    # A bounded history compacts by itself.
    emulator.watch_history = 2
    for name in ["a", "b", "c"]:
        await create(emulator, name)
    async with emulator.get(NS_URL, params={"watch": "true", "resourceVersion": old_rv}) as resp:
        assert [e["type"] for e in await read_events(resp, 5)] == ["ERROR"]


# -------------------------------------------------------------------------------------------------
# Server-side apply
# -------------------------------------------------------------------------------------------------


def cm_intent(data: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "cfg", "namespace": "ns1"}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


async def apply(
    em: ApiServerEmulator, body: Any, *, manager: str | None = "op", force: bool = False, url: str = f"{CM_URL}/cfg"
) -> tuple[int, Any]:
    params = {"fieldManager": manager} if manager else {}
    if force:
        params["force"] = "true"
    status, result, _ = await call(em, "PATCH", url, body, headers=APPLY, params=params)
    return status, result


async def test_apply_creates_and_records_the_field_manager(emulator: ApiServerEmulator) -> None:
    status, body = await apply(emulator, cm_intent({"a": "1"}, labels={"app": "x"}))
    assert status == 201
    assert body["data"] == {"a": "1"} and body["metadata"]["labels"] == {"app": "x"}
    [entry] = body["metadata"]["managedFields"]
    assert has(entry, {"manager": "op", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1"})
    assert entry["fieldsV1"] == {"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {"f:app": {}}}}

    status, body = await apply(emulator, cm_intent({"a": "2"}))
    assert status == 200 and body["data"] == {"a": "2"}

    # YAML bodies work too (the content type says yaml).
    async with emulator.patch(
        f"{CM_URL}/cfg",
        params={"fieldManager": "op"},
        headers=APPLY,
        data='apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: "3"}\n',
    ) as resp:
        assert resp.status == 200 and (await resp.json())["data"] == {"a": "3"}


async def test_apply_requires_field_manager_and_type(emulator: ApiServerEmulator) -> None:
    status, body = await apply(emulator, cm_intent({"a": "1"}), manager=None)
    assert (status, body["reason"]) == (422, "Invalid") and "fieldManager" in body["message"]
    status, body = await apply(emulator, {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    assert status == 400
    status, body = await apply(emulator, {**cm_intent({}), "metadata": {"name": "other"}})
    assert status == 400
    assert emulator.get_object("v1/configmaps", "ns1", "cfg") is None
    # `force` is only for apply patches.
    await apply(emulator, cm_intent({"a": "1"}))
    status, body, _ = await call(
        emulator, "PATCH", f"{CM_URL}/cfg", {"data": {"b": "2"}}, headers=MERGE, params={"force": "true"}
    )
    assert status == 422


async def test_apply_removes_what_the_manager_no_longer_applies(emulator: ApiServerEmulator) -> None:
    await apply(emulator, cm_intent({"a": "1", "b": "2"}, labels={"app": "x", "old": "y"}))
    # Another manager adds its own label: it must survive the next apply of `op`.
    await call(
        emulator,
        "PATCH",
        f"{CM_URL}/cfg",
        {"metadata": {"labels": {"team": "z"}}},
        headers=MERGE,
        params={"fieldManager": "kubectl-label"},
    )
    status, body = await apply(emulator, cm_intent({"a": "1"}, labels={"app": "x"}))
    assert status == 200
    assert body["data"] == {"a": "1"}
    assert body["metadata"]["labels"] == {"app": "x", "team": "z"}
    managers = {(e["manager"], e["operation"]): e["fieldsV1"] for e in body["metadata"]["managedFields"]}
    assert managers[("op", "Apply")] == {"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {"f:app": {}}}}
    assert managers[("kubectl-label", "Update")] == {"f:metadata": {"f:labels": {"f:team": {}}}}

    # Dropping the last label prunes the emptied map.
    status, body = await apply(emulator, cm_intent({"a": "1"}))
    assert body["metadata"]["labels"] == {"team": "z"}


async def test_apply_conflicts_and_force(emulator: ApiServerEmulator) -> None:
    await apply(emulator, cm_intent({"replicas": "1"}))
    # Someone else changes a field `op` owns: they take it over (an Update manager).
    await call(
        emulator,
        "PATCH",
        f"{CM_URL}/cfg",
        {"data": {"replicas": "5"}},
        headers=MERGE,
        params={"fieldManager": "autoscaler"},
    )
    status, body = await apply(emulator, cm_intent({"replicas": "1"}))
    assert (status, body["reason"]) == (409, "Conflict")
    assert has(body["details"]["causes"][0], {"reason": "FieldManagerConflict", "field": ".data.replicas"})
    assert existing(emulator, "v1/configmaps", "ns1", "cfg")["data"] == {"replicas": "5"}  # unchanged

    status, body = await apply(emulator, cm_intent({"replicas": "5"}))  # same value: shared, no conflict
    assert status == 200
    status, body = await apply(emulator, cm_intent({"replicas": "1"}), force=True)
    assert status == 200 and body["data"] == {"replicas": "1"}
    assert [e["manager"] for e in body["metadata"]["managedFields"]] == ["op"]


async def test_apply_respects_status_subresource_and_optimistic_lock(emulator: ApiServerEmulator) -> None:
    intent = {
        "apiVersion": "example.test/v1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 1},
        "status": {"phase": "Fake"},
    }
    status, body = await apply(emulator, intent, url=f"{NS_URL}/w1")
    assert status == 201 and "status" not in body and body["spec"] == {"size": 1}
    status, body = await apply(
        emulator, {**intent, "status": {"phase": "Ready"}}, manager="op-status", url=f"{NS_URL}/w1/status"
    )
    assert status == 200 and body["status"] == {"phase": "Ready"} and body["spec"] == {"size": 1}
    assert {"manager": "op-status", "subresource": "status"}.items() <= body["metadata"]["managedFields"][1].items()

    stale = {**intent, "metadata": {"name": "w1", "resourceVersion": "1"}, "spec": {"size": 2}}
    status, body = await apply(emulator, stale, url=f"{NS_URL}/w1")
    assert (status, body["reason"]) == (409, "Conflict")


DEPLOY_URL = "/apis/apps/v1/namespaces/ns1/deployments"


def deployment_intent(containers: list[dict[str, Any]], **pod: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ns1"},
        "spec": {"replicas": 1, "template": {"spec": {"containers": containers, **pod}}},
    }


def containers_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = body["spec"]["template"]["spec"]["containers"]
    return containers


async def test_apply_merges_associative_lists_by_key(emulator: ApiServerEmulator) -> None:
    """As the apiserver does: containers and env by name, ports by port and protocol; atomic lists replaced."""
    url = f"{DEPLOY_URL}/web"
    engine = {"name": "engine", "image": "v1", "args": ["--a"], "env": [{"name": "A", "value": "1"}]}
    engine["ports"] = [{"containerPort": 8000, "name": "http"}]
    status, body = await apply(emulator, deployment_intent([engine]), url=url)
    assert status == 201
    spec_fields = body["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:template"]["f:spec"]
    assert set(spec_fields["f:containers"]) == {'k:{"name":"engine"}'}
    assert set(spec_fields["f:containers"]['k:{"name":"engine"}']["f:ports"]) == {
        'k:{"containerPort":8000,"protocol":"TCP"}'
    }

    # Someone adds an env var and a sidecar by hand (a strategic merge patch, as kubectl does).
    sidecar = {"name": "sidecar", "image": "s1"}
    edit: dict[str, Any] = {
        "spec": {"template": {"spec": {"containers": [{"name": "engine", "env": [{"name": "B", "value": "2"}]}]}}}
    }
    status, body, _ = await call(emulator, "PATCH", url, edit, headers={"Content-Type": STRATEGIC})
    assert status == 200 and [e["name"] for e in containers_of(body)[0]["env"]] == ["A", "B"]
    edit["spec"]["template"]["spec"]["containers"] = [sidecar]
    await call(emulator, "PATCH", url, edit, headers={"Content-Type": STRATEGIC}, params={"fieldManager": "me"})

    # The same intent again: everything the others added stays, nothing changes.
    before = existing(emulator, "apps/v1/deployments", "ns1", "web")
    status, body = await apply(emulator, deployment_intent([engine]), url=url)
    assert status == 200 and body["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert [c["name"] for c in containers_of(body)] == ["engine", "sidecar"]
    assert containers_of(body)[0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]

    # A hand edit of a field the operator owns is taken back by a forced apply; atomic lists are replaced.
    edit = {"spec": {"template": {"spec": {"containers": [{"name": "engine", "image": "hacked"}]}}}}
    await call(emulator, "PATCH", url, edit, headers={"Content-Type": STRATEGIC}, params={"fieldManager": "me"})
    status, body = await apply(emulator, deployment_intent([{**engine, "args": ["--b"]}]), url=url, force=True)
    assert containers_of(body)[0]["image"] == "v1" and containers_of(body)[0]["args"] == ["--b"]

    # An item the manager no longer applies goes (unless someone else owns part of it).
    slim = {"name": "engine", "image": "v1"}
    status, body = await apply(emulator, deployment_intent([slim]), url=url, force=True)
    engine_now = containers_of(body)[0]
    assert [c["name"] for c in containers_of(body)] == ["engine", "sidecar"]
    assert engine_now["env"] == [{"name": "B", "value": "2"}] and "ports" not in engine_now and "args" not in engine_now


async def test_apply_dry_run_answers_without_storing(emulator: ApiServerEmulator) -> None:
    await apply(emulator, cm_intent({"a": "1"}))
    before = existing(emulator, "v1/configmaps", "ns1", "cfg")
    emulator.reset_writes()
    status, body, _ = await call(
        emulator,
        "PATCH",
        f"{CM_URL}/cfg",
        cm_intent({"a": "2"}),
        headers=APPLY,
        params={"fieldManager": "op", "force": "true", "dryRun": "All"},
    )
    assert status == 200 and body["data"] == {"a": "2"}
    assert existing(emulator, "v1/configmaps", "ns1", "cfg") == before
    dry = {"fieldManager": "op", "dryRun": "All"}
    new = {**cm_intent({"b": "1"}), "metadata": {"name": "new"}}
    status, body, _ = await call(emulator, "PATCH", f"{CM_URL}/new", new, headers=APPLY, params=dry)
    assert status == 201 and emulator.get_object("v1/configmaps", "ns1", "new") is None
    assert emulator.writes() == {} and emulator.dry_runs() == {"configmaps": 2}  # dry runs store nothing

    fault = emulator.inject_error("PATCH", "configmaps", 500, dry_run=True)
    assert (await apply(emulator, cm_intent({"a": "3"})))[0] == 200  # a real write: not this fault's
    status, _, _ = await call(emulator, "PATCH", f"{CM_URL}/cfg", cm_intent({"a": "4"}), headers=APPLY, params=dry)
    assert (status, fault.hits) == (500, 1)


# -------------------------------------------------------------------------------------------------
# Patches, replace, optimistic concurrency
# -------------------------------------------------------------------------------------------------


async def test_json_patch_and_failed_test_op(emulator: ApiServerEmulator) -> None:
    w1 = await create(emulator, "w1", spec={"size": 1})
    rv = w1["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
        {"op": "replace", "path": "/spec/size", "value": 2},
    ]
    status, body, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", ops, headers=JSON_PATCH)
    assert status == 200 and body["metadata"]["finalizers"] == ["x/y"]
    assert body["metadata"]["generation"] == 2 and int(body["metadata"]["resourceVersion"]) > int(rv)

    status, body, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", ops, headers=JSON_PATCH)  # rv is stale now
    assert (status, body["kind"], body["reason"]) == (422, "Status", "Invalid")
    status, body, _ = await call(
        emulator, "PATCH", f"{NS_URL}/w1", [{"op": "remove", "path": "/spec/nope"}], headers=JSON_PATCH
    )
    assert status == 422
    status, body, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {}}, headers={})  # application/json
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")
    status, body, _ = await call(emulator, "PATCH", f"{NS_URL}/nope", {"spec": {}}, headers=MERGE)
    assert (status, body["reason"]) == (404, "NotFound")


async def test_resource_version_mismatch_is_a_conflict(emulator: ApiServerEmulator) -> None:
    w1 = await create(emulator, "w1", spec={"size": 1})
    rv = w1["metadata"]["resourceVersion"]
    status, body, _ = await call(
        emulator, "PATCH", f"{NS_URL}/w1", {"metadata": {"resourceVersion": rv}, "spec": {"size": 2}}, headers=MERGE
    )
    assert status == 200
    status, body, _ = await call(
        emulator, "PATCH", f"{NS_URL}/w1", {"metadata": {"resourceVersion": rv}, "spec": {"size": 3}}, headers=MERGE
    )
    assert (status, body["reason"]) == (409, "Conflict")
    assert existing(emulator, WIDGETS, "ns1", "w1")["spec"] == {"size": 2}


async def test_put_replaces(emulator: ApiServerEmulator) -> None:
    w1 = await create(emulator, "w1", spec={"size": 1, "color": "red"}, metadata={"labels": {"a": "b"}})
    replacement = {
        "metadata": {"name": "w1", "resourceVersion": w1["metadata"]["resourceVersion"]},
        "spec": {"size": 2},
    }
    status, body, _ = await call(emulator, "PUT", f"{NS_URL}/w1", replacement)
    assert status == 200 and body["spec"] == {"size": 2} and "labels" not in body["metadata"]
    assert body["metadata"]["uid"] == w1["metadata"]["uid"] and body["metadata"]["generation"] == 2
    status, body, _ = await call(emulator, "PUT", f"{NS_URL}/w1", replacement)  # stale resourceVersion
    assert status == 409
    status, _, _ = await call(emulator, "PUT", f"{NS_URL}/w2", {"metadata": {"name": "w2"}})
    assert status == 404
    status, _, _ = await call(emulator, "PUT", f"{NS_URL}/w1", {"metadata": {"name": "other"}})
    assert status == 400
    status, _, _ = await call(emulator, "PUT", f"{NS_URL}/w1", {"metadata": {"name": "w1", "namespace": "ns2"}})
    assert status == 400


# -------------------------------------------------------------------------------------------------
# Subresources: status and scale
# -------------------------------------------------------------------------------------------------


async def test_status_subresource_isolation(emulator: ApiServerEmulator) -> None:
    created = await create(emulator, "w1", spec={"size": 1}, status={"phase": "Fake"})
    assert "status" not in created  # dropped on create

    # The main endpoint ignores status; /status ignores everything but status.
    _, body, _ = await call(
        emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"size": 2}, "status": {"phase": "X"}}, headers=MERGE
    )
    assert body["spec"] == {"size": 2} and "status" not in body
    _, body, _ = await call(
        emulator,
        "PATCH",
        f"{NS_URL}/w1/status",
        {"spec": {"size": 99}, "metadata": {"labels": {"x": "y"}}, "status": {"phase": "Ready"}},
        headers=MERGE,
    )
    assert body["spec"] == {"size": 2} and body["status"] == {"phase": "Ready"} and "labels" not in body["metadata"]
    _, body, _ = await call(
        emulator, "PUT", f"{NS_URL}/w1/status", {"metadata": {"name": "w1"}, "spec": {}, "status": {"phase": "Done"}}
    )
    assert body["spec"] == {"size": 2} and body["status"] == {"phase": "Done"}

    # No status subresource: /status does not exist, and status is written through the main endpoint.
    await create(emulator, "p1", url="/apis/example.test/v1/namespaces/ns1/plainthings", status={"a": 1})
    status, _, _ = await call(
        emulator,
        "PATCH",
        "/apis/example.test/v1/namespaces/ns1/plainthings/p1/status",
        {"status": {"a": 2}},
        headers=MERGE,
    )
    assert status == 404
    assert existing(emulator, "example.test/v1/plainthings", "ns1", "p1")["status"] == {"a": 1}


async def test_scale_subresource(emulator: ApiServerEmulator) -> None:
    await create(emulator, "w1", spec={"replicas": 2})
    await call(
        emulator, "PATCH", f"{NS_URL}/w1/status", {"status": {"replicas": 1, "selector": "app=w1"}}, headers=MERGE
    )
    status, scale, _ = await call(emulator, "GET", f"{NS_URL}/w1/scale")
    assert status == 200
    assert has(
        scale,
        {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "spec": {"replicas": 2},
            "status": {"replicas": 1, "selector": "app=w1"},
        },
    )
    assert scale["metadata"]["name"] == "w1"

    status, scale, _ = await call(
        emulator,
        "PATCH",
        f"{NS_URL}/w1/scale",
        {"spec": {"replicas": 4}},
        headers=MERGE,
        params={"fieldManager": "hpa"},
    )
    assert status == 200 and scale["spec"]["replicas"] == 4
    widget = existing(emulator, WIDGETS, "ns1", "w1")
    assert widget["spec"] == {"replicas": 4} and widget["metadata"]["generation"] == 2
    assert {"manager": "hpa", "subresource": "scale"}.items() <= widget["metadata"]["managedFields"][-1].items()

    put = {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": "w1", "resourceVersion": scale["metadata"]["resourceVersion"]},
        "spec": {"replicas": 3},
    }
    status, scale, _ = await call(emulator, "PUT", f"{NS_URL}/w1/scale", put)
    assert status == 200 and scale["spec"]["replicas"] == 3
    status, body, _ = await call(emulator, "PUT", f"{NS_URL}/w1/scale", put)  # stale resourceVersion
    assert body["reason"] == "Conflict"
    assert status == 409
    status, _, _ = await call(emulator, "PATCH", f"{NS_URL}/w1/scale", {"spec": {"replicas": -1}}, headers=MERGE)
    assert status == 422

    # Custom paths; a LabelSelector object is serialised (as for Deployments).
    emulator.declare(
        "example.test/v1/pools",
        "Pool",
        subresources={"scale"},
        scale_paths=ScalePaths(
            spec_replicas=".spec.size", status_replicas=".status.ready", label_selector=".spec.selector"
        ),
    )
    await create(
        emulator,
        "p1",
        url="/apis/example.test/v1/namespaces/ns1/pools",
        spec={
            "size": 3,
            "selector": {"matchLabels": {"app": "p1"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]},
        },
    )
    _, scale, _ = await call(emulator, "GET", "/apis/example.test/v1/namespaces/ns1/pools/p1/scale")
    assert scale["spec"] == {"replicas": 3} and scale["status"] == {"replicas": 0, "selector": "app=p1,tier"}


# -------------------------------------------------------------------------------------------------
# DELETE, finalizers, propagation, garbage collection
# -------------------------------------------------------------------------------------------------


async def test_delete_honours_finalizers(emulator: ApiServerEmulator) -> None:
    await create(emulator, "w1", metadata={"finalizers": ["example.test/cleanup"]})
    async with emulator.get(NS_URL, params={"watch": "true", "resourceVersion": emulator.resource_version}) as resp:
        status, body, _ = await call(emulator, "DELETE", f"{NS_URL}/w1")
        assert status == 200 and TIMESTAMP.match(body["metadata"]["deletionTimestamp"])
        assert body["metadata"]["generation"] == 2  # the apiserver bumps it when deletion starts
        assert emulator.get_object(WIDGETS, "ns1", "w1") is not None

        # No new finalizers while being deleted.
        status, _, _ = await call(
            emulator, "PATCH", f"{NS_URL}/w1", {"metadata": {"finalizers": ["a", "b"]}}, headers=MERGE
        )
        assert status == 422
        await call(emulator, "PATCH", f"{NS_URL}/w1", {"metadata": {"finalizers": None}}, headers=MERGE)
        assert emulator.get_object(WIDGETS, "ns1", "w1") is None
        assert emulator.objects[WIDGETS, "ns1", "w1"].deleted
        assert summary(await read_events(resp, 3)) == [("MODIFIED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]

    status, body, _ = await call(emulator, "DELETE", f"{NS_URL}/w1")
    assert (status, body["reason"]) == (404, "NotFound")


async def test_delete_preconditions_and_collection(emulator: ApiServerEmulator) -> None:
    await create(emulator, "w1", metadata={"labels": {"app": "x"}})
    await create(emulator, "w2", metadata={"labels": {"app": "x"}})
    await create(emulator, "w3")
    status, _, _ = await call(
        emulator, "DELETE", f"{NS_URL}/w1", {"kind": "DeleteOptions", "preconditions": {"resourceVersion": "1"}}
    )
    assert status == 200
    status, _, _ = await call(emulator, "DELETE", f"{NS_URL}/w2", {"preconditions": {"uid": "other"}})
    assert status == 409
    status, _, _ = await call(emulator, "DELETE", NS_URL, params={"labelSelector": "app=x"})
    assert status == 200
    _, body, _ = await call(emulator, "GET", NS_URL)
    assert [item["metadata"]["name"] for item in body["items"]] == ["w3"]


async def owned_configmap(em: ApiServerEmulator, name: str, *owners: dict[str, Any]) -> None:
    refs = [
        {
            "apiVersion": o["apiVersion"],
            "kind": o["kind"],
            "name": o["metadata"]["name"],
            "uid": o["metadata"]["uid"],
            "controller": False,
            "blockOwnerDeletion": True,
        }
        for o in owners
    ]
    await create(em, name, url=CM_URL, metadata={"ownerReferences": refs})


async def test_collect_garbage_background(emulator: ApiServerEmulator) -> None:
    w1, w2 = await create(emulator, "w1"), await create(emulator, "w2")
    await owned_configmap(emulator, "only-w1", w1)
    await owned_configmap(emulator, "both", w1, w2)
    await create(
        emulator,
        "grandchild",
        url=CM_URL,
        metadata={
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "only-w1",
                    "uid": existing(emulator, "v1/configmaps", "ns1", "only-w1")["metadata"]["uid"],
                }
            ]
        },
    )
    assert emulator.collect_garbage() == []  # all owners exist

    await call(emulator, "DELETE", f"{NS_URL}/w1")
    assert emulator.get_object("v1/configmaps", "ns1", "only-w1") is not None  # no GC without asking
    deleted = emulator.collect_garbage()
    assert [name for _, _, name in deleted] == ["only-w1", "grandchild"]  # cascades
    assert emulator.get_object("v1/configmaps", "ns1", "both") is not None  # w2 still owns it


async def test_delete_propagation_foreground_and_orphan(emulator: ApiServerEmulator) -> None:
    w1, w2 = await create(emulator, "w1"), await create(emulator, "w2")
    await owned_configmap(emulator, "c1", w1)
    await owned_configmap(emulator, "c2", w2)

    _, body, _ = await call(emulator, "DELETE", f"{NS_URL}/w1", params={"propagationPolicy": "Foreground"})
    assert body["metadata"]["finalizers"] == ["foregroundDeletion"]
    emulator.collect_garbage()
    assert emulator.get_object("v1/configmaps", "ns1", "c1") is None
    assert emulator.get_object(WIDGETS, "ns1", "w1") is None  # released after its dependents

    _, body, _ = await call(emulator, "DELETE", f"{NS_URL}/w2", {"propagationPolicy": "Orphan"})
    assert body["metadata"]["finalizers"] == ["orphan"]
    emulator.collect_garbage()
    assert emulator.get_object(WIDGETS, "ns1", "w2") is None
    assert "ownerReferences" not in existing(emulator, "v1/configmaps", "ns1", "c2")["metadata"]


# -------------------------------------------------------------------------------------------------
# Fault injection and the write counter
# -------------------------------------------------------------------------------------------------


async def test_injected_errors_reject_without_mutation(emulator: ApiServerEmulator) -> None:
    await create(emulator, "w1", spec={"size": 1})
    rv = emulator.resource_version
    fault = emulator.inject_error("PATCH", "widgets", 500, times=2)
    for _ in range(2):
        status, body, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"size": 2}}, headers=MERGE)
        assert (status, body["kind"], body["code"], body["reason"]) == (500, "Status", 500, "InternalError")
    assert existing(emulator, WIDGETS, "ns1", "w1")["spec"] == {"size": 1} and emulator.resource_version == rv
    status, _, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"size": 2}}, headers=MERGE)
    assert status == 200 and fault.hits == 2

    # Filters: subresource (None = main only), name, method; 429 carries Retry-After.
    emulator.inject_error("PATCH", "widgets", 429, subresource="status", name="w1", retry_after=2)
    status, _, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"size": 3}}, headers=MERGE)
    assert status == 200
    status, body, headers = await call(emulator, "PATCH", f"{NS_URL}/w1/status", {"status": {}}, headers=MERGE)
    assert (status, headers["Retry-After"], body["details"]) == (429, "2", {"retryAfterSeconds": 2})
    emulator.inject_error("POST", "example.test/v1/widgets", 409)
    status, body, _ = await call(emulator, "POST", NS_URL, {"metadata": {"name": "w9"}})
    assert (status, body["reason"]) == (409, "Conflict") and emulator.get_object(WIDGETS, "ns1", "w9") is None
    emulator.inject_error("LIST", "widgets", 503, times=None)
    assert (await call(emulator, "GET", NS_URL))[0] == 503
    assert (await call(emulator, "GET", f"{NS_URL}/w1"))[0] == 200  # GET is a single-object read
    emulator.clear_errors()
    assert (await call(emulator, "GET", NS_URL))[0] == 200


async def test_kmock_reactions_take_precedence_without_mutation(emulator: ApiServerEmulator) -> None:
    await create(emulator, "w1", spec={"size": 1})
    # NB: kmock's slices count all matching requests in the log, so this is "the first PATCH ever".
    emulator["patch", emulator.resource(WIDGETS)][:1] << 500 << {"kind": "Status", "code": 500}
    status, _, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"size": 2}}, headers=MERGE)
    assert status == 500 and existing(emulator, WIDGETS, "ns1", "w1")["spec"] == {"size": 1}
    status, _, _ = await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"size": 2}}, headers=MERGE)
    assert status == 200 and existing(emulator, WIDGETS, "ns1", "w1")["spec"] == {"size": 2}


async def test_injected_watch_gone_is_a_status_event(emulator: ApiServerEmulator) -> None:
    emulator.inject_error("WATCH", "widgets", 410)
    async with emulator.get(NS_URL, params={"watch": "true", "resourceVersion": "1"}) as resp:
        assert resp.status == 200
        events = await read_events(resp, 5)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert has(events[0]["object"], {"kind": "Status", "code": 410, "reason": "Expired", "status": "Failure"})


async def test_open_watches_are_counted(emulator: ApiServerEmulator) -> None:
    assert emulator.watching(WIDGETS) == 0
    async with emulator.get(NS_URL, params={"watch": "true"}) as resp:
        await create(emulator, "w1")
        assert summary(await read_events(resp, 1)) == [("ADDED", "w1")]
        host = resp.request_info.url.host
        assert emulator.watching(WIDGETS) == 1 and emulator.watching("configmaps") == 0
        assert emulator.watching(WIDGETS, host=f"{host}:{resp.request_info.url.port}") == 1
        assert emulator.watching(WIDGETS, host="elsewhere:1") == 0


async def test_write_counter(emulator: ApiServerEmulator) -> None:
    await create(emulator, "w1")
    await call(emulator, "PATCH", f"{NS_URL}/w1", {"spec": {"a": 1}}, headers=MERGE)
    await call(emulator, "PATCH", f"{NS_URL}/w1/status", {"status": {"a": 1}}, headers=MERGE)
    emulator.inject_error("PATCH", "configmaps", 500)
    await apply(emulator, cm_intent({"a": "1"}))  # rejected, but still a write request
    await call(emulator, "GET", NS_URL)  # reads do not count
    assert emulator.writes() == {"widgets": 2, "widgets/status": 1, "configmaps": 1}
    assert emulator.writes(by_method=True) == {
        "POST widgets": 1,
        "PATCH widgets": 1,
        "PATCH widgets/status": 1,
        "PATCH configmaps": 1,
    }
    emulator.reset_writes()
    assert emulator.writes() == {}


# -------------------------------------------------------------------------------------------------
# Discovery, namespaces, seeding
# -------------------------------------------------------------------------------------------------


async def test_discovery_and_namespaces(emulator: ApiServerEmulator) -> None:
    _, body, _ = await call(emulator, "GET", "/apis/example.test/v1")
    names = {r["name"] for r in body["resources"]}
    assert {"widgets", "widgets/status", "widgets/scale", "plainthings"} <= names
    _, body, _ = await call(emulator, "GET", "/apis/kopf.dev/v1")
    assert {r["name"] for r in body["resources"]} == {"kopfpeerings", "clusterkopfpeerings"}

    # kmock 0.8 alone answers 500 to the namespace collection URL.
    status, body, _ = await call(emulator, "POST", "/api/v1/namespaces", {"metadata": {"name": "ns1"}})
    assert status == 201 and body["status"] == {"phase": "Active"} and "namespace" not in body["metadata"]
    _, body, _ = await call(emulator, "GET", "/api/v1/namespaces")
    assert [item["metadata"]["name"] for item in body["items"]] == ["ns1"]
    status, body, _ = await call(emulator, "GET", "/api/v1/namespaces/ns1")
    assert status == 200 and body["kind"] == "Namespace"
    async with emulator.get("/api/v1/namespaces", params={"watch": "true"}) as resp:
        assert summary(await read_events(resp, 1)) == [("ADDED", "ns1")]
    status, _, _ = await call(emulator, "GET", "/apis/example.test/v1/namespaces/ns1/unknowns")
    assert status == 404


async def test_seed_and_objects_put_directly(emulator: ApiServerEmulator) -> None:
    seeded = emulator.seed(WIDGETS, {"metadata": {"name": "w1", "namespace": "ns1"}, "status": {"phase": "Old"}})
    assert seeded["status"] == {"phase": "Old"} and seeded["metadata"]["generation"] == 1
    emulator.objects[WIDGETS, "ns1", "w2"] = {"spec": {"size": 2}}  # kmock's own way: gets adopted
    _, body, _ = await call(emulator, "GET", f"{NS_URL}/w2")
    assert body["metadata"]["resourceVersion"] and body["metadata"]["uid"] and body["spec"] == {"size": 2}

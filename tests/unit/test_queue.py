"""The work queue on its own (in loop time): due now or later, one run per key at a time, pause and resume."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from m3fleet.controller.cache import CacheManager, CacheOutcome
from m3fleet.controller.queue import WorkQueue

pytestmark = pytest.mark.looptime


class Recorder:
    def __init__(self, hold: float = 0.0) -> None:
        self.hold = hold
        self.runs: list[tuple[str, float]] = []
        self.running: set[str] = set()
        self.overlaps = 0

    async def __call__(self, key: str) -> None:
        self.overlaps += key in self.running
        self.running.add(key)
        self.runs.append((key, round(asyncio.get_running_loop().time())))
        await asyncio.sleep(self.hold)
        self.running.discard(key)


@contextlib.asynccontextmanager
async def running(queue: WorkQueue[Any]) -> AsyncIterator[None]:
    task = asyncio.create_task(queue.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_sooner_supersedes_later_and_never_the_other_way() -> None:
    work = Recorder()
    queue = WorkQueue(work)
    start = round(asyncio.get_running_loop().time())
    async with running(queue):
        queue.add("a", 60)  # a retry after a backoff
        queue.add("a", 5)  # an event: sooner, wins
        queue.add("a", 30)  # later: ignored
        queue.add("b", 10)
        await asyncio.sleep(100)
    assert [(k, t - start) for k, t in work.runs] == [("a", 5), ("b", 10)]


async def test_a_key_runs_once_at_a_time_and_again_when_added_meanwhile() -> None:
    work = Recorder(hold=10)
    queue = WorkQueue(work)
    start = round(asyncio.get_running_loop().time())
    async with running(queue):
        queue.add("a")
        queue.add("b")
        await asyncio.sleep(1)
        queue.add("a")  # while "a" runs: once more, right after
        queue.add("a")
        await asyncio.sleep(100)
    assert [(k, t - start) for k, t in work.runs] == [("a", 0), ("b", 0), ("a", 10)]
    assert work.overlaps == 0


async def test_paused_nothing_starts_and_on_resume_what_fell_due_runs() -> None:
    work = Recorder()
    queue = WorkQueue(work)
    start = round(asyncio.get_running_loop().time())
    async with running(queue):
        queue.pause()
        queue.add("a")
        queue.add("b", 5)
        await asyncio.sleep(20)
        assert work.runs == []
        queue.resume()
        await asyncio.sleep(1)
        queue.forget("c")  # unknown keys are fine
    assert sorted((k, t - start) for k, t in work.runs) == [("a", 20), ("b", 20)]


class CacheRecorder:
    """Stands for the cache reconciler: which caches were looked at, in loop time."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def reconcile(self, body: dict[str, Any]) -> CacheOutcome:
        self.seen.append((body["metadata"]["namespace"], body["metadata"]["name"]))
        return CacheOutcome()


def _cache(namespace: str, name: str) -> dict[str, Any]:
    meta = {"namespace": namespace, "name": name, "uid": name, "resourceVersion": "1", "generation": 1}
    return {"metadata": meta, "spec": {}}


def _pod(namespace: str, volumes: list[dict[str, Any]], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": "p", "labels": labels or {}}, "spec": {"volumes": volumes}}


async def test_an_engine_pod_leaving_a_node_directory_wakes_the_caches_of_its_namespace() -> None:
    # A cache waits for engine pods of an old spec to stop mounting its old directory before it empties it: their
    # going is the news, sooner than the plan's own look again.
    recorder = CacheRecorder()
    caches = CacheManager(recorder)  # type: ignore[arg-type]
    async with running(caches.queue):
        for namespace, name in (("llm", "a"), ("llm", "b"), ("other", "c")):
            caches.cache_event("ADDED", _cache(namespace, name))
        await asyncio.sleep(1)
        recorder.seen.clear()
        host = [{"name": "model-cache", "hostPath": {"path": "/mnt/nvme/m3"}}]
        caches.pod_event("MODIFIED", _pod("llm", host))  # still there
        caches.pod_event("DELETED", _pod("llm", [{"name": "dshm", "emptyDir": {}}]))  # mounted no node directory
        caches.pod_event("DELETED", _pod("llm", host, {"m3fleet.dev/cache": "a"}))  # a cache's own Job pod
        await asyncio.sleep(1)
        assert recorder.seen == []
        caches.pod_event("DELETED", _pod("llm", host))
        await asyncio.sleep(1)
        assert sorted(recorder.seen) == [("llm", "a"), ("llm", "b")]

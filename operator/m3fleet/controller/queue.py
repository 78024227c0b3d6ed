"""A small work queue, like controller-runtime's: keys due now or later, each processed by one worker at a time.

* `add(key)` makes a key due now; `add(key, delay)` due later, unless it is already due sooner (an event
  supersedes a pending retry or timer, never the other way round).
* A key that becomes due while it is being processed runs again right after, never twice at once.
* `pause()` stops new work from starting (work under way finishes); `resume()` lets it start again, with
  everything that fell due meanwhile.

What a key means and what to do with it is the caller's business (`process`); the queue only decides
when. Time is the event loop's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

log = logging.getLogger(__name__)


class WorkQueue(Generic[K]):
    def __init__(self, process: Callable[[K], Awaitable[None]], workers: int = 8) -> None:
        self._process = process
        self._slots = asyncio.Semaphore(workers)
        self._due: dict[K, float] = {}  # key -> when it is due (loop time)
        self._heap: list[tuple[float, int, K]] = []  # may hold stale entries: `_due` is the truth
        self._order = itertools.count()
        self._running: set[K] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._wakeup = asyncio.Event()
        self._open = asyncio.Event()
        self._open.set()

    def add(self, key: K, delay: float = 0.0) -> None:
        when = asyncio.get_running_loop().time() + max(0.0, delay)
        if key in self._due and self._due[key] <= when:
            return
        self._due[key] = when
        if key not in self._running:  # a running key is queued again when it finishes
            heapq.heappush(self._heap, (when, next(self._order), key))
        self._wakeup.set()

    def forget(self, key: K) -> None:
        self._due.pop(key, None)

    def pause(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self._open.set()
        self._wakeup.set()

    async def run(self) -> None:
        """Start due work, forever. Cancelling it cancels the work under way too."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._open.wait()
                self._wakeup.clear()
                now = loop.time()
                while self._heap and self._heap[0][0] <= now and self._open.is_set():
                    when, _, key = heapq.heappop(self._heap)
                    if self._due.get(key) != when or key in self._running:
                        continue  # superseded, or forgotten, or running (re-queued when it finishes)
                    del self._due[key]
                    self._running.add(key)
                    task = asyncio.create_task(self._run_one(key), name=f"m3fleet work {key}")
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                timeout = self._heap[0][0] - now if self._heap else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), timeout)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run_one(self, key: K) -> None:
        try:
            async with self._slots:
                if self._open.is_set():
                    await self._process(key)
                else:  # paused while waiting for a slot: it stays due
                    self._due.setdefault(key, asyncio.get_running_loop().time())
        except Exception:  # `process` handles its own failures; this is a bug, and must not stop the queue
            log.exception("Processing %s failed", key)
        finally:
            self._running.discard(key)
            if key in self._due:
                heapq.heappush(self._heap, (self._due[key], next(self._order), key))
                self._wakeup.set()

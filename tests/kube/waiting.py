"""Waiting for a condition in tests: poll until it holds, in the event loop's time."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def eventually(predicate: Callable[[], Awaitable[T]], timeout: float = 10, *, interval: float = 0.05) -> T: ...


@overload
async def eventually(predicate: Callable[[], T], timeout: float = 10, *, interval: float = 0.05) -> T: ...


async def eventually(predicate: Callable[[], Any], timeout: float = 10, *, interval: float = 0.05) -> Any:
    """
    Poll ``predicate`` (sync or async) until it returns something truthy; return that value.

    ``AssertionError``, ``LookupError`` and ``ValueError`` raised by the predicate count as "not yet"
    (handy with ``kmock.objects[...]`` lookups and asserts inside lambdas). Times out in *loop* time,
    so it also works under looptime. On timeout, raises ``AssertionError`` chained to the last error.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last_value: Any = None
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            last_value, last_error = value, None
        except (AssertionError, LookupError, ValueError) as e:
            last_error = e
        if loop.time() >= deadline:
            raise AssertionError(f"Not true within {timeout}s; last value: {last_value!r}") from last_error
        await asyncio.sleep(interval)

"""
Helpers to run a real kopf operator in-process against the API server emulator.

A plain module (not a conftest): import what you need::

    from tests.kube.conftest_helpers import eventually, run_operator

    async def test_something(kmock):   # kmock: ApiServerEmulator via @pytest.mark.kmock(cls=...)
        async with run_operator(kmock, registry, namespaces=['ns1']):
            await kmock.post(...)
            await eventually(lambda: kmock.get_object('v1/configmaps', 'ns1', 'x') is not None)

The operator runs in the test's own event loop with ``kopf.spawn_tasks()`` + ``kopf.run_tasks()``
(not ``kopf.operator()``, which would cancel pytest's own tasks as "hung" on exit). It logs in to
the emulator through a ``@kopf.on.login`` handler, so no kubeconfig is involved.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import signal
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any, TypeVar

import kopf

from tests.kube.emulator import ApiServerEmulator

__all__ = ["RunningOperator", "default_settings", "eventually", "run_operator"]

T = TypeVar("T")

# One login handler per registry (kopf has no way to remove handlers); it serves the emulator
# that the registry currently runs against. Do not run one registry against two emulators at once.
_LOGIN_HANDLER_ID = "tests-kube-emulator-login"
_login_targets: weakref.WeakKeyDictionary[kopf.OperatorRegistry, dict[str, str]] = weakref.WeakKeyDictionary()


def _ensure_login(registry: kopf.OperatorRegistry, emulator: ApiServerEmulator) -> None:
    if registry not in _login_targets:
        target: dict[str, str] = {}
        _login_targets[registry] = target

        @kopf.on.login(registry=registry, id=_LOGIN_HANDLER_ID)
        def login_to_emulator(**_: Any) -> kopf.ConnectionInfo:
            # A high priority wins over any other credentials the registry's own login handlers find.
            return kopf.ConnectionInfo(server=target["server"], priority=1_000_000)

    _login_targets[registry]["server"] = str(emulator.url)


def default_settings() -> kopf.OperatorSettings:
    """kopf settings for tests: no namespace/CRD scanning, standalone, short backoffs and delays."""
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True  # namespaces are given explicitly; no cluster-wide observation
    settings.peering.standalone = True
    settings.networking.error_backoffs = [0.1, 0.2, 0.5]  # API retries on 5xx/429 (default 1, 1, 2, ...)
    settings.queueing.error_delays = [0.1, 0.5, 1]  # watcher throttling after unexpected errors
    settings.execution.default_backoff = 0.5  # handler retries without explicit backoff= (default 60 s)
    return settings


@dataclasses.dataclass
class RunningOperator:
    """What :func:`run_operator` yields."""

    settings: kopf.OperatorSettings
    task: asyncio.Task[None]  # the kopf.run_tasks() orchestrator


def _aiohttp_server_tasks() -> set[asyncio.Task[Any]]:
    """The kmock server's connection handlers (aiohttp's RequestHandler.start), which are not kopf's."""
    return {task for task in asyncio.all_tasks() if "RequestHandler" in getattr(task.get_coro(), "__qualname__", "")}


@contextlib.asynccontextmanager
async def run_operator(
    emulator: ApiServerEmulator,
    registry: kopf.OperatorRegistry,
    *,
    namespaces: Collection[str],
    settings_hook: Callable[[kopf.OperatorSettings], None] | None = None,
    ready_timeout: float = 10,
    stop_timeout: float = 15,
) -> AsyncIterator[RunningOperator]:
    """
    Run the handlers of ``registry`` as a kopf operator against ``emulator`` while the block runs.

    ``settings_hook(settings)`` may adjust :func:`default_settings` before the start. On exit the
    operator is stopped through its stop flag and awaited; its failures are re-raised.
    """
    _ensure_login(registry, emulator)
    settings = default_settings()
    if settings_hook is not None:
        settings_hook(settings)

    stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
    # run_tasks() cancels every task it does not know as "hung" when it stops; keep ours out of it.
    # The set is read at stop time, so tasks added later (see below) are honoured too.
    ignored: set[asyncio.Task[Any]] = set(asyncio.all_tasks())
    # standalone=None: keep settings.peering.standalone (True by default; a settings_hook may enable peering).
    tasks = await kopf.spawn_tasks(
        registry=registry,
        settings=settings,
        standalone=None,
        namespaces=list(namespaces),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
    runner = asyncio.create_task(kopf.run_tasks(tasks, ignored=ignored), name="kopf operator")
    try:
        ready = asyncio.create_task(ready_flag.wait())
        done, _ = await asyncio.wait({ready, runner}, timeout=ready_timeout, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if runner in done:
            await runner  # re-raise why it exited
            raise RuntimeError("The operator exited before it became ready.")
        if not done:
            raise TimeoutError(f"The operator did not become ready in {ready_timeout} seconds.")
        yield RunningOperator(settings=settings, task=runner)
    finally:
        current = asyncio.current_task()
        if current is not None:
            ignored.add(current)  # the test's (or fixture's) own task
        ignored.update(_aiohttp_server_tasks())
        stop_flag.set()
        try:
            await asyncio.wait_for(asyncio.shield(runner), stop_timeout)
        finally:
            if not runner.done():
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            # spawn_tasks() installed SIGINT/SIGTERM handlers on the loop; give Ctrl+C back to pytest.
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)


async def eventually(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float = 10,
    *,
    interval: float = 0.05,
) -> T:
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

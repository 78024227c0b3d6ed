"""The engine-parser tier's verdicts, computed once per test session.

Every rendered command (test_rendered_commands.py) and every negative control (test_negative_controls.py) goes
through ONE checker run per engine. A run is mostly the engines' imports (torch, then vLLM or SGLang: 20-70 s on a
loaded 2-core box), so paying them once a file cost the tier a minute of CI. Under pytest-xdist the first worker that
needs the verdicts runs the checker and the others wait for its answer (xdist's recipe for a session fixture run
once: a lock and a file in the session's shared temporary directory).
"""

from __future__ import annotations

import fcntl
import json
from typing import Any

import pytest

from tests.engine_parsers.test_negative_controls import ITEMS
from tests.engine_parsers.test_rendered_commands import COMMANDS
from tests.support.engines import runner


def _check_all() -> dict[str, dict[str, Any]]:
    items = [{"id": c.id, "engine": c.engine, "argv": c.argv} for c in COMMANDS]
    items += [{"id": i, "engine": engine, "argv": argv} for i, (engine, argv) in ITEMS.items()]
    return {result["id"]: result for result in runner.check(items)}


@pytest.fixture(scope="session")
def engine_verdicts(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, dict[str, Any]]:
    """id -> checker result for every rendered command and negative control; {} when the venvs are missing (each
    test module then fails with the build command)."""
    if runner.find_engine_pythons() is None:
        return {}
    if worker_id == "master":  # not distributed: this process is the session
        return _check_all()
    shared = tmp_path_factory.getbasetemp().parent  # the session's directory, above each worker's own
    answer = shared / "engine-verdicts.json"
    with (shared / "engine-verdicts.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, verdicts written
        if answer.is_file():
            verdicts: dict[str, dict[str, Any]] = json.loads(answer.read_text())
            return verdicts
        verdicts = _check_all()
        answer.write_text(json.dumps(verdicts))
        return verdicts

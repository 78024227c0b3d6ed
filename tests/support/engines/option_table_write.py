"""Regenerate operator/m3fleet/engines/engine-options.json from the pinned engines' parsers (in their venvs).

./.venv/bin/python -m tests.support.engines.option_table_write [--check]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.support.engines import runner

DUMPER = Path(__file__).with_name("option_table.py")
TABLE = Path(__file__).resolve().parents[3] / "operator" / "m3fleet" / "engines" / "engine-options.json"


class Parsers:
    """One option_table.py per engine in its venv, serving requests until closed: each engine is imported once
    (torch, then the engine: 20-70 s on a loaded box), however many tables and probes are asked of it."""

    def __init__(self) -> None:
        pythons = runner.find_engine_pythons()
        if pythons is None:
            raise RuntimeError(f"engine venvs not found under {runner.envs_root()}: {runner.BUILD_HINT}")
        # The engines log freely: to files, as a pipe nobody reads while they serve would fill and block them.
        self.logs = {engine: tempfile.TemporaryFile("w+") for engine in runner.ENGINES}  # noqa: SIM115 (close())
        self.processes = {
            engine: subprocess.Popen(
                [pythons[engine], str(DUMPER), engine, "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.logs[engine],
                text=True,
            )
            for engine in runner.ENGINES
        }

    def ask(self, engine: str, request: Any) -> Any:
        process = self.processes[engine]
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        answer = process.stdout.readline()
        if not answer:
            process.wait(timeout=runner.TIMEOUT_S)
            self.logs[engine].seek(0)
            errors = self.logs[engine].read()
            raise RuntimeError(f"{engine} option_table.py exited {process.returncode}:\n{errors[-5000:]}")
        return json.loads(answer)

    def dump(self) -> dict[str, Any]:
        """{engine: table} from each engine's own parser."""
        return {engine: self.ask(engine, "table") for engine in runner.ENGINES}

    def probe(self, engine: str, items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """id -> {"error", "touched"}: which of each item's dests the engine's parser sets for its argv."""
        return {result["id"]: result for result in self.ask(engine, items)}

    def close(self) -> None:
        """Close each one's stdin (it ends when it reads that) and wait for it."""
        for engine, process in self.processes.items():
            if process.stdin is not None:
                process.stdin.close()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
            self.logs[engine].close()

    def __enter__(self) -> Parsers:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def text(tables: dict[str, Any]) -> str:
    return json.dumps(tables, indent=1, sort_keys=True) + "\n"


def main() -> int:
    with Parsers() as parsers:
        fresh = text(parsers.dump())
    if "--check" in sys.argv[1:]:
        if TABLE.read_text() != fresh:
            print(f"{TABLE} differs from the pinned parsers: rerun without --check", file=sys.stderr)
            return 1
        return 0
    TABLE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())

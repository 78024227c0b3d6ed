"""Regenerate operator/m3fleet/engines/engine-options.json from the pinned engines' parsers (in their venvs).

./.venv/bin/python -m tests.support.engines.option_table_write [--check]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.engines import runner

DUMPER = Path(__file__).with_name("option_table.py")
TABLE = Path(__file__).resolve().parents[3] / "operator" / "m3fleet" / "engines" / "engine-options.json"


def in_venv(engine: str, *args: str, stdin: Any = None) -> Any:
    """Run option_table.py in the engine's venv; its JSON answer."""
    pythons = runner.find_engine_pythons()
    if pythons is None:
        raise RuntimeError(f"engine venvs not found under {runner.envs_root()}: {runner.BUILD_HINT}")
    proc = subprocess.run(
        [pythons[engine], str(DUMPER), engine, *args],
        input=None if stdin is None else json.dumps(stdin),
        capture_output=True,
        text=True,
        timeout=runner.TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} option_table.py exited {proc.returncode}:\n{proc.stderr[-5000:]}")
    return json.loads(proc.stdout)


def dump() -> dict[str, Any]:
    """{engine: table} from each engine's own parser, run in that engine's venv."""
    return {engine: in_venv(engine) for engine in runner.ENGINES}


def probe(engine: str, items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """id -> {"error", "touched"}: which of each item's dests the engine's parser sets for its argv."""
    return {result["id"]: result for result in in_venv(engine, "probe", stdin=items)}


def text(tables: dict[str, Any]) -> str:
    return json.dumps(tables, indent=1, sort_keys=True) + "\n"


def main() -> int:
    fresh = text(dump())
    if "--check" in sys.argv[1:]:
        if TABLE.read_text() != fresh:
            print(f"{TABLE} differs from the pinned parsers: rerun without --check", file=sys.stderr)
            return 1
        return 0
    TABLE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""DYNAMO_VERSION, the Dynamo release m3fleet renders, read from the catalog's source without importing m3fleet.

Stdlib only: `.ci/dynamo-env.sh` runs it with the system python (`python3 tests/support/dynamo/pinned.py`) before
any venv exists, and tests/support/dynamo/env.py imports it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CATALOG = Path(__file__).resolve().parents[3] / "operator" / "m3fleet" / "catalog"


def dynamo_version() -> str:
    """The value of the catalog's DYNAMO_VERSION constant; LookupError when no module defines one."""
    for path in sorted(CATALOG.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == "DYNAMO_VERSION" for t in targets) and node.value is not None:
                return str(ast.literal_eval(node.value))
    raise LookupError(f"DYNAMO_VERSION is not defined in {CATALOG}")


if __name__ == "__main__":
    try:
        print(dynamo_version())
    except LookupError as exc:
        sys.exit(str(exc))

"""operator/Dockerfile, checked statically (tests/cluster/test_image.py builds it and runs the image).

Checked without building: a multi-stage build on python:3.11-slim by default that installs the package into a
venv, a non-root numeric USER, the `m3fleet` entrypoint with a CMD that the real CLI parser accepts, and a
.dockerignore that lets in exactly what the COPY lines need.
"""

from __future__ import annotations

import fnmatch
import json
import shlex

from m3fleet.cli import build_parser
from tests.support.chart import ROOT

DOCKERFILE = ROOT / "operator" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    out, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            if current.strip():
                word, _, rest = current.strip().partition(" ")
                out.append((word.upper(), rest.strip()))
            current = ""
    return out


def test_stages_user_and_entrypoint() -> None:
    ins = instructions()
    args = {rest.split("=")[0]: rest.split("=", 1)[1] for word, rest in ins if word == "ARG"}
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    froms = [rest for word, rest in ins if word == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    runs = " ".join(rest for word, rest in ins if word == "RUN")
    assert "python -m venv /opt/m3fleet" in runs and "/opt/m3fleet/bin/pip install ." in runs
    assert ("COPY", "--from=build /opt/m3fleet /opt/m3fleet") in ins
    (user,) = [rest for word, rest in ins if word == "USER"]
    assert user == "65532:65532"
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    assert [w for w, _ in final].index("USER") < [w for w, _ in final].index("ENTRYPOINT")
    (entrypoint,) = [json.loads(rest) for word, rest in ins if word == "ENTRYPOINT"]
    (cmd,) = [json.loads(rest) for word, rest in ins if word == "CMD"]
    assert entrypoint == ["m3fleet"] and cmd == ["run", "--all-namespaces"]
    parsed = build_parser().parse_args(cmd)
    assert parsed.command == "run" and parsed.all_namespaces
    assert "hack/build-image.sh" in DOCKERFILE.read_text() and "UNTESTED" not in DOCKERFILE.read_text()


def _included(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rules: the last matching pattern wins; `!` re-includes."""
    included = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        glob = pattern.replace("**/", "*")
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, glob) for p in prefixes):
            included = negate
    return included


def test_dockerignore_admits_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copies = [shlex.split(rest) for word, rest in instructions() if word == "COPY" and not rest.startswith("--from")]
    sources = [src.rstrip("/") for parts in copies for src in parts[:-1]]
    assert sources == ["pyproject.toml", "README.md", "operator"]
    for path in (
        "pyproject.toml",
        "README.md",
        "operator/m3fleet/cli/__init__.py",
        "operator/m3fleet/engines/templates/trtllm-leader.sh.j2",
    ):
        assert _included(path, patterns), path
    for path in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/unit/test_cli.py",
        "charts/m3fleet/Chart.yaml",
        "operator/m3fleet/__pycache__/cli.cpython-311.pyc",
        "operator/m3fleet.egg-info/PKG-INFO",
        "simulator/pyproject.toml",  # the simulator is a distribution of its own: never in the operator's image
        "simulator/m3fleet_simulator/fleet.py",
    ):
        assert not _included(path, patterns), path

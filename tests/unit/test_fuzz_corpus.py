"""The fuzz corpus (tests/fuzz/corpus: hand-made hostile inputs and a generated set, see
tests/fuzz/make_corpus.py) through the real `m3fleet plan` and `m3fleet render` console scripts, one
process per directory: no traceback, never exit 1, bounded time and memory, and every stderr line starts
with the resource (file#document, and its name when it has one) and the field path."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "corpus"
MEMORY_LIMIT = 2 * 1024**3  # address space of one CLI process; an alias bomb must not come near it
TIME_LIMIT = 90.0

KEY = r'\[(?:\d+|"(?:[^"\\]|\\.)*")\]'  # [0] or ["a quoted key"]
FIELD = rf"(?:\(file\)|\(document\)|line \d+ column \d+|(?:[A-Za-z0-9_][\w/.-]*|{KEY})(?:{KEY}|\.[\w/.-]+)*)"
LINE = re.compile(
    rf"^error: (?P<source>\S+?)(?: \([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\))?: (?P<field>{FIELD}): \S"
)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run(command: str, target: Path) -> tuple[int, str, float]:
    start = time.monotonic()
    result = subprocess.run(
        [str(BIN / "m3fleet"), command, "-f", str(target)],
        capture_output=True,
        text=True,
        timeout=TIME_LIMIT,
        check=False,
        preexec_fn=_limit_memory,
    )
    return result.returncode, result.stderr, time.monotonic() - start


def check_lines(stderr: str, directory: Path) -> set[str]:
    """Every line is `error: <file>[#doc] [(Kind/name)]: <field>: <problem>`; returns the files named."""
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr[-3000:]
    named: set[str] = set()
    for line in stderr.splitlines():
        if line.startswith("note: ") and "MiniMaxM3ModelCache, validated" in line:
            continue  # a cache that passed: the CLI says it validated it and does not plan it
        match = LINE.match(line)
        assert match, f"not `error: <resource>: <field>: ...`: {line[:500]!r}"
        source = match["source"].split("#")[0]
        assert Path(source).parent == directory, line[:500]
        named.add(Path(source).name)
    return named


@pytest.mark.parametrize("command", ["plan", "render"])
def test_hostile_inputs_are_rejected_each_with_its_file_and_field(command: str) -> None:
    directory = CORPUS / "hostile"
    files = sorted(p.name for p in directory.iterdir())
    assert len(files) > 60
    code, stderr, elapsed = run(command, directory)
    assert code == 2, stderr[-3000:]
    named = check_lines(stderr, directory)
    assert named == {f for f in files if f.startswith("bad-")}, (
        f"rejected but meant to pass: {sorted(named - {f for f in files if f.startswith('bad-')})}; "
        f"passed but meant to be rejected: {sorted({f for f in files if f.startswith('bad-')} - named)}"
    )
    assert elapsed < TIME_LIMIT


@pytest.mark.parametrize("command", ["plan", "render"])
def test_generated_inputs_never_crash(command: str) -> None:
    directory = CORPUS / "generated"
    files = list(directory.iterdir())
    assert len(files) >= 500
    code, stderr, _ = run(command, directory)
    assert code in (0, 2), stderr[-3000:]
    named = check_lines(stderr, directory)
    # most mutations are rejected, each with its file; some are not, so the planner and the renderer run too
    assert 100 < len(named) < len(files) - 20, len(named)


def test_a_file_too_large_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as handle:
        handle.truncate(64 * 1024 * 1024)  # sparse: costs no disk
    code, stderr, elapsed = run("plan", tmp_path)
    assert code == 2 and check_lines(stderr, tmp_path) == {"big.yaml"} and "split it" in stderr
    assert elapsed < 30


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("bad-alias-bomb.yaml", "alias bomb"),
        ("bad-alias-cycle.yaml", "(document): "),
        ("bad-deep-flow.yaml", "nested"),
        ("bad-not-utf8.yaml", "(file): is not UTF-8 text"),
        ("bad-empty.yaml", "(file): has no YAML document"),
        ("bad-name-number.yaml", "metadata.name: must be a string, not the integer 123"),
        ("bad-duplicate-key.yaml", "given twice"),
        ("bad-snake-case.yaml", "spec.node_pool: is not a field of this object; fix: did you mean `nodePool`?"),
        ("bad-quoted-int.yaml", 'spec.replicas: must be an integer, not the string "8"'),
        ("bad-yes-string.yaml", 'spec.autoscaling.enabled: must be true or false, not the string "yes"'),
        ("bad-multi-doc-bad-yaml.yaml", "bad-multi-doc-bad-yaml.yaml#1: line "),
        ("bad-multi-doc-not-mapping.yaml", "bad-multi-doc-not-mapping.yaml#1: (document): is a list, not a mapping"),
        ("bad-scalar-document.yaml", 'is the string "hello", not a mapping'),
        ("bad-odd-key.yaml", 'spec["a: b\\nc"]: is not a field of this object'),
    ],
)
def test_hostile_messages_say_what_is_wrong(name: str, fragment: str, tmp_path: Path) -> None:
    (tmp_path / name).write_bytes((CORPUS / "hostile" / name).read_bytes())
    code, stderr, _ = run("plan", tmp_path)
    assert code == 2 and fragment in stderr, stderr
    assert len(stderr.splitlines()) <= 3, stderr  # one clear line (a few for several problems), no dump
    check_lines(stderr, tmp_path)

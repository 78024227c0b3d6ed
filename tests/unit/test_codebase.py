"""Habits of the codebase that a review would otherwise have to catch: every source a fact cites is a
public reference a user who clones m3fleet can follow, never a path on the machine it was written on."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from m3fleet.catalog.facts import SOURCES

ROOT = Path(__file__).resolve().parents[2]

# Where the project's notes lived while it was written; a clone has none of them.
OUTSIDE_THE_REPOSITORY = re.compile(r"shared/(docs|seeds)|m3-facts|engine-argparse\.md|\bseed \d{3}\b|\.\./shared")


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    suffixes = {".py", ".md", ".yaml", ".yml", ".json", ".j2", ".sh", ".toml", ".tpl", ".txt", ""}
    return [ROOT / name for name in listed.splitlines() if Path(name).suffix in suffixes and (ROOT / name).is_file()]


def test_no_tracked_file_cites_a_path_outside_the_repository() -> None:
    this_file = Path(__file__).resolve()
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _tracked_text_files()
        if path != this_file
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        if OUTSIDE_THE_REPOSITORY.search(line)
    ]
    assert not offenders, "cite the public source (a SOURCES tag), not a local note:\n" + "\n".join(offenders)


def test_every_source_names_a_public_repository_page_or_this_repository() -> None:
    # "owner/repo path", a versioned wheel, a public site, or a test tier of this repository.
    public = re.compile(r"^[\w.-]+/[\w.-]+ |\bwheel\b|\bblog\b|\(developer\.nvidia\.com|^third-party|^computed|tests/")
    unsourced = {tag: text for tag, text in SOURCES.items() if not public.search(text)}
    assert not unsourced, unsourced

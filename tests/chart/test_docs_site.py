"""The documentation: docs/ builds into a site with `mkdocs build --strict`, and every link resolves.

MkDocs checks the links between pages of the site and their anchors itself (mkdocs.yml's `validation:` turns
each broken one into a warning, and --strict into a failed build). The Markdown files outside the site (README.md,
tests/README.md, the benchmark's RESULTS.md) are read on GitHub: their relative links, and the site's links into
the repository (`https://github.com/m3fleet/m3fleet/blob/main/<path>`), are checked here against the files and
headings of this checkout, with GitHub's anchor rule.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.chart import ROOT

REPOSITORY_FILES = "https://github.com/m3fleet/m3fleet/blob/main/"
OUTSIDE_THE_SITE = [ROOT / "README.md", ROOT / "tests" / "README.md", ROOT / "tests/bench/autoscaling/RESULTS.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks: a `[x](y)` in a code sample is not a link."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lowercase, punctuation dropped, spaces to '-', repeats numbered."""
    anchors: set[str] = set()
    for line in prose(markdown).splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        anchor, repeat = slug, 0
        while anchor in anchors:
            repeat += 1
            anchor = f"{slug}-{repeat}"
        anchors.add(anchor)
    return anchors


def broken_links(page: Path, text: str, *, repository_only: bool = False) -> list[str]:
    """Each link into this repository, and unless `repository_only` each relative link, of `page` whose file or
    anchor does not exist."""
    broken = []
    for target in LINK.findall(prose(text)):
        if target.startswith(REPOSITORY_FILES):
            base, target = ROOT, target.removeprefix(REPOSITORY_FILES)
        elif repository_only or re.match(r"[a-z]+:", target):
            continue  # another site, or a link between the site's pages (MkDocs checks those by its own rule)
        else:
            base = page.parent
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else page
        if not file.exists() or not file.is_relative_to(ROOT):
            broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            continue
        headings = "" if file.is_dir() else file.read_text(encoding="utf-8") if path else text
        if anchor and anchor not in github_anchors(headings):
            broken.append(f"{page.relative_to(ROOT)}: {target}: no heading with that anchor")
    return broken


def test_the_site_builds_strict_with_every_page(tmp_path: Path) -> None:
    site = tmp_path / "site"
    config = ROOT / "mkdocs.yml"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    pages = sorted((ROOT / "docs").rglob("*.md"))
    assert len(pages) >= 10
    for page in pages:
        name = page.relative_to(ROOT / "docs").with_suffix("")
        built = site / "index.html" if name == Path("index") else site / name / "index.html"
        assert built.is_file(), page


def test_links_outside_the_site_resolve() -> None:
    broken = [line for page in OUTSIDE_THE_SITE for line in broken_links(page, page.read_text(encoding="utf-8"))]
    assert broken == []


def test_the_sites_links_into_the_repository_resolve() -> None:
    pages = sorted((ROOT / "docs").rglob("*.md"))
    linked = [t for page in pages for t in LINK.findall(page.read_text(encoding="utf-8")) if REPOSITORY_FILES in t]
    assert linked  # the benchmark's results, the test tiers
    broken = [line for page in pages for line in broken_links(page, page.read_text("utf-8"), repository_only=True)]
    assert broken == []


def test_the_link_check_finds_broken_links() -> None:
    """Negative control: a missing file, a missing anchor and a repository link to nothing are each reported."""
    page = ROOT / "README.md"
    text = (
        "# Title\n\n## A `code` heading: (with) punctuation\n\n"
        "[ok](#a-code-heading-with-punctuation) [ok](docs/index.md#start-here) [gone](docs/nowhere.md) "
        "[anchor](#nowhere) [repo](" + REPOSITORY_FILES + "tests/nowhere.md)\n"
        "```bash\n[not a link](nowhere.md)\n```\n"
    )
    assert broken_links(page, text, repository_only=True) == ["README.md: tests/nowhere.md: no such file"]
    assert broken_links(page, text) == [
        "README.md: docs/nowhere.md: no such file",
        "README.md: #nowhere: no heading with that anchor",
        "README.md: tests/nowhere.md: no such file",
    ]

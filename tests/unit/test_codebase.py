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


def _catalog_facts() -> dict[str, str]:
    """Each fact the catalog holds as a string, with where it lives there."""
    import dataclasses

    from m3fleet.catalog import ACCELERATORS, ENGINES, KV_LAYOUT
    from m3fleet.catalog.engine_metrics import ENGINE_METRICS

    facts: dict[str, str] = {str(KV_LAYOUT.block_size): "KV_LAYOUT.block_size"}
    for engine, metrics in ENGINE_METRICS.items():
        for item in dataclasses.fields(metrics):
            if item.name in ("engine", "rank_label"):  # what the engine is called, a label name: not metric names
                continue
            value = getattr(metrics, item.name)
            if isinstance(value, bool):  # how a metric is observed, not a name
                continue
            names = (value,) if isinstance(value, str) else value or ()
            # Label matchers (name, value) are facts as their value ("prefill_forward"); a label name is not.
            names = tuple(n[1] if isinstance(n, tuple) else n for n in names)
            facts.update({name: f"ENGINE_METRICS[{engine}].{item.name}" for name in names})
    for name, engine in ENGINES.items():
        for image in engine.images.values():
            facts[image] = f"ENGINES[{name.value}].images"
        facts[engine.reasoning_parser] = f"ENGINES[{name.value}].reasoning_parser"
        facts[engine.tool_parser] = f"ENGINES[{name.value}].tool_parser"
    for name, accelerator in ACCELERATORS.items():
        facts[accelerator.resource_name] = f"ACCELERATORS[{name.value}].resource_name"
        for key, values in accelerator.node_labels.items():
            facts[key] = f"ACCELERATORS[{name.value}].node_labels"
            facts.update({value: f"ACCELERATORS[{name.value}].node_labels[{key}]" for value in values})
    return facts


# The code that must read facts from the catalog rather than spell them: the renderers, the operator, the
# autoscaler's adapters and the chart generator. (The catalog itself and its sources are the one home.)
READERS_OF_FACTS = (
    "operator/m3fleet/engines",
    "operator/m3fleet/render",
    "operator/m3fleet/controller",
    "operator/m3fleet/autoscaling",
    "operator/m3fleet/planner.py",
    "hack/generate.py",
)


# Strings equal to a fact that mean something else.
SAME_TEXT_OTHER_MEANING = ("operator/m3fleet/render/labels.py:22: 'minimax-m3'",)  # app.kubernetes.io/name


def test_renderers_the_operator_and_the_chart_generator_read_facts_from_the_catalog() -> None:
    import ast

    facts = _catalog_facts()
    files = [ROOT / p for p in READERS_OF_FACTS if (ROOT / p).is_file()]
    files += [f for p in READERS_OF_FACTS if (ROOT / p).is_dir() for f in sorted((ROOT / p).rglob("*.py"))]
    repeated = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r} is {facts[node.value]}"
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in facts
        and not (node.value.isdigit() and "engines" not in str(path))  # a bare number is a fact only as a flag
    ]
    repeated = [line for line in repeated if not any(line.startswith(c) for c in SAME_TEXT_OTHER_MEANING)]
    assert not repeated, "read these from m3fleet.catalog instead:\n" + "\n".join(repeated)


def test_every_path_in_the_code_maps_exists() -> None:
    """The README's short map and the contributors' full one (docs/design.md) name only paths that exist."""

    def section(path: Path, heading: str) -> str:
        text = path.read_text()
        start = text.index(heading)
        return text[start : text.find("\n## ", start + len(heading))]

    pattern = r"`((?:operator|charts|hack|manifests|tests|api|catalog|engines|render|controller|autoscaling)/[^`]*)`"
    readme = re.findall(pattern, section(ROOT / "README.md", "## Where things are"))
    full = re.findall(pattern, section(ROOT / "docs" / "design.md", "## Where things are in the code"))
    missing = [
        p
        for p in readme + full
        if not any((ROOT / base / p).exists() or list((ROOT / base).glob(p)) for base in ("", "operator/m3fleet"))
    ]
    assert len(readme) > 10 and len(full) > 20 and not missing, missing


def test_the_import_contract_places_every_module_in_a_layer() -> None:
    """lint-imports checks the direction between the layers; this checks that no module is left out of them."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    # The operator's layers and the simulator's (a distribution of its own, simulator/).
    layers = [layer for c in config if c["type"] == "layers" for layer in c["layers"]]
    placed = {m.strip() for layer in layers for m in layer.split("|")}
    packages = {"m3fleet": ROOT / "operator" / "m3fleet", "m3fleet_simulator": ROOT / "simulator" / "m3fleet_simulator"}
    modules = {
        ".".join((name, *path.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
        for name, package in packages.items()
        for path in package.rglob("*.py")
    }

    def imports_something(module: str) -> bool:
        root, *inner = module.split(".")
        init = packages[root].joinpath(*inner, "__init__.py")
        if not init.exists():
            return True  # a module, not a package
        source = init.read_text()
        return any(line.startswith(("import ", "from ")) and "__future__" not in line for line in source.splitlines())

    # A package whose __init__ only documents it may stay outside the layers; every module must be in one.
    unplaced = sorted(
        m
        for m in modules
        if m not in packages and not any(m == p or m.startswith(p + ".") for p in placed) and imports_something(m)
    )
    assert not unplaced, f"add these to a layer in pyproject.toml's import contract: {unplaced}"


def test_the_readme_states_the_catalogs_facts_not_its_own() -> None:
    """A fact the README or docs/ repeat (an engine version, an image, the block size) is the catalog's, so a change
    there that leaves the README behind fails here."""
    from m3fleet.catalog import ENGINES, KV_LAYOUT, SGLANG_VERSION, TRTLLM_VERSION, VLLM_VERSION

    # The README, the user guides it links to, what the test tiers prove and the autoscaling benchmark's results.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "tests").rglob("*.md"))]
    readme = "".join(page.read_text() for page in pages)
    versions = {"vllm": VLLM_VERSION, "sglang": SGLANG_VERSION, "tensorrt-llm": TRTLLM_VERSION}
    for engine, version in versions.items():
        stated = re.findall(rf"(?i)\b{re.escape(engine)}[ :/v|-]*\**v?(\d+\.\d+\.\d+\w*)", readme)
        assert stated and set(stated) == {version}, (engine, set(stated))
    images = set(
        re.findall(r"(?:vllm/vllm-openai[\w-]*|lmsysorg/sglang|nvcr\.io/nvidia/tensorrt-llm/release):[\w.-]+", readme)
    )
    known = {image for engine in ENGINES.values() for image in engine.images.values()}
    assert images and all(any(k.startswith(i) for k in known) for i in images), images - known
    # `--block-size 100` is quoted once as input the engine's own parser wrongly accepts (a negative control).
    sizes = set(re.findall(r"--block-size (\d+)", readme)) - {"100"}
    assert sizes == {str(KV_LAYOUT.block_size)}, sizes


def test_the_simulator_is_released_at_the_one_version() -> None:
    """m3fleet-simulator (simulator/) runs one release's policy and planner: its version, its pin on m3fleet and the
    extra `m3fleet[simulate]`'s pin on it are all pyproject.toml's version."""
    import tomllib

    operator = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    simulator = tomllib.loads((ROOT / "simulator" / "pyproject.toml").read_text())["project"]
    version = operator["version"]
    assert simulator["version"] == version
    assert simulator["dependencies"] == [f"m3fleet=={version}"]
    assert operator["optional-dependencies"]["simulate"] == [f"m3fleet-simulator=={version}"]
    assert simulator["entry-points"]["m3fleet.subcommands"] == {"simulate": "m3fleet_simulator.command:register"}

"""The condition catalogue (m3fleet.api.conditions) is the only source of condition reasons: every reason the code
can emit is catalogued under the type and status it comes with, and every catalogued reason means something."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from m3fleet.api import conditions as catalogue
from m3fleet.api.conditions import CACHE, DEPLOYMENT, CacheReason, Catalogue, DeploymentReason
from m3fleet.api.crd import crd_yaml
from m3fleet.controller.status import Blocked, GatewayReport, PodFailure, Workload, conditions

PACKAGE = Path(catalogue.__file__).resolve().parent.parent
NOW = "2026-01-01T00:00:00Z"
# Calls that make a condition, and the position of their reason argument.
REASON_ARGUMENT = {"Blocked": 0, "PodFailure": 0, "refusal": 0, "Verdict": 2, "c": 2, "condition": 3}


def _calls(tree: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in REASON_ARGUMENT:
                yield name, node


def _reason_argument(name: str, call: ast.Call) -> ast.expr | None:
    position = REASON_ARGUMENT[name]
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == "reason"), None)


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_no_condition_is_made_with_a_reason_written_out() -> None:
    """A reason passed to anything that makes a condition is a catalogue name, never a string literal."""
    found, literal = 0, []
    for path, tree in _modules():
        for name, call in _calls(tree):
            argument = _reason_argument(name, call)
            if argument is None:
                continue
            found += 1
            if any(_is_text(n) for n in ast.walk(argument)):
                literal.append(f"{path.relative_to(PACKAGE)}:{call.lineno}: {ast.unparse(argument)}")
    assert found >= 20, f"only {found} condition-making calls found: did one of {sorted(REASON_ARGUMENT)} move?"
    assert literal == [], "reasons must come from m3fleet.api.conditions:\n" + "\n".join(literal)


def _resolve(node: ast.expr) -> str | CacheReason | None:
    """A module constant of the catalogue (READY, FALSE, ...) or a CacheReason member, by its name in the code."""
    if isinstance(node, ast.Name) and isinstance(getattr(catalogue, node.id, None), str):
        value: str = getattr(catalogue, node.id)
        return value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "CacheReason":
        return CacheReason[node.attr]
    return None


def _cache_reasons_in(node: ast.AST, assigned: dict[str, set[CacheReason]]) -> set[CacheReason]:
    """The CacheReason members an expression can be: named in it, or assigned to a variable it names."""
    found: set[CacheReason] = set()
    for n in ast.walk(node):
        resolved = _resolve(n) if isinstance(n, ast.expr) else None
        if isinstance(resolved, CacheReason):
            found.add(resolved)
        elif isinstance(n, ast.Name):
            found |= assigned.get(n.id, set())
    return found


def _assigned_reasons(tree: ast.AST) -> dict[str, set[CacheReason]]:
    """Per variable name in a module: the CacheReason members assigned to it anywhere."""
    assigned: dict[str, set[CacheReason]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, set()).update(_cache_reasons_in(node.value, {}))
    return assigned


def test_every_cache_verdict_is_catalogued_under_its_type_and_status() -> None:
    """Each (type, status, reason) the cache plan and controller write is in the catalogue, and each catalogued
    reason is written somewhere."""
    written: set[tuple[str, str, CacheReason]] = set()
    for path in (PACKAGE / "cache" / "plan.py", PACKAGE / "controller" / "cache.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assigned = _assigned_reasons(tree)
        for name, call in _calls(tree):
            if name == "Verdict":
                type_, status = _resolve(call.args[0]), _resolve(call.args[1])
                assert isinstance(type_, str) and isinstance(status, str), ast.unparse(call)
                written.update((type_, status, r) for r in _cache_reasons_in(call.args[2], assigned))
            elif name == "refusal":
                for reason in _cache_reasons_in(call.args[0], assigned):
                    written.update({("Ready", "False", reason), ("Degraded", "True", reason)})
    catalogued = {(entry.type, status, reason) for entry in CACHE.conditions for status, reason in entry.pairs()}
    assert written - catalogued == set(), "written but not catalogued"
    assert {r for _, _, r in written} == set(CacheReason), "catalogued but never written"


def _deployment_scenarios() -> Iterator[tuple[Workload, Blocked | None]]:
    yield Workload(2, 2, 2, 2, True), None  # all ready
    yield Workload(0, 0, 0, 0, True), None  # scaled to zero
    yield Workload(0, 1, 1, 1, False), None  # scaling to zero
    yield Workload(2, 2, 0, 2, True), None  # rolling out, none ready yet
    yield Workload(2, 2, 1, 1, True, unschedulable="1 of 2 pods cannot be scheduled: no node"), None
    for reason in catalogue.POD_FAILURE_REASONS:
        yield Workload(2, 2, 1, 2, True, failure=PodFailure(reason, "pod p, container engine: failing")), None
    for reason in catalogue.BLOCKING_REASONS:
        yield Workload(2, 2, 2, 2, True), Blocked(reason, "blocked")
        yield Workload(0), Blocked(reason, "blocked")


GATEWAY = GatewayReport("gw", "chat", endpoints=1, accepted={"type": "Accepted", "status": "True"})
GATEWAY_SCENARIOS = (
    GATEWAY,  # accepted, serving
    replace(GATEWAY, missing_api="inferencepools.inference.networking.k8s.io/v1"),
    replace(GATEWAY, gateway_found=False),
    replace(GATEWAY, accepted=None),  # no Gateway controller has answered
    replace(GATEWAY, accepted={"type": "Accepted", "status": "False", "reason": "NotAllowedByListeners"}),
    replace(GATEWAY, endpoints=0),  # at zero replicas: requests are held
)


def test_every_deployment_condition_is_catalogued_under_its_type_and_status() -> None:
    """status.conditions() across every kind of situation: each condition it writes is catalogued with that type
    and status, every catalogued pair is written, and the reason is a plain string (the API gets JSON)."""
    pairs = {(entry.type, status, reason) for entry in DEPLOYMENT.conditions for status, reason in entry.pairs()}
    written = set()
    scenarios = [(w, b, None) for w, b in _deployment_scenarios()]
    scenarios += [(Workload(1, 1, 1, 1, True), None, gateway) for gateway in GATEWAY_SCENARIOS]
    for workload, blocked, gateway in scenarios:
        for cond in conditions([], 1, NOW, workload, blocked, gateway):
            assert type(cond["reason"]) is str and type(cond["type"]) is str
            written.add((cond["type"], cond["status"], DeploymentReason(cond["reason"])))
    assert written - pairs == set(), "written but not catalogued"
    assert pairs - written == set(), "catalogued but never written"


@pytest.mark.parametrize("book", [DEPLOYMENT, CACHE], ids=["deployment", "cache"])
def test_every_reason_has_a_meaning_and_a_type(book: Catalogue) -> None:
    enum = DeploymentReason if book is DEPLOYMENT else CacheReason
    assert set(book.meanings) == set(enum) == book.reasons()
    assert all(meaning.endswith(".") and len(meaning) > 20 for meaning in book.meanings.values())
    for entry in book.conditions:
        assert entry.at_rest in {status for status, _ in entry.pairs()}, entry.type
    assert [e.type for e in book.conditions] == list(dict.fromkeys(e.type for e in book.conditions))


@pytest.mark.parametrize(("kind", "book"), [("MiniMaxM3Deployment", DEPLOYMENT), ("MiniMaxM3ModelCache", CACHE)])
def test_the_crd_names_every_type_and_reason_where_kubectl_explain_shows_them(kind: str, book: Catalogue) -> None:
    crd = yaml.safe_load(crd_yaml(kind))
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    description = status["properties"]["conditions"]["description"]
    for entry in book.conditions:
        assert f"{entry.type} ({entry.at_rest} at rest)" in description
    for reason in book.reasons():
        assert reason in description, reason
    assert "ModelCacheNotFound" in description or book is CACHE


@pytest.mark.parametrize("book", [DEPLOYMENT, CACHE], ids=["deployment", "cache"])
def test_who_sets_a_condition_names_modules_that_exist(book: Catalogue) -> None:
    """The reference tells a reader where each condition is set: a module moved must move the catalogue too."""
    for entry in book.conditions:
        modules = re.findall(r"[\w/]+\.py", entry.set_by)
        assert modules, entry.set_by
        for module in modules:
            assert (PACKAGE / module).is_file(), f"{entry.type}: {module} does not exist"

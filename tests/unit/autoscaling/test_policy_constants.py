"""Every constant of the scaling policy has a name, a unit and a reason, and the user doc's tables are those of the
code (issue 46 item 5). The code is read as the interpreter reads it (its AST), not from a list kept by hand."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from m3fleet.autoscaling.policy.config import PolicyConfig
from m3fleet.autoscaling.policy.constants import CONSTANTS, FROM_SPEC, INLINE, TERMS, constants_table, terms_table

ROOT = Path(__file__).resolve().parents[3]
AUTOSCALING = ROOT / "operator" / "m3fleet" / "autoscaling"
# The modules whose numbers decide: the policy package (roles.py is the disaggregated roles' own policy) and the
# shared modules it reads.
SHARED = ("forecast", "signals", "slo", "time_to_ready")
AUDITED = sorted(
    p
    for p in [*(AUTOSCALING / "policy").glob("*.py"), *(AUTOSCALING / f"{n}.py" for n in SHARED)]
    if p.name not in {"__init__.py", "constants.py", "roles.py"}
)


def _number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool)


def _numeric(node: ast.AST) -> bool:
    """A number, or a tuple/dict/call of numbers (a table of them)."""
    inner = [n for n in ast.walk(node) if isinstance(n, ast.Constant)]
    return any(_number(n) for n in inner)


def _module_constants(tree: ast.Module) -> dict[str, ast.AST]:
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target.id, node.value
        if target and target.isupper() and not target.startswith("_") and value is not None and _numeric(value):
            found[target] = value
    return found


def _registered() -> set[str]:
    return {c.name for c in CONSTANTS}


@pytest.mark.parametrize("path", AUDITED, ids=lambda p: p.name)
def test_every_module_constant_is_registered(path: Path) -> None:
    module = path.relative_to(AUTOSCALING).with_suffix("").as_posix().replace("/", ".")
    missing = [n for n in _module_constants(ast.parse(path.read_text())) if f"{module}.{n}" not in _registered()]
    assert not missing, f"{path.name}: constants without a name, unit and reason in policy/constants.py: {missing}"


def test_every_policy_config_number_is_registered_or_set_from_the_spec() -> None:
    numbers = [
        f.name
        for f in dataclasses.fields(PolicyConfig)
        if isinstance(f.default, int | float) and not isinstance(f.default, bool)
    ]
    unaccounted = [n for n in numbers if n not in FROM_SPEC and f"PolicyConfig.{n}" not in _registered()]
    assert not unaccounted, f"PolicyConfig defaults with no reason in policy/constants.py: {unaccounted}"
    registered_and_spec = [n for n in numbers if n in FROM_SPEC and f"PolicyConfig.{n}" in _registered()]
    assert not registered_and_spec, f"set from the spec, so not a constant: {registered_and_spec}"


def test_from_spec_sets_exactly_the_fields_said_to_come_from_the_spec() -> None:
    tree = ast.parse((AUTOSCALING / "policy" / "config.py").read_text())
    from_spec = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "from_spec")
    values = next(n for n in ast.walk(from_spec) if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Dict))
    assert isinstance(values.value, ast.Dict)
    keys = {k.value for k in values.value.keys if isinstance(k, ast.Constant)}
    assert keys == FROM_SPEC


def _bare_numbers(path: Path) -> set[tuple[str, str]]:
    """(module, repr) of every number in the code that is no registered constant's definition: not 0 or 1, not a
    module constant's or PolicyConfig field's value, not round()'s digits."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            names = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(n, ast.Name) and n.id.isupper() for n in names):
                skip.update(id(n) for n in ast.walk(node.value))
        if isinstance(node, ast.ClassDef) and node.name == "PolicyConfig":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and item.value is not None:
                    skip.update(id(n) for n in ast.walk(item.value))
    for node in ast.walk(tree):
        is_round = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "round"
        if is_round and len(node.args) == 2:
            skip.add(id(node.args[1]))
    return {
        (path.stem, repr(node.value))  # repr: 2 and 2.0 are different literals (and equal as set members)
        for node in ast.walk(tree)
        if _number(node) and id(node) not in skip and node.value not in (0, 1)
    }


def test_every_bare_number_is_accounted_for() -> None:
    found: set[tuple[str, str]] = set()
    for path in AUDITED:
        found |= _bare_numbers(path)
    said = set(INLINE)
    assert found - said == set(), f"numbers with no name and no reason: {sorted(found - said)}"
    assert said - found == set(), f"INLINE lists numbers the code no longer has: {sorted(said - found)}"


def test_every_constant_has_a_unit_a_basis_and_a_reason() -> None:
    names = [c.name for c in CONSTANTS]
    assert len(names) == len(set(names)), "a constant is listed twice"
    for c in CONSTANTS:
        assert c.unit and c.why and c.basis, c.name
        assert c.value is not None and c.value is not dataclasses.MISSING, c.name


def test_every_term_is_one_decided_by_can_write() -> None:
    """The terms' names are those `decidedBy` writes: the need's largest, or the floor that raised it."""
    source = (AUTOSCALING / "policy" / "demand.py").read_text() + (AUTOSCALING / "policy" / "floors.py").read_text()
    for term in TERMS:
        assert f'"{term.name}"' in source, f"{term.name}: no term or floor writes it"


def test_the_user_doc_carries_the_generated_tables() -> None:
    doc = (ROOT / "docs" / "autoscaling.md").read_text()
    assert constants_table() in doc, "docs/autoscaling.md: run hack/generate.py"
    assert terms_table() in doc, "docs/autoscaling.md: run hack/generate.py"

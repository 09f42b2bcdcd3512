"""The method registry (core/runs/methods.py) is the one place that names a temperature method.

Everything else asks an entry what it needs (``measured``, ``search``, ``cost``, ``per``, ``takes_value``,
``constant``, ``grid_criterion``, ``same_as``) or reads a name the registry exports (``FIXED``, ``AS_TRAINED``,
``SWEEP_DEFAULT``). So adding a method is one entry, and renaming one is one line. This test reads every Python
file of the program (core/, ui/, app_pages/, app.py, bench/, research/; tests and docs may name methods) and fails on:

* a string literal equal to a method name, for names that mean nothing else (``log-length``, ``per-head``,
  ``fixed``, ...);
* for names that are also ordinary words of the program (``none``, ``pmax`` and ``entropy`` are criteria and
  statistics, ``llama4`` is a row scheme's name, ``adaptive`` the adaptive schedule's JSON scheme), the literal
  where a *method* is meant: compared with, assigned to, defaulted into or passed as something called ``method``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core.runs import methods
from core.runs.temperature import CRITERIA
from core.values.schedule import ADAPTIVE_SCHEME, RowTau

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = [p for d in ("core", "ui", "app_pages", "bench", "research") for p in sorted((ROOT / d).rglob("*.py"))] + [
    ROOT / "app.py"
]
OWNER = ROOT / "core" / "runs" / "methods.py"
#: names that are also other words of the program: flagged only where a method is meant
SHARED = {
    n
    for n in methods.NAMES
    if n in CRITERIA or n in ("none", RowTau.__dataclass_fields__["scheme"].default, ADAPTIVE_SCHEME)
}


def _about_methods(node: ast.AST) -> bool:
    """Whether an expression speaks of a method: a name, attribute or call whose text contains ``method``."""
    return "method" in ast.unparse(node).lower()


def _names_in(node: ast.AST) -> list[str]:
    """Method names held by a literal (a string, or a tuple / list / set of strings)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in methods.NAMES]


def _rope_types(tree: ast.AST) -> set[int]:
    """The constants that are transformers' ``rope_type`` keys, assigned to a name that says so (``YARN_ROPE =
    "yarn"``): data in transformers' vocabulary, not a method of ours (the issue's rule: a name that is data is fine
    where it is data)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and all(isinstance(t, ast.Name) and t.id.endswith("_ROPE") for t in node.targets)
        and isinstance(node.value, ast.Constant)
    }


def offences(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    data = _rope_types(tree)
    for node in ast.walk(tree):
        if id(node) in data:
            continue
        if isinstance(node, ast.Constant) and node.value in methods.NAMES and node.value not in SHARED:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                others = sides[:i] + sides[i + 1 :]
                for name in _names_in(side):
                    if name in SHARED and any(_about_methods(o) for o in others):
                        out.append((node.lineno, name))
        elif isinstance(node, ast.keyword) and node.arg and "method" in node.arg.lower():
            out += [(node.value.lineno, n) for n in _names_in(node.value) if n in SHARED]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_about_methods(t) for t in targets):
                out += [(node.lineno, n) for n in _names_in(node.value) if n in SHARED]
        elif isinstance(node, ast.arguments):
            args = node.posonlyargs + node.args
            pairs = list(zip(args[len(args) - len(node.defaults) :], node.defaults))
            pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
            out += [(d.lineno, n) for a, d in pairs if "method" in a.arg.lower() for n in _names_in(d) if n in SHARED]
    return sorted(set(out))


def test_only_the_registry_names_a_method():
    found = []
    for path in PROGRAM:
        if path == OWNER:
            continue
        for line, name in offences(ast.parse(path.read_text(encoding="utf-8"))):
            found.append(f"{path.relative_to(ROOT)}:{line}: {name!r}")
    assert not found, "method names outside core/runs/methods.py (ask the registry instead):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        'if method == "per-head": pass',
        'x = ("log-length", "yarn")',
        'if m.method in ("none", "fixed"): pass',
        'if chosen_method == "pmax": pass',
        'run(method="none")',
        'def f(method="entropy"): pass',
        'default_method = "none"',
        'YARN = "yarn"',
    ],
)
def test_the_check_sees_each_kind_of_naming(source):
    """The check can fail: each way of naming a method is caught (and the shared words elsewhere are not)."""
    assert offences(ast.parse(source))


@pytest.mark.parametrize(
    "source",
    [
        'stats = {"pmax": 0.5, "entropy": 2.0}',
        'if criterion == "pmax": pass',
        'loss(reduction="none")',
        "if m.takes_value: pass",
        'YARN_ROPE = "yarn"',
    ],
)
def test_shared_words_are_left_alone(source):
    assert not offences(ast.parse(source))

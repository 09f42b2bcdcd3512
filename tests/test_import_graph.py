"""The import graph of core/ and ui/: no cycles, no private names taken from another module (issue 37, point 3).

Why: a cycle makes every module in it load (and change) with all the
others, and hides which one owns a concept; a ``_private`` name imported from
elsewhere is an owner's internal detail used as if it were its interface.
The graph is read from the source with :mod:`ast`, so every import counts:
module level, inside functions (the usual way to hide a cycle) and under
``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "ui")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for top in PACKAGES for p in sorted((ROOT / top).rglob("*.py"))}


MODULES = _modules()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _from_base(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, relative imports resolved against ``name``."""
    base = node.module or ""
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return base


def _imports(name: str, path: Path) -> list[tuple[str, str | None, int]]:
    """Every import in a module as (imported module, name taken from it or None, line), ours only.

    ``from pkg import x`` is an import of the module ``pkg.x`` when there is
    one, else of the name ``x`` of ``pkg``; relative imports are resolved.
    """
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                for k in range(len(parts), 0, -1):  # the longest prefix that is one of our modules
                    target = ".".join(parts[:k])
                    if target in MODULES:
                        out.append((target, None, node.lineno))
                        break
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(name, path, node)
            if base.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub, None, node.lineno) if sub in MODULES else (base, alias.name, node.lineno))
    return out


GRAPH = {m: sorted({t for t, _, _ in _imports(m, p) if t != m}) for m, p in MODULES.items()}


def _cycles(nodes: set[str]) -> list[list[str]]:
    """The strongly connected components of more than one module among ``nodes`` (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in nodes:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(found)


def _in(package: str) -> set[str]:
    return {m for m in MODULES if m == package or m.startswith(package + ".")}


def _same_subpackage(a: str, b: str) -> bool:
    """Two modules of one sub-package (``core.data.tasks.line`` and ``core.data.tasks.layout``): they share its private
    helpers, as a package's modules do; the sub-package's public face is its ``__init__``. Top-level modules of
    ``core`` or ``ui`` are each their own owner."""
    pa, pb = a.rsplit(".", 1)[0], b.rsplit(".", 1)[0]
    return pa == pb and pa.count(".") >= 1


def _private_imports(package: str) -> list[str]:
    """``from X import _name`` (and ``X._name`` on a module bound by an import) across modules of ``package``."""
    bad = []
    for m in sorted(_in(package)):
        path = MODULES[m]
        for target, taken, line in _imports(m, path):
            if taken is not None and _private(taken) and target != m and not _same_subpackage(m, target):
                bad.append(f"{m}:{line} from {target} import {taken}")
        bound = _bound_modules(m, path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and bound[node.value.id] != m
                and _private(node.attr)
                and not _same_subpackage(m, bound[node.value.id])
            ):
                bad.append(f"{m}:{node.lineno} {bound[node.value.id]}.{node.attr}")
    return bad


def _bound_modules(name: str, path: Path) -> dict[str, str]:
    """Local names that an import binds to one of our modules (``from ui import cache``, ``import core.x as y``)."""
    bound: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in MODULES:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(name, path, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def test_the_graph_sees_function_level_and_type_checking_imports(tmp_path):
    """The walk is not only the module level: a cycle hidden in a function or a TYPE_CHECKING block counts."""
    src = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ui import sidebar\n"
        "def f():\n    from ui.cache import run\n    from ui import _hidden\n"
    )
    p = tmp_path / "probe.py"
    p.write_text(src)
    found = {(t, n) for t, n, _ in _imports("ui.probe", p)}
    assert ("ui.sidebar", None) in found and ("ui.cache", "run") in found and ("ui", "_hidden") in found


def test_no_cycle_among_ui_modules():
    assert _cycles(_in("ui")) == []


def test_ui_imports_no_private_name_of_another_module():
    assert _private_imports("ui") == []


def test_core_never_imports_the_app():
    """core is the plain library the CLI, the benchmarks and the app share: it imports nothing of ui/."""
    assert [m for m in _in("core") if any(t.split(".")[0] == "ui" for t in GRAPH[m])] == []


def test_no_cycle_among_core_modules():
    assert _cycles(_in("core")) == []


def test_core_imports_no_private_name_of_another_module():
    assert _private_imports("core") == []


# -- floors: core's packages stacked, each importing only its own floor or lower ------------------------------------

#: The intended floors, lowest first: a module may import its own floor's packages or a lower floor's, never a
#: higher one's (an arrow back up). One list, so moving a package or adding an import upwards fails here.
#: ``core`` is the package's own ``__init__``; ``core.engine`` and ``core.apply`` are the library's front doors
#: (re-exports of core.runs); ``core.cli`` (a module or a package of commands, ``core.__main__`` with it) is the
#: top of core; ui is the app above all of core.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("core", "core.errors", "core.kinds", "core.lazy"),
    ("core.values", "core.data"),
    ("core.mechanics",),
    ("core.models",),
    ("core.runs",),
    ("core.experiments", "core.views", "core.training", "core.engine", "core.apply"),
    ("core.cli",),
    ("ui",),
)
MAX_FLOORS = 8


def _unit(module: str) -> str:
    """The package of ``FLOORS`` a module belongs to: ``core.runs.engine`` -> ``core.runs``; ``core.__main__`` and
    ``core.cli.*`` -> ``core.cli``; every ui module -> ``ui``."""
    parts = module.split(".")
    if parts[0] == "ui":
        return "ui"
    if len(parts) == 1:
        return "core"
    if parts[1] in ("__main__", "cli"):
        return "core.cli"
    return ".".join(parts[:2])


FLOOR_OF = {unit: i for i, units in enumerate(FLOORS) for unit in units}


def _unit_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for m, targets in GRAPH.items():
        graph.setdefault(_unit(m), set()).update(_unit(t) for t in targets if _unit(t) != _unit(m))
    return graph


def _computed_floors() -> dict[str, int]:
    """Each package's floor from the graph alone: 1 + the highest floor it imports (1 for one importing nothing of
    ours). Defined only on an acyclic package graph (test_packages_form_no_cycle)."""
    graph = _unit_graph()
    floor: dict[str, int] = {}

    def of(u: str, path: tuple[str, ...] = ()) -> int:
        if u in path:
            raise AssertionError(f"a cycle among packages: {' -> '.join(path + (u,))}")
        if u not in floor:
            floor[u] = 1 + max((of(t, path + (u,)) for t in graph[u]), default=0)
        return floor[u]

    for u in graph:
        of(u)
    return floor


def test_every_package_has_a_floor():
    assert sorted({_unit(m) for m in MODULES} - set(FLOOR_OF)) == []


def test_packages_form_no_cycle():
    """Packages, not only modules: two packages importing each other (through any modules) share one floor's
    worth of change; :func:`_computed_floors` follows every path and names the cycle it meets."""
    assert _computed_floors()


def test_at_most_eight_floors():
    floors = _computed_floors()
    assert max(floors.values()) <= MAX_FLOORS, sorted(floors.items(), key=lambda kv: kv[1])
    assert len(FLOORS) <= MAX_FLOORS


def test_no_import_goes_up_a_floor():
    """A module imports only packages on its own floor or below (``FLOORS``): e.g. mechanics never reads runs."""
    up = [
        f"{m} -> {t}"
        for m, targets in sorted(GRAPH.items())
        for t in targets
        if FLOOR_OF.get(_unit(t), -1) > FLOOR_OF.get(_unit(m), len(FLOORS))
    ]
    assert up == []


def test_an_arrow_back_up_is_seen():
    """The check itself: an import of runs from mechanics (the arrow this test was written against) is caught."""
    assert FLOOR_OF[_unit("core.runs.temperature")] > FLOOR_OF[_unit("core.mechanics.softmax_block")]
    assert _unit("core.cli.run") == _unit("core.cli") == _unit("core.__main__") == "core.cli"

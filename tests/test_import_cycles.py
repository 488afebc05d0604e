"""``homagg/`` has no import cycle.

The graph: one node per module of ``homagg/**/*.py`` (a package is its ``__init__``), an arrow for
every import of another ``homagg`` module, read from the AST: ``import homagg.x``, ``from .x import
y``, ``from . import x`` (``x`` a module: that module, else the package), at module level **and
inside functions** (a lazy import is still a dependency: the circle ``p4._build`` <-> ``p4._tofino``
ran through one).  Imports under ``if TYPE_CHECKING:`` are left out: they never run (annotations
only).  Not followed: modules named by strings (``importlib.import_module`` in ``homagg/cli.py``,
``homagg._lazy``'s attribute table).  The detector is checked on a package made here with a circle
through a function-level import.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, modules: dict[str, Path], package: str) -> set[str]:
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    nodes: list[ast.AST] = [ast.parse(path.read_text())]
    while nodes:
        node = nodes.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                nodes.extend(child.orelse)
                continue
            nodes.append(child)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = alias.name
                    while target and target not in modules:
                        target = target.rpartition(".")[0]
                    if target:
                        found.add(target)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here.split(".")[:len(here.split(".")) - child.level + 1]
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                if source != package and not source.startswith(package + "."):
                    continue
                for alias in child.names:
                    sub = f"{source}.{alias.name}"
                    found.add(sub if sub in modules else source)
    found.discard(name)
    return {m for m in found if m in modules}


def import_cycles(root: Path, package: str) -> list[list[str]]:
    """The strongly connected components of more than one module (each a set of modules that
    import one another, directly or not), sorted."""
    modules = _modules(root, package)
    graph = {m: _imports(m, p, modules, package) for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return sorted(out)


def test_homagg_has_no_import_cycle() -> None:
    assert len(_modules(ROOT, "homagg")) > 100  # the tree was found
    assert import_cycles(ROOT, "homagg") == []


def test_detector_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from .b import Error\n")
    (pkg / "sub" / "b.py").write_text("class Error(Exception):\n    pass\n\n\ndef run():\n    from . import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import X\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    assert import_cycles(tmp_path, "pkg") == [["pkg.sub.a", "pkg.sub.b"]]

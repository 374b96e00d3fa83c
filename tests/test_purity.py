"""Purity and layering, checked on the import graph (statically, from the AST).

* The pure core (the rules, the planner, both backends, the state and its
  records, the free queues, the canonical encoding, the events and the
  invariants) imports nothing from torch, time, random, os and friends,
  even transitively: every ``kvstate`` import of those modules is followed,
  wherever it sits (a function-local import counts too).
* No import cycle between ``kvstate`` modules: a module-level import graph
  with a cycle works only by the order modules happen to load in, and one
  edit away from a partially initialised module.  Function-local imports
  (deferred on purpose) and ``if TYPE_CHECKING:`` blocks are not edges.
  ``from package import name`` is an edge to the submodule when ``name`` is
  one, else to the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kvstate

FORBIDDEN = {"torch", "time", "random", "os", "datetime", "numpy", "secrets", "uuid"}
PURE_ROOTS = [
    "kvstate.rules", "kvstate.planner", "kvstate.backends", "kvstate.state", "kvstate.records",
    "kvstate.freequeue", "kvstate.canonical", "kvstate.events", "kvstate.invariants",
]
PACKAGE_DIR = Path(kvstate.__file__).parent


def module_path(name: str) -> Path | None:
    relative = Path(*name.split(".")[1:])
    for candidate in (PACKAGE_DIR / relative / "__init__.py", PACKAGE_DIR / f"{relative}.py"):
        if candidate.exists():
            return candidate
    return None


def all_modules() -> list[str]:
    out = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _statements(tree: ast.Module, top_level: bool) -> list[ast.stmt]:
    """Import statements: every one (``top_level=False``) or those run at import time."""
    if not top_level:
        return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    found: list[ast.stmt] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If | ast.Try | ast.With) and not _type_checking(node):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []) or []:
                    todo.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])
    return found


def imports_of(name: str, *, top_level: bool = False) -> set[str]:
    path = module_path(name)
    assert path is not None, f"no source for {name}"
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in _statements(tree, top_level):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = name.split(".")
            base = base if is_package else base[:-1]
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        submodules = {f"{module}.{a.name}" for a in node.names
                      if module.startswith("kvstate") and module_path(f"{module}.{a.name}")}
        found.update(submodules)
        if len(submodules) < len(node.names):  # some names are the package's own
            found.add(module)
    return found


def pure_closure() -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    todo = list(PURE_ROOTS)
    for root in PURE_ROOTS:
        path = module_path(root)
        if path is not None and path.name == "__init__.py":
            todo.extend(f"{root}.{p.stem}" for p in path.parent.glob("*.py") if p.stem != "__init__")
    while todo:
        name = todo.pop()
        if name in seen or module_path(name) is None:
            continue
        seen[name] = imports_of(name)
        todo.extend(m for m in seen[name] if m.startswith("kvstate.") and m != "kvstate")
    return seen


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if state.get(root):
            continue
        path = [root]
        iters = [iter(sorted(graph[root]))]
        state[root] = 1
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt) and nxt in graph:
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(sorted(graph[nxt])))
    return None


def module_graph() -> dict[str, set[str]]:
    modules = set(all_modules())
    return {m: {i for i in imports_of(m, top_level=True) if i in modules and i != m}
            for m in modules}


def test_the_pure_core_imports_no_side_effecting_module():
    graph = pure_closure()
    for must in ("kvstate.rules.tree", "kvstate.planner.alloc", "kvstate.backends.live",
                 "kvstate.invariants.incremental", "kvstate.events.codec", "kvstate.records"):
        assert must in graph
    offenders = {
        module: sorted(i for i in imported if i.split(".")[0] in FORBIDDEN)
        for module, imported in graph.items()
    }
    offenders = {m: i for m, i in offenders.items() if i}
    assert offenders == {}


def test_no_import_cycle_between_kvstate_modules():
    graph = module_graph()
    assert len(graph) > 100 and "kvstate.rules.pages" in graph["kvstate.rules"]
    cycles = []
    while (cycle := find_cycle(graph)) is not None:  # report each, cutting one edge of it
        cycles.append(" -> ".join(cycle))
        graph[cycle[-2]].discard(cycle[-1])
    assert cycles == []


def test_the_walks_would_catch_an_offender_and_a_cycle(tmp_path):
    """Canaries: the same helpers flag a module that imports time, and a two-module cycle."""
    fake = tmp_path / "kvstate_fake.py"
    fake.write_text("import time\nfrom os import path\n")
    tree = ast.parse(fake.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {n.split(".")[0] for n in names} & FORBIDDEN == {"time", "os"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None

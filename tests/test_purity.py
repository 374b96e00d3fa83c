"""The pure core imports nothing from torch, time, random, os or datetime, even transitively.

Walks the import graph statically (AST), following every ``kvstate`` import
from the core's modules, so an indirect import through a helper module
is caught too.
"""

import ast
from pathlib import Path

import kvstate

FORBIDDEN = {"torch", "time", "random", "os", "datetime", "numpy", "secrets", "uuid"}
PURE_ROOTS = [
    "kvstate.state", "kvstate.freequeue", "kvstate.encoding", "kvstate.events",
    "kvstate.reducer", "kvstate.invariants", "kvstate.planner", "kvstate.engine",
    "kvstate.config", "kvstate.errors", "kvstate.transient",
    "kvstate.kv_manager.basic", "kvstate.kv_manager.paged", "kvstate.kv_manager.sharing",
    "kvstate.kv_manager.prefix", "kvstate.kv_manager.stats", "kvstate.kv_manager.names",
    "kvstate.kv_manager.checks", "kvstate.kv_manager.errors",
]
PACKAGE_DIR = Path(kvstate.__file__).parent


def module_path(name: str) -> Path | None:
    relative = Path(*name.split(".")[1:])
    for candidate in (PACKAGE_DIR / relative / "__init__.py", PACKAGE_DIR / f"{relative}.py"):
        if candidate.exists():
            return candidate
    return None


def imports_of(name: str) -> set[str]:
    path = module_path(name)
    assert path is not None, f"no source for {name}"
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            for alias in node.names:  # "from kvstate.reducer import pages" imports a submodule
                if module_path(f"{module}.{alias.name}") is not None and module.startswith("kvstate"):
                    found.add(f"{module}.{alias.name}")
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


def test_the_pure_core_imports_no_side_effecting_module():
    graph = pure_closure()
    assert "kvstate.reducer.tree" in graph and "kvstate.planner.alloc" in graph
    assert "kvstate.kv_manager.paged" in graph and "kvstate.transient.block" in graph
    offenders = {
        module: sorted(i for i in imported if i.split(".")[0] in FORBIDDEN)
        for module, imported in graph.items()
    }
    offenders = {m: i for m, i in offenders.items() if i}
    assert offenders == {}


def test_the_checker_would_catch_an_offender(tmp_path, monkeypatch):
    """A canary: the same walk flags a module that imports time."""
    fake = tmp_path / "kvstate_fake.py"
    fake.write_text("import time\nfrom os import path\n")
    tree = ast.parse(fake.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {n.split(".")[0] for n in names} & FORBIDDEN == {"time", "os"}

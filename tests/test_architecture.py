"""The layout holds: no import cycle, packages import only what they may, no module reaches into another's
private names. Read from the source (every import, also those inside functions), not by importing it."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("corpus", "warehouse", "nkb_model", "stages", "flows", "bench")
# What each package may import of the project (docs/architecture.md's table of packages).
MAY_IMPORT = {
    "corpus": {"corpus"},
    "warehouse": {"warehouse"},
    "nkb_model": {"nkb_model"},
    "stages": {"corpus", "warehouse", "nkb_model", "stages"},
    "flows": {"corpus", "warehouse", "stages", "flows"},
    "bench": {"corpus", "warehouse", "nkb_model", "stages", "bench"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imported_modules(tree: ast.AST, importer: str) -> set[str]:
    """The project modules a module imports, anywhere in it: `from a.b import c` is a.b.c if that is a
    module, else a.b."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {m for m in found if m in MODULES and m != importer}


def graph() -> dict[str, set[str]]:
    return {name: imported_modules(ast.parse(path.read_text()), name) for name, path in MODULES.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_packages_import_only_the_layers_below_them():
    wrong = [f"{importer} imports {imported}" for importer, imports in graph().items() for imported in imports
             if imported.split(".")[0] not in MAY_IMPORT[importer.split(".")[0]]]
    assert wrong == []


@pytest.mark.parametrize("package", ["tests", *PACKAGES])
def test_no_module_uses_another_modules_private_names(package):
    project = set(PACKAGES)
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        modules = set()  # names bound to project modules in this file
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in project:
                wrong += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_")]
                modules |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in MODULES}
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name for a in node.names if a.name.split(".")[0] in project}
        wrong += [f"{path.name}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in modules and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert wrong == []


def test_every_third_party_package_the_code_imports_is_declared():
    import importlib.metadata
    import re
    import sys
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in requirements}
    declared = names(project["dependencies"])
    dev = declared | names(project["optional-dependencies"]["dev"])  # the benchmarks' comparisons may use these
    distributions = importlib.metadata.packages_distributions()  # top-level module -> distributions providing it
    undeclared = {}
    for name, path in MODULES.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
        allowed = dev if name.startswith("bench.") else declared
        undeclared |= {m: distributions.get(m) for m in imported - set(sys.stdlib_module_names) - set(PACKAGES)
                       if not {d.lower().replace("_", "-") for d in distributions.get(m, [])} & allowed}
    assert not undeclared, f"imported but not in pyproject.toml's dependencies: {undeclared}"


def test_no_stage_function_is_longer_than_40_lines():
    """A stage is read → compute → write; what it reads is declared (`stages.reads`), not assembled by hand."""
    long = [f"{name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for name, path in MODULES.items() if name.startswith("stages.")
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
            and node.end_lineno - node.lineno + 1 > 40]
    assert long == []


def test_no_two_modules_of_the_project_share_a_name():
    # `augment` in corpus and in stages read as one module in a traceback, a grep or an import line
    names: dict[str, list[str]] = {}
    for module in MODULES:
        if not module.endswith("__init__") and "." in module:
            names.setdefault(module.rsplit(".", 1)[1], []).append(module)
    shared = {name: found for name, found in names.items() if len(found) > 1 and name not in PACKAGES}
    assert not shared, shared

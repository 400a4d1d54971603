"""The house's walls: imports flow base -> ingest -> engine -> reports -> CLI, with no cycles and no
private names crossing modules (docs/architecture.md). Read from the sources, so a violation fails
here before anyone trips over it."""

from __future__ import annotations

import ast
import importlib.util
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# installed package -> repository folder (pyproject.toml, [tool.setuptools.package-dir])
FOLDERS = {name: ROOT / folder for name, folder in
           tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"].items()}
# Layers, bottom-up: a module may import its own layer and the layers below it, never above.
LAYERS = ["replay.base", "replay.ingest", "replay.engine", "replay.reports", "replay"]


@dataclass(frozen=True)
class ImportEdge:
    """One import statement: `importer` imports `target` (a module), naming `names` from it."""

    importer: str
    target: str
    names: tuple[str, ...]
    line: int


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by its installed name."""
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            found[name] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _edges() -> list[ImportEdge]:
    edges = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in MODULES:
                        edges.append(ImportEdge(name, alias.name, (), node.lineno))
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(name, node)
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in MODULES:
                        edges.append(ImportEdge(name, sub, (), node.lineno))
                    elif target in MODULES:
                        edges.append(ImportEdge(name, target, (alias.name,), node.lineno))
    return edges


EDGES = _edges()


def _layer(module: str) -> int:
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return i
    raise AssertionError(module)


def _where(edge: ImportEdge) -> str:
    return f"{MODULES[edge.importer].relative_to(ROOT)}:{edge.line}"


def test_the_package_is_found() -> None:
    assert {"replay.base.errors", "replay.engine.scheduler", "replay.ingest.schema", "replay.reports.views",
            "replay.cli"} <= set(MODULES)
    assert len(EDGES) > 300


def test_the_base_imports_nothing_of_the_project() -> None:
    bad = [f"{_where(e)} imports {e.target}" for e in EDGES
           if _layer(e.importer) == 0 and _layer(e.target) != 0]
    assert not bad, "\n".join(bad)


def test_imports_flow_the_way_data_does() -> None:
    """base -> ingest -> engine -> reports -> CLI: nothing imports a layer above its own."""
    bad = [f"{_where(e)}: {LAYERS[_layer(e.importer)]} imports {e.target}" for e in EDGES
           if _layer(e.target) > _layer(e.importer)]
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _packages_run_by(importer: str, target: str) -> list[str]:
    """The packages whose __init__ importing ``target`` runs, besides the importer's own ancestors
    (already running): importing a.b.c runs a/b/__init__.py too."""
    parts = target.split(".")
    return [p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
            if p in MODULES and not importer.startswith(p + ".")]


def test_no_import_cycle_between_modules() -> None:
    """Imports inside functions count too: a cycle hidden in a function is still a cycle; so does
    the package __init__ an import runs. A package's own __init__ importing its submodules is not an
    edge back (the submodule imports its package's parent namespace only to be found)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in EDGES:
        if e.importer != e.target and not e.importer.startswith(e.target + "."):
            graph[e.importer].add(e.target)
        graph[e.importer].update(_packages_run_by(e.importer, e.target))
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _package_of(module: str) -> str:
    return module if _is_package(module) else module.rpartition(".")[0]


def test_no_import_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for e in EDGES:
        a, b = _package_of(e.importer), _package_of(e.target)
        if a != b and not a.startswith(b + ".") and not b.startswith(a + "."):
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    cycles = _cycles(graph)
    assert not cycles, "package cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_private_name_crosses_a_module() -> None:
    """What one module uses of another is public and named for what it is: no `from x import _y`, and
    no private module (`_x.py`) imported from outside its own package."""
    bad = []
    for e in EDGES:
        private = [n for n in e.names if n.startswith("_") and not n.startswith("__")]
        if private:
            bad.append(f"{_where(e)} imports {', '.join(private)} from {e.target}")
        leaf = e.target.rpartition(".")[2]
        if leaf.startswith("_") and not leaf.startswith("__") and _package_of(e.importer) != _package_of(e.target):
            bad.append(f"{_where(e)} imports the private module {e.target}")
    bad += _private_attributes_of_imported_modules()
    assert not bad, "\n".join(bad)


def _private_attributes_of_imported_modules() -> list[str]:
    """`module._name` where `module` is another module of ours bound by an import."""
    bad = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        bound: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bound.update({a.asname: a.name for a in node.names if a.asname and a.name in MODULES})
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(name, node)
                bound.update({a.asname or a.name: f"{target}.{a.name}" for a in node.names
                              if f"{target}.{a.name}" in MODULES})
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {bound[node.value.id]}.{node.attr}")
    return bad


@pytest.mark.parametrize("name", ["engine", "ingest", "reports"])
def test_no_generic_top_level_name_is_installed(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only `replay` is installed: from outside the checkout, `import engine` finds nothing of ours."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if Path(p or ".").resolve() != ROOT])
    spec = importlib.util.find_spec(name)
    assert spec is None or not str(spec.origin or "").startswith(str(ROOT)), spec

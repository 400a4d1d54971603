"""Routers see a replica only through ReplicaView: no router module imports the rest of the engine.

A router module may import, of the engine, the view (engine/replica_view.py), the Request record
(engine/request.py), the routers' own base, their options (engine/router_options.py) and the
KV-aware router's compiled bookkeeping (engine/routers/active_blocks.py); nothing else (not the core, the
scheduler, the KV cache manager or the block pool). It also reads no engine object's internals
through attribute names the view keeps private or the core exposes. Every .py file in
engine/routers/ is checked, so a new router is held to this as soon as it is added.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import replay.engine.routers as routers_package

ROUTERS_DIR = Path(routers_package.__file__).resolve().parent
PACKAGE = routers_package.__name__  # "replay.engine.routers"
ENGINE = PACKAGE.rsplit(".", 1)[0]

# Engine modules a router policy module may import.
POLICY_ALLOWED = {f"{ENGINE}.replica_view", f"{ENGINE}.request", f"{PACKAGE}.base", f"{ENGINE}.router_options",
                  f"{PACKAGE}.active_blocks"}
# The interface module also names what a router knows before the run (RouterContext.trace) and
# re-exports the seeded hash routers may use.
BASE_ALLOWED = {f"{ENGINE}.replica_view", f"{ENGINE}.request", f"{ENGINE}.trace_input",
                f"{ENGINE}.spec_decode"}
# Attribute names that would reach past the view: its private slots, the core's engine objects.
FORBIDDEN_ATTRIBUTES = {"_core", "_pool", "_usable", "kv_pool", "sched", "kv", "offload", "timer", "rec",
                        "inbox", "pending"}


def _imported_modules(tree: ast.AST, module: str) -> set[str]:
    """Absolute names of the modules (and, for ``from m import x``, the possible submodules m.x)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.rsplit(".", node.level)[0] if not module.endswith("__init__") else module
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            out.add(name)
    return out


def _engine_imports_beyond(source: str, module: str, allowed: set[str]) -> list[str]:
    tree = ast.parse(source)
    bad = []
    for name in sorted(_imported_modules(tree, module)):
        if name != ENGINE and not name.startswith(ENGINE + "."):
            continue  # the standard library, numpy, pydantic, ...
        if name in allowed:
            continue
        bad.append(name)
    return bad


def _forbidden_attributes(source: str) -> list[str]:
    return sorted({node.attr for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES})


def _router_files() -> list[Path]:
    return sorted(ROUTERS_DIR.glob("*.py"))


def test_the_check_sees_every_router_module():
    names = {p.stem for p in _router_files()}
    assert {"__init__", "base", "simple", "least_loaded", "kv_aware", "prefix_score"} <= names


@pytest.mark.parametrize("path", _router_files(), ids=lambda p: p.name)
def test_router_module_imports_nothing_else_of_the_engine(path):
    module = f"{PACKAGE}.{path.stem}" if path.stem != "__init__" else PACKAGE
    source = path.read_text()
    if path.stem == "__init__":  # the registry: every router module, nothing else of the engine
        bad = [m for m in _engine_imports_beyond(source, module, {f"{ENGINE}.router_options"})
               if not m.startswith(PACKAGE + ".")]
    elif path.stem == "base":
        bad = _engine_imports_beyond(source, module, BASE_ALLOWED)
    else:
        bad = _engine_imports_beyond(source, module, POLICY_ALLOWED)
    assert not bad, (f"{path.name} imports {bad} of the engine: a router may read a replica only through "
                     f"{ENGINE}.replica_view.ReplicaView (see {PACKAGE}.base)")
    assert not _forbidden_attributes(source), f"{path.name} reaches past the replica view"


def test_the_check_catches_engine_imports_and_reaches():
    mod = f"{PACKAGE}.mine"
    assert _engine_imports_beyond(f"from {ENGINE}.core import EngineCore\n", mod, POLICY_ALLOWED) == [
        f"{ENGINE}.core"]
    assert _engine_imports_beyond(f"import {ENGINE}.block_pool as bp\n", mod, POLICY_ALLOWED) == [
        f"{ENGINE}.block_pool"]
    assert _engine_imports_beyond("def f():\n    from .. import scheduler\n", mod, POLICY_ALLOWED) == [ENGINE]
    assert _engine_imports_beyond(f"from {ENGINE}.replica_view import ReplicaView\nimport numpy\n", mod,
                                  POLICY_ALLOWED) == []
    reach = "def route(self, req, replicas, now):\n    return replicas[0].kv_pool\n"
    assert _forbidden_attributes(reach) == ["kv_pool"]
    assert _forbidden_attributes("x = replicas[0]._core.sched\n") == ["_core", "sched"]

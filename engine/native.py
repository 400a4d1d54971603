"""Which engine modules run compiled (mypyc, built by setup.py) and which from their Python source.

The hot loop (scheduler, KV cache manager, block pool, block keys, requests, decode windows and the
timers' window timing, G2 tier, recorder, replica step halves) is compiled at install time when a
C compiler is available: the same sources, about twice as fast, byte-identical outputs. Python
would import a compiled module in preference to its source even after the source was edited, so
this module checks each one against the digest its build recorded and imports an edited (or not
compiled) module from source. ``REPLAY_PURE_PYTHON=1`` forces every module to source (the test
suite runs that way; tests/engine/test_native_core.py checks that both give the same bytes).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

NATIVE_MODULES = (
    "replay.engine.request",
    "replay.engine.block_keys",
    "replay.engine.free_block_queue",
    "replay.engine.block_hash_map",
    "replay.engine.whole_table_index",
    "replay.engine.block_pool_free",
    "replay.engine.block_pool",
    "replay.engine.kv_cache_manager",
    "replay.engine.schedule_waiting",
    "replay.engine.scheduler",
    "replay.engine.decode_steps",
    "replay.engine.decode_window",
    "replay.engine.key_lru_store",
    "replay.engine.run_list",
    "replay.engine.cpu_store",
    "replay.engine.kv_links",
    "replay.engine.kv_tiers",
    "replay.engine.offload",
    "replay.engine.row_runs",
    "replay.engine.recorder",
    "replay.engine.routers.active_blocks",
    "replay.engine.core",
    "replay.engine.timing.roofline_decode",
    "replay.engine.timing.aic_decode",
)
PURE_ENV = "REPLAY_PURE_PYTHON"
_PACKAGE_DIR = Path(__file__).resolve().parent
_MANIFEST = _PACKAGE_DIR / "_native_build.json"


def _source(name: str) -> Path:
    """replay.engine.timing.aic_decode -> .../engine/timing/aic_decode.py"""
    return _PACKAGE_DIR.joinpath(*name.split(".")[2:]).with_suffix(".py")


def _compiled_file(name: str) -> Path | None:
    src = _source(name)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = src.with_name(src.stem + suffix)
        if path.exists():
            return path
    return None


def _up_to_date() -> set[str]:
    """Modules whose compiled file was built from the source now on disk."""
    try:
        manifest = json.loads(_MANIFEST.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not manifest.get("compiled"):
        return set()
    built = manifest.get("modules", {})
    fresh = set()
    for name in NATIVE_MODULES:
        src = _source(name)
        if _compiled_file(name) is None or name not in built:
            continue
        try:
            if hashlib.sha256(src.read_bytes()).hexdigest() == built[name]:
                fresh.add(name)
        except OSError:
            continue
    return fresh


class _SourceFinder:
    """A meta-path finder that loads the listed engine modules from their .py source."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001 - importlib protocol
        if fullname not in self.names:
            return None
        src = _source(fullname)
        loader = importlib.machinery.SourceFileLoader(fullname, str(src))
        return importlib.util.spec_from_file_location(fullname, src, loader=loader)


def _install() -> frozenset[str]:
    fresh = set() if os.environ.get(PURE_ENV) else _up_to_date()
    # All or nothing: compiled modules call each other natively, and a compiled module would bind
    # the compiled versions of the others anyway.
    compiled = frozenset(NATIVE_MODULES) if fresh == set(NATIVE_MODULES) else frozenset()
    from_source = set(NATIVE_MODULES) - compiled
    if from_source and any(_compiled_file(n) is not None for n in from_source):
        sys.meta_path.insert(0, _SourceFinder(from_source))
    return compiled


COMPILED = _install()


def stale_build() -> bool:
    """True when a compiled core was built but the sources changed since (it is not used)."""
    if os.environ.get(PURE_ENV) or COMPILED:
        return False
    try:
        manifest = json.loads(_MANIFEST.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(manifest.get("compiled")) and any(_compiled_file(n) is not None for n in NATIVE_MODULES)


def core_kind() -> str:
    """'compiled' when the engine's hot loop runs as mypyc-compiled code, else 'python'."""
    if COMPILED and all(
            getattr(sys.modules.get(n), "__file__", "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
            for n in COMPILED if n in sys.modules):
        return "compiled"
    return "python"

"""Build hook: compile the engine's hot loop with mypyc when a C compiler is at hand.

The compiled modules are the very same Python sources (engine/native.py lists them); without mypy
or a compiler, or with REPLAY_PURE_PYTHON=1 at install time, the package installs as pure Python
and runs the same code, slower. Outputs are byte-identical either way (tests/test_native_core.py).
Metadata lives in pyproject.toml; this file only adds the optional extension modules.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# Keep in step with engine/native.py NATIVE_MODULES (a test checks they agree).
NATIVE_SOURCES = [
    "engine/request.py",
    "engine/block_keys.py",
    "engine/block_pool.py",
    "engine/kv_cache_manager.py",
    "engine/scheduler.py",
    "engine/decode_window.py",
    "engine/cpu_store.py",
    "engine/offload.py",
    "engine/row_runs.py",
    "engine/recorder.py",
    "engine/core.py",
    "engine/timing/roofline_decode.py",
    "engine/timing/aic_decode.py",
]
MANIFEST = "engine/_native_build.json"


def _say(message: str) -> None:
    print(f"replay-analyzer build: {message}", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python when compiling fails (no compiler, no headers)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure means: install pure Python
            _say(f"compiled core not built ({exc}); the engine runs as pure Python")
            _write_manifest(compiled=False, reason=f"compiling failed: {exc}")


def _write_manifest(compiled: bool, reason: str = "") -> None:
    """Record which sources the extension modules were built from: a module whose source has changed
    since (an edited checkout) is then imported from source, never stale (engine/native.py)."""
    digests = {src: hashlib.sha256((HERE / src).read_bytes()).hexdigest() for src in NATIVE_SOURCES}
    (HERE / MANIFEST).write_text(json.dumps({"compiled": compiled, "reason": reason, "sources": digests}, indent=1) + "\n")


def _ext_modules() -> list:
    if os.environ.get("REPLAY_PURE_PYTHON"):
        _say("REPLAY_PURE_PYTHON is set: pure Python install")
        _write_manifest(compiled=False, reason="requested (REPLAY_PURE_PYTHON)")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypy is not installed in the build environment: pure Python install")
        _write_manifest(compiled=False, reason="mypy is not installed in the build environment")
        return []
    # The isolated build environment has none of the runtime dependencies (numpy...): their types
    # are unknown to the compiler, which treats them as Any. Modules that are not compiled are read
    # for their types only.
    flags = ["--ignore-missing-imports", "--follow-imports=silent"]
    try:
        modules = mypycify([*flags, *NATIVE_SOURCES], opt_level="3", debug_level="0")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a type error must not break the install
        _say(f"mypyc could not compile the engine core ({exc!r}); the engine runs as pure Python")
        _write_manifest(compiled=False, reason=f"mypyc failed: {exc!r}")
        return []
    _write_manifest(compiled=True)
    return modules


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})

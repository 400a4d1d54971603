"""Build hook: map the repository's folders onto one installed package, and compile the engine's hot
loop with mypyc when a C compiler is at hand.

Layout. What installs is one package, ``replay``: the folders engine/, ingest/ and reports/ become its
subpackages ``replay.engine``, ``replay.ingest`` and ``replay.reports`` (pyproject.toml's
``[tool.setuptools.package-dir]``), so nothing lands in site-packages under a generic top-level name.

Compiled core. The compiled modules are the very same Python sources (engine/native.py lists them);
without mypy or a compiler, or with REPLAY_PURE_PYTHON=1 at build time, the package installs as pure
Python and runs the same code, slower. Outputs are byte-identical either way. mypyc names a module by
the folders above its file, so it compiles a copy of the sources laid out as installed
(replay/engine/...) in a temporary folder; nothing is written into the source tree but what
setuptools itself puts there (an editable install's extension modules, beside their sources). The
build records which sources it compiled in ``_native_build.json`` next to the extension modules,
written only when they are built: a pure-Python build of the same checkout leaves an editable
install's compiled core alone. mypyc's shared runtime library for the compiled modules is
``replay/engine__mypyc`` (``group_name``), inside the package like the rest.
"""

from __future__ import annotations

import ast
import atexit
import hashlib
import json
import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# installed package -> repository folder (pyproject.toml, [tool.setuptools.package-dir])
PACKAGE_DIRS: dict[str, str] = tomllib.loads((HERE / "pyproject.toml").read_text(encoding="utf-8"))[
    "tool"]["setuptools"]["package-dir"]


def _native_modules() -> list[str]:
    """engine/native.py's NATIVE_MODULES, read without importing the package (its dependencies are
    not in the build environment)."""
    tree = ast.parse((HERE / "engine" / "native.py").read_text(encoding="utf-8"))
    return list(next(ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                     and any(getattr(target, "id", "") == "NATIVE_MODULES" for target in node.targets)))


NATIVE_MODULES = _native_modules()
MANIFEST_NAME = "_native_build.json"


def _say(message: str) -> None:
    print(f"replay-analyzer build: {message}", file=sys.stderr)


def _packages() -> list[str]:
    """Every package under each mapped folder, named as installed (data folders included)."""
    found = []
    for package, folder in PACKAGE_DIRS.items():
        found.append(package)
        found += [f"{package}.{sub}" for sub in find_namespace_packages(where=str(HERE / folder),
                                                                      exclude=["*__pycache__*"])]
    return sorted(found)


def _source_path(module: str) -> Path:
    """replay.engine.timing.aic_decode -> <checkout>/engine/timing/aic_decode.py (every compiled
    module is in the engine, as engine/native.py names them)."""
    return HERE.joinpath(PACKAGE_DIRS["replay.engine"], *module.split(".")[2:]).with_suffix(".py")


def _manifest() -> str:
    digests = {m: hashlib.sha256(_source_path(m).read_bytes()).hexdigest() for m in NATIVE_MODULES}
    return json.dumps({"compiled": True, "modules": digests}, indent=1) + "\n"


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python when compiling fails (no compiler, no headers), and
    records the compiled sources beside the extension modules it wrote."""

    built = False

    def _manifest_path(self) -> Path:
        return Path(self.get_ext_fullpath("replay.engine.request")).parent / MANIFEST_NAME  # engine/

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure means: install pure Python
            _say(f"compiled core not built ({exc}); the engine runs as pure Python")
            return
        if not self.extensions:
            return
        self._manifest_path().parent.mkdir(parents=True, exist_ok=True)
        self._manifest_path().write_text(_manifest())
        self.built = True

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        return [*outputs, str(self._manifest_path())] if self.built else outputs


def _staged_tree() -> Path:
    """A temporary copy of the sources laid out as installed, for mypyc to name modules by."""
    stage = Path(tempfile.mkdtemp(prefix="replay-mypyc-"))
    atexit.register(shutil.rmtree, stage, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", MANIFEST_NAME)
    shutil.copytree(HERE / "replay", stage / "replay", ignore=ignore)
    for package, folder in PACKAGE_DIRS.items():
        if package != "replay":
            shutil.copytree(HERE / folder, stage.joinpath(*package.split(".")), ignore=ignore)
    return stage


def _ext_modules() -> list:
    if os.environ.get("REPLAY_PURE_PYTHON"):
        _say("REPLAY_PURE_PYTHON is set: pure Python install")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypy is not installed in the build environment: pure Python install")
        return []
    # The isolated build environment has none of the runtime dependencies (numpy...): their types
    # are unknown to the compiler, which treats them as Any. Modules that are not compiled are read
    # for their types only.
    flags = ["--ignore-missing-imports", "--follow-imports=silent"]
    stage = _staged_tree()
    sources = [str(Path(*m.split(".")).with_suffix(".py")) for m in NATIVE_MODULES]
    cwd = os.getcwd()
    try:
        os.chdir(stage)
        # group_name: mypyc's shared library is replay/engine__mypyc (inside the package, a fixed name)
        # rather than a top-level <hash>__mypyc that changes with the module list.
        modules = mypycify([*flags, *sources], opt_level="3", debug_level="0", group_name="replay.engine",
                           target_dir=str(stage / "build"))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a type error must not break the install
        _say(f"mypyc could not compile the engine core ({exc!r}); the engine runs as pure Python")
        return []
    finally:
        os.chdir(cwd)
    for ext in modules:  # the generated C lives in the stage: make its paths absolute
        ext.sources = [s if os.path.isabs(s) else str(stage / s) for s in ext.sources]
        ext.include_dirs = [d if os.path.isabs(d) else str(stage / d) for d in ext.include_dirs]
    return modules


setup(
    packages=_packages(),
    ext_modules=_ext_modules(),
    cmdclass={"build_ext": OptionalBuildExt},
)

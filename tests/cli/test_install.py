"""What installs: one package, `replay`, that runs from any folder, names nothing generic at the top
level, and whose build leaves the checkout's packages as they were (an editable install in the same
checkout keeps its compiled core)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.cli_helpers import ROOT, SAMPLE

pytestmark = pytest.mark.slow
PACKAGE_FOLDERS = ("replay", "engine", "ingest", "reports")


def _package_files() -> dict[str, str]:
    """Every file of the checkout's package folders (tracked or not, compiled modules included)."""
    digests = {}
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digests[str(path.relative_to(ROOT))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (seeing this interpreter's dependencies) with `pip install .` of the checkout,
    pure Python so the test stays quick; returns its python."""
    where = tmp_path_factory.mktemp("venv")
    venv.create(where, system_site_packages=True, with_pip=False)
    python = where / "bin" / "python"
    before = _package_files()
    env = dict(os.environ, REPLAY_PURE_PYTHON="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                          "--no-build-isolation", str(ROOT)], env=env, capture_output=True, text=True,
                         cwd=where)
    if res.returncode and "no such option: --python" in res.stderr:
        pytest.skip("pip is older than 22.3 (no --python)")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _package_files() == before, "building the package wrote into the checkout's package folders"
    return python


def _run(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REPLAY_PURE_PYTHON")}
    return subprocess.run([str(python), "-c", code], cwd=cwd, env=env, capture_output=True, text=True)


def test_the_installed_package_replays_from_another_folder(installed: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["replay", "run", str(SAMPLE), "-o", str(out), "-q", "--set", "load.max_requests=50"]
    code = f"import sys; from replay.cli import app; sys.argv = {argv!r}; app()"
    res = _run(installed, code, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "requests.parquet").is_file() and (out / "run.json").is_file()
    where = _run(installed, "import replay.engine; print(replay.engine.__file__)", tmp_path)
    assert where.returncode == 0 and str(ROOT) not in where.stdout, where.stdout + where.stderr


@pytest.mark.parametrize("name", ["engine", "ingest", "reports"])
def test_no_generic_top_level_name_is_importable(installed: Path, tmp_path: Path, name: str) -> None:
    res = _run(installed, f"import importlib.util; print(importlib.util.find_spec({name!r}))", tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "None", f"`import {name}` finds {res.stdout.strip()}"

"""The compiled engine core (setup.py, mypyc) gives the same bytes as the Python source it is built from.

The rest of the suite runs the engine from source (tests/conftest.py). Here, `replay run` runs in
subprocesses twice per workload, compiled and from source, and the Parquet outputs must be equal
byte for byte; then the engine's behaviour tests run once more against the compiled core.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replay.engine import native
from replay.engine.timing.aic import aic_available
from tests.cli_helpers import ROOT, SAMPLE

pytestmark = pytest.mark.slow  # minutes: `pytest -m slow` (.ci/run runs it)

MANIFEST = native._MANIFEST  # beside the installed engine package's compiled modules (setup.py)
AZURE_SAMPLE = ROOT / "sample_traces" / "azure_code.csv"
OUTPUTS = ("requests.parquet", "steps.parquet", "chunks.parquet")

# (name, trace, --set overrides): each feature the compiled modules implement.
WORKLOADS = [
    ("default", SAMPLE, []),
    ("azure-no-prefix-ids", AZURE_SAMPLE, ["load.max_requests=1500"]),
    ("small-pool-preemption", SAMPLE, ["kv_cache.num_gpu_blocks=2500", "load.speedup=4"]),
    ("mtp", SAMPLE, ["speculative.num_speculative_tokens=2", "speculative.acceptance_rates=[0.8,0.5]",
                     "speculative.drafter=synthetic", "kv_cache.num_gpu_blocks=6000"]),
    ("g2-offload", SAMPLE, ["kv_cache.num_gpu_blocks=3000", "host_offload.num_cpu_blocks=20000",
                            "load.speedup=3"]),
    ("fleet-kv-aware", SAMPLE, ["fleet.replicas=3", "fleet.router=kv_aware", "load.speedup=3"]),
    # G2 evicting into an on-evict disk tier that evicts in turn, and a write-through cluster pool
    ("kv-tiers", SAMPLE, ["fleet.replicas=3", "kv_cache.num_gpu_blocks=3000", "host_offload.num_cpu_blocks=1500",
                          "load.speedup=3", "kv_cache.tiers=[{name: ssd, medium: disk, store: on_evict, "
                          "num_blocks: 3000, read_gb_per_s: 6, write_gb_per_s: 3}, {name: pool, medium: remote, "
                          "scope: cluster, num_blocks: 40000, read_gb_per_s: 25, write_gb_per_s: 25}]"]),
    ("closed-loop", SAMPLE, ["load.mode=concurrency", "load.concurrency=24"]),
    ("priority-0.11", SAMPLE, ["scheduler.policy=priority", "semantics=0.11", "kv_cache.num_gpu_blocks=3000"]),
    ("aic-timing", SAMPLE, ["timing.backend=aic", "load.max_requests=400"]),  # aic_decode's window timing
]

_RUN = ("import sys, atexit; import replay.engine.native as n; "
        "atexit.register(lambda: print('ENGINE_CORE', n.core_kind(), file=sys.stderr)); "
        "from replay.cli import app; app()")


def _manifest() -> dict | None:
    try:
        return json.loads(MANIFEST.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def _require_compiled() -> None:
    manifest = _manifest()
    if manifest is None or not manifest.get("compiled"):
        if os.environ.get("CI", "").lower() in ("true", "1") and _compiler() is not None:
            pytest.fail("a C compiler is available in CI but no compiled engine core is installed")
        pytest.skip(f"pure-Python install (no {MANIFEST.name} beside the engine package)")
    digests = manifest["modules"]
    stale = [name for name, digest in digests.items()
             if hashlib.sha256(native._source(name).read_bytes()).hexdigest() != digest]
    if stale:
        pytest.skip(f"sources edited since the build ({', '.join(stale)}): reinstall to recompile")


def _env(compiled: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["REPLAY_PURE_PYTHON"] = "" if compiled else "1"
    return env


def test_every_native_module_names_a_source_file() -> None:
    """setup.py compiles engine/native.py's NATIVE_MODULES (it reads the list from there): each entry
    must name a module of the engine, or the build would fail or skip it."""
    for name in native.NATIVE_MODULES:
        assert name.startswith("replay.engine."), name
        assert native._source(name).is_file(), name


def test_suite_runs_from_source() -> None:
    import replay.engine.scheduler as scheduler

    assert native.core_kind() == "python"
    assert scheduler.__file__.endswith(".py")


def test_edited_source_is_never_shadowed_by_its_stale_build(tmp_path: Path) -> None:
    """A module whose source changed since the build is imported from source (all of them are)."""
    _require_compiled()
    import replay
    import replay.ingest
    import replay.reports

    # a copy of the installed package, laid out as installed, compiled modules and manifest included
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(replay.__file__).parent, tmp_path / "replay", ignore=ignore, dirs_exist_ok=True)
    for sub in (replay.engine, replay.ingest, replay.reports):
        name = sub.__name__.split(".")[-1]
        shutil.copytree(Path(sub.__file__).parent, tmp_path / "replay" / name, ignore=ignore, dirs_exist_ok=True)
    pkg = tmp_path / "replay" / "engine"
    (pkg / "block_pool.py").write_text((pkg / "block_pool.py").read_text() + "\nEDITED = True\n")
    code = ("import replay.engine.native as n, replay.engine.block_pool as b, replay.engine.scheduler as s; "
            "print(n.core_kind(), b.EDITED, s.__file__.endswith('.py'), n.stale_build())")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), REPLAY_PURE_PYTHON="")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["python", "True", "True", "True"]  # and the summary says so


@pytest.mark.parametrize("name,trace,sets", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_compiled_core_gives_the_same_bytes(tmp_path: Path, name: str, trace: Path, sets: list[str]) -> None:
    _require_compiled()
    if "timing.backend=aic" in sets and not aic_available():
        pytest.skip("aiconfigurator-core is not installed")
    digests = {}
    for compiled in (True, False):
        out = tmp_path / ("compiled" if compiled else "source")
        cmd = [sys.executable, "-c", _RUN, "run", str(trace), "-o", str(out), "-q"]
        for s in sets:
            cmd += ["--set", s]
        res = subprocess.run(cmd, cwd=tmp_path, env=_env(compiled), capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"ENGINE_CORE {'compiled' if compiled else 'python'}" in res.stderr
        digests[compiled] = {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in OUTPUTS}
        assert json.loads((out / "run.json").read_text())["engine_core"] == ("compiled" if compiled else "python")
    assert digests[True] == digests[False]


def test_engine_behaviour_tests_pass_on_the_compiled_core() -> None:
    """The hand-checked scenarios, fast-forward equivalence and fleet tests, against compiled code."""
    _require_compiled()
    files = ["tests/engine/test_scenarios.py", "tests/engine/test_fast_forward.py",
             "tests/engine/test_mtp_offload.py", "tests/engine/test_fleet.py", "tests/engine/test_cpu_store.py",
             "tests/engine/test_kv_tiers.py"]
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files],
                         cwd=ROOT, env=_env(True), capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]

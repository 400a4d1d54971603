"""Kill tests: SIGKILL or SIGTERM at a random point of run, ingest and report. The previous output
stays whole (or is replaced by the complete new one: same inputs give the same bytes), a SIGTERM
leaves no temp file, and after a SIGKILL the next run of the command removes what it left."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import ROOT, SAMPLE

pytestmark = pytest.mark.slow  # minutes: `pytest -m slow` (.ci/run runs it)

_SEED = int(os.environ.get("REPLAY_KILL_SEED", "20261130"))


def _cli(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "replay.cli", *args], cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(args: list[str], cwd: Path) -> float:
    start = time.monotonic()
    proc = _cli(args, cwd)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return time.monotonic() - start


def _snapshot(path: Path) -> dict[str, bytes]:
    """Bytes of an output (file or directory), wall-clock fields masked: they differ run to run."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    out = {}
    for f in files:
        data = f.read_bytes()
        if f.name == "run.json":
            info = json.loads(data)
            info.pop("wall_time_s", None)
            data = json.dumps(info, sort_keys=True).encode()
        elif f.suffix == ".md":
            data = b"\n".join(line for line in data.splitlines() if b"wall time" not in line)
        out[str(f.relative_to(path.parent))] = data
    return out


_TEMP = re.compile(r"\.replay-(old-)?\d+-")  # replay.base.atomic's temp names carry the writer's pid


def _temps(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob("*") if _TEMP.search(p.name))


# name -> (command writing the output, the output path, commands that make its inputs)
COMMANDS = {
    "ingest": (["ingest", "syn.jsonl", "-o", "syn.parquet"], "syn.parquet",
               [["synth", "-o", "syn.jsonl", "--requests", "4000", "--seed", "1"]]),
    "run": (["run", str(SAMPLE), "-o", "out", "-q", "--set", "load.max_requests=400"], "out", []),
    "report": (["report", "out", "-o", "r.md"], "r_files",
               [["run", str(SAMPLE), "-o", "out", "-q", "--set", "load.max_requests=400"]]),
}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_kill_at_a_random_point_keeps_the_old_output(tmp_path, name, sig):
    args, output, setup = COMMANDS[name]
    for step in setup:
        _finish(step, tmp_path)
    duration = _finish(args, tmp_path)  # the previous, good output
    outputs = [tmp_path / output] + ([tmp_path / "r.md"] if name == "report" else [])
    before = [_snapshot(p) for p in outputs]
    delay = random.Random(f"{_SEED}-{name}-{int(sig)}").uniform(0.05, 1.0) * duration
    proc = _cli(args, tmp_path)
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.communicate(timeout=120)
    assert [_snapshot(p) for p in outputs] == before, f"output changed after {sig.name} at {delay:.2f} s"
    if sig == signal.SIGTERM:
        # 143: our handler ran; -15: the signal came during interpreter start-up, before the handler
        # existed and before anything was written; 0: the command had finished
        assert proc.returncode in (0, 143, -signal.SIGTERM)
        assert _temps(tmp_path) == []  # SIGTERM: cleaned up on the way out
    _finish(args, tmp_path)  # the next run: sweeps what a SIGKILL left, output whole again
    assert _temps(tmp_path) == []
    assert [_snapshot(p) for p in outputs] == before

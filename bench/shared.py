"""Where the shared real traces are ($REPLAY_SHARED, else a `shared` folder beside the checkout), and
how a benchmark measures one command as a process.

A leaf (standard library only), so every benchmark, the vLLM venv's parity driver included, finds
the traces the same way.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The shared traces folder: $REPLAY_SHARED, else a `shared` folder beside the repository checkout."""
    return Path(os.environ.get("REPLAY_SHARED", REPO_ROOT.parent / "shared"))


def measure_process(cmd: list[str], cwd: Path = REPO_ROOT) -> dict:
    """Wall time and peak RSS of one command, run as a child of this (small) process.

    Peak is ``ru_maxrss`` of the child from ``wait4``: the command's own high-water mark, as long as
    the parent stays small (on Linux a child inherits its parent's high-water RSS across fork + exec).
    A failing command stops the benchmark with the end of its stderr.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd)
    err = proc.stderr.read() if proc.stderr is not None else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({code}):\n{err[-2000:]}")
    return {"wall_s": round(wall, 1), "peak_mb": round(usage.ru_maxrss / 1024.0)}

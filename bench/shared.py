"""Where the shared real traces are ($REPLAY_SHARED, else a `shared` folder beside the checkout), and
how a benchmark measures one command as a process.

A leaf (standard library only), so every benchmark, the vLLM venv's parity driver included, finds
the traces the same way.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The shared traces folder: $REPLAY_SHARED, else a `shared` folder beside the repository checkout."""
    return Path(os.environ.get("REPLAY_SHARED", REPO_ROOT.parent / "shared"))


def measure_process(cmd: list[str], cwd: Path = REPO_ROOT) -> dict:
    """Wall time and peak memory of one command, run as a child of this (small) process.

    ``peak_mb`` is ``ru_maxrss`` from ``wait4``: the high-water mark of the largest process of the
    command (it or one of its children), as long as the parent stays small (on Linux a child inherits
    its parent's high-water RSS across fork + exec). ``tree_pss_mb`` (Linux): the largest sum of
    proportional set sizes over the command's processes, sampled every half second, for a command
    that forks workers (pages the fork shares are counted once). A failing command stops the
    benchmark with the end of its stderr.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd)
    peak_pss = [0]
    done = threading.Event()
    sampler = threading.Thread(target=_sample_tree_pss, args=(proc.pid, done, peak_pss), daemon=True)
    sampler.start()
    err = proc.stderr.read() if proc.stderr is not None else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({code}):\n{err[-2000:]}")
    out = {"wall_s": round(wall, 1), "peak_mb": round(usage.ru_maxrss / 1024.0)}
    if peak_pss[0]:
        out["tree_pss_mb"] = round(peak_pss[0] / 1024.0)
    return out


def _sample_tree_pss(root: int, done: threading.Event, peak_kb: list[int]) -> None:
    """Every half second until ``done``: the PSS summed over ``root`` and its descendants (KiB)."""
    while not done.wait(0.5):
        try:
            children: dict[int, list[int]] = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                    children.setdefault(ppid, []).append(int(entry))
            total, todo = 0, [root]
            while todo:
                pid = todo.pop()
                todo += children.get(pid, [])
                with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                    total += next(int(line.split()[1]) for line in f if line.startswith(b"Pss:"))
            peak_kb[0] = max(peak_kb[0], total)
        except (OSError, StopIteration, ValueError):  # no /proc, or a process ended while read
            continue

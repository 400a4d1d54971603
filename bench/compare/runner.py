"""Run one simulator as a whole process and measure what a user waits for: wall time and peak memory.

Peak memory is polled from /proc over the process and all its descendants (AISimulate may work in
child processes):
- ``peak_rss_tree_mib``, the figure reported: the larger of the polled tree RSS sum and the polled
  sum of each process's ``VmHWM`` (its own peak RSS since exec, so a peak between two polls is not
  missed; exact for a single process, an upper bound for several);
- ``max_rss_mib``: ``ru_maxrss`` from ``wait4``, kept for the record but NOT used. On Linux a child
  started by fork/vfork + exec inherits the *parent's* high-water RSS into ``ru_maxrss``
  (``exec_mmap`` folds the old mm's hiwater into ``signal->maxrss``), so after the harness itself has
  grown (reading a 100k-request result) every later child reported the harness's peak: a ``true``
  started from a 627 MiB Python process reports ``ru_maxrss`` 627 MiB.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.05  # RSS sampling interval: cheap, and short next to any run we time


@dataclass
class ProcessResult:
    command: list[str]
    returncode: int
    wall_s: float
    peak_rss_tree_mib: float
    max_rss_mib: float
    stdout_path: str
    stderr_path: str
    timed_out: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def _hwm_bytes(pid: int) -> int:
    """``VmHWM`` of one process from /proc (0 when it is gone or the field is absent)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _tree_memory(proc: psutil.Process) -> tuple[int, int]:
    """(sum of current RSS, sum of VmHWM) over ``proc`` and its descendants, in bytes."""
    rss = hwm = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    for p in procs:
        try:
            rss += p.memory_info().rss
        except psutil.Error:
            continue
        hwm += _hwm_bytes(p.pid)
    return rss, hwm


def run_measured(command: list[str], *, log_dir: Path, name: str, timeout_s: float,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> ProcessResult:
    """Start ``command``, poll its RSS until it exits, reap it with wait4; stdout/stderr go to files."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{name}.stdout", log_dir / f"{name}.stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=cwd)
        try:
            ps: psutil.Process | None = psutil.Process(proc.pid)
        except psutil.Error:
            ps = None
        peak, peak_hwm, timed_out = 0, 0, False
        while True:
            # wait4 instead of Popen.wait: it also returns the child's resource usage (ru_maxrss).
            done, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if done:
                break
            if ps is not None:
                rss, hwm = _tree_memory(ps)
                peak, peak_hwm = max(peak, rss), max(peak_hwm, hwm)
            if time.perf_counter() - start > timeout_s:
                timed_out = True
                _kill_tree(ps, proc.pid)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(POLL_S)
        wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code  # reaped by wait4 above; keep Popen from waiting again
    max_rss = usage.ru_maxrss / 1024.0  # Linux reports KiB; includes the harness's own peak (module doc)
    return ProcessResult(command, code, wall, max(peak, peak_hwm) / 2**20, max_rss, str(out_path), str(err_path),
                         timed_out)


def _kill_tree(ps: psutil.Process | None, pid: int) -> None:
    """Stop a run that overran its timeout: its own descendants first, then it (by pid, never by name)."""
    victims = []
    if ps is not None:
        try:
            victims = ps.children(recursive=True)
        except psutil.Error:
            victims = []
    for p in victims:
        try:
            p.kill()
        except psutil.Error:
            pass
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def aisimulate_exe() -> Path | None:
    """AISimulate lives in its own venv beside the project (docs/fidelity.md), never as a dependency."""
    env = os.environ.get("AISIMULATE")
    candidates = [Path(env)] if env else []
    candidates.append(Path.home() / "aisim" / "bin" / "aisimulate")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


AISIMULATE_INSTALL_HINT = (
    "AISimulate not found (looked at $AISIMULATE and ~/aisim/bin/aisimulate). Install it beside the project:\n"
    '  python3 -m venv ~/aisim && ~/aisim/bin/pip install --no-deps "aisimulate==0.13.0.dev202610270000000085" \\\n'
    "    && ~/aisim/bin/pip install numpy pandas pyarrow pydantic pyyaml scipy ijson psutil prettytable "
    "packaging tqdm jinja2 munch"
)


def replay_command() -> tuple[list[str], dict[str, str]]:
    """How to start our CLI: the installed ``replay`` script, else this checkout mounted
    (bench/checkout_mount.py) in the current interpreter."""
    env = dict(os.environ)
    exe = shutil.which("replay")
    if exe:
        return [exe], env
    return [sys.executable, str(REPO_ROOT / "bench" / "checkout_mount.py"), str(REPO_ROOT)], env

"""Run one simulator as a whole process and measure what a user waits for: wall time and peak memory.

Peak memory is taken two ways, because AISimulate may work in child processes:
- ``peak_rss_tree_mib``: the largest sum of RSS over the process and all its descendants, polled;
- ``max_rss_mib``: ``ru_maxrss`` from ``wait4`` (the largest single process, reaped children included).
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


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


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
        peak, timed_out = 0, False
        while True:
            # wait4 instead of Popen.wait: it also returns the child's resource usage (ru_maxrss).
            done, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if done:
                break
            if ps is not None:
                peak = max(peak, _tree_rss(ps))
            if time.perf_counter() - start > timeout_s:
                timed_out = True
                _kill_tree(ps, proc.pid)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(POLL_S)
        wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code  # reaped by wait4 above; keep Popen from waiting again
    max_rss = usage.ru_maxrss / 1024.0  # Linux reports KiB
    return ProcessResult(command, code, wall, max(peak / 2**20, max_rss), max_rss, str(out_path), str(err_path),
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
    """AISimulate lives in its own venv beside the project (spec/peer-aisimulate.md), never as a dependency."""
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
    """How to start our CLI: the installed ``replay`` script, else this checkout's ``replay.cli``."""
    env = dict(os.environ)
    exe = shutil.which("replay")
    if exe:
        return [exe], env
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return [sys.executable, "-c", "import sys; from replay.cli import app; sys.argv[0] = 'replay'; app()"], env

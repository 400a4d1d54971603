"""One side-by-side comparison: translate, run both simulators as whole processes, measure, compare.

Each side is run as a user would run it (a fresh process, start-up included). The result is one
JSON-able dict; report.py renders it. A side that cannot run is recorded with the reason, never
silently skipped, and a side not run this time can be carried over from an earlier result of the
same comparison (same trace and configs) so the peer needs to be run only once.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.compare import metrics as metrics_mod
from bench.compare.runner import (
    AISIMULATE_INSTALL_HINT,
    REPO_ROOT,
    aisimulate_exe,
    replay_command,
    run_measured,
)
from bench.compare.traces import prepare
from bench.compare.translate import PeerTraffic, translate
from replay.engine.config import load_config

# Agreement targets: reuse within 0.01 absolute; mean TTFT and mean ITL within 10%
# with `timing: aic`, within 20% with the default roofline.
REUSE_ABS_TOL = 0.01
LATENCY_REL_TOL = {"aic": 0.10, "roofline": 0.20}


@dataclass
class Job:
    name: str
    trace: Path
    config: Path
    workdir: Path
    description: str = ""
    sessions: str = "refuse"
    timeout_s: float = 1800.0
    trace_notes: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)  # KEY=VALUE on our config, as `replay run --set`


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def versions() -> dict[str, str | None]:
    from replay.base.version import __version__

    commit = None
    try:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    peer = None
    exe = aisimulate_exe()
    if exe is not None:
        dists = sorted(exe.parent.parent.glob("lib/python*/site-packages/aisimulate-*.dist-info"))
        if dists:
            peer = dists[-1].name.removeprefix("aisimulate-").removesuffix(".dist-info")
    return {"replay": __version__, "replay_commit": commit, "aisimulate": peer}


def _tail(path: str, chars: int = 1500) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def ours_available() -> tuple[bool, str]:
    """Can `replay run` be started here (the command, with the engine importable)?"""
    cmd, env = replay_command()
    proc = subprocess.run([*cmd, "run", "--help"], capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()
        return False, f"`replay run` is not available in this checkout ({lines[-1].strip()})"
    return True, ""


def run_ours(job: Job, trace: Path) -> dict[str, Any]:
    ok, why = ours_available()
    if not ok:
        return {"status": "unavailable", "reason": why}
    outdir = job.workdir / "ours"
    if outdir.exists():
        shutil.rmtree(outdir)
    cmd, env = replay_command()
    # -q: no progress bar or summary table; output goes to a log file, as in any scripted run.
    sets = [arg for kv in job.overrides for arg in ("--set", kv)]
    command = [*cmd, "run", str(trace), "-c", str(job.config), "-o", str(outdir), "-q", *sets]
    proc = run_measured(command, log_dir=job.workdir / "logs", name="ours", timeout_s=job.timeout_s, env=env,
                        cwd=REPO_ROOT)
    shown = " ".join(["replay", "run", str(trace), "-c", _rel_to_repo(job.config), "-o", str(outdir), "-q",
                      *(shlex.quote(arg) for arg in sets)])
    side: dict[str, Any] = {"command": shown, "process": proc.to_dict()}
    if proc.timed_out or proc.returncode != 0:
        side.update(status="failed", reason=f"exit {proc.returncode}" + (" (timeout)" if proc.timed_out else ""),
                    stderr_tail=_tail(proc.stderr_path))
        return side
    side.update(status="ok", metrics=metrics_mod.ours_metrics(outdir))
    return side


def run_peer(job: Job, peer_cfg: dict[str, Any], speculative: bool) -> dict[str, Any]:
    exe = aisimulate_exe()
    if exe is None:
        return {"status": "unavailable", "reason": AISIMULATE_INSTALL_HINT}
    outdir = job.workdir / "peer"
    cfg_path = job.workdir / "peer.yaml"
    cfg_path.write_text(yaml.safe_dump(peer_cfg, sort_keys=False), encoding="utf-8")
    command = [str(exe), "predict", "-c", str(cfg_path), "--output-dir", str(outdir), "--overwrite",
               "--capture-per-request", "--format", "json"]
    proc = run_measured(command, log_dir=job.workdir / "logs", name="peer", timeout_s=job.timeout_s)
    side: dict[str, Any] = {"command": " ".join(command), "process": proc.to_dict()}
    if proc.timed_out or proc.returncode != 0:
        side.update(status="failed", reason=f"exit {proc.returncode}" + (" (timeout)" if proc.timed_out else ""),
                    stderr_tail=_tail(proc.stderr_path) or _tail(proc.stdout_path))
        return side
    side.update(status="ok", metrics=metrics_mod.peer_metrics(outdir, speculative=speculative))
    return side


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return (a - b) / abs(b)


def agreement(ours: dict[str, Any] | None, peer: dict[str, Any] | None, backend: str) -> list[dict[str, Any]]:
    """The agreement checks (reuse, TTFT, ITL), each with its target and verdict (None when a side is missing)."""
    tol = LATENCY_REL_TOL[backend]
    checks = [
        ("reuse_ratio", "abs", REUSE_ABS_TOL),
        ("ttft_mean_ms", "rel", tol),
        ("itl_pooled_token_ms", "rel", tol),
    ]
    out = []
    for key, kind, limit in checks:
        a = ours.get(key) if ours else None
        b = peer.get(key) if peer else None
        if a is None or b is None:
            diff = None
        else:
            diff = a - b if kind == "abs" else _rel(a, b)
        out.append({"metric": key, "kind": kind, "limit": limit, "ours": a, "peer": b, "diff": diff,
                    "ok": None if diff is None else abs(diff) <= limit})
    return out


def compare(job: Job, *, sides: str = "both", previous: dict[str, Any] | None = None,
            reps: int = 1) -> dict[str, Any]:
    """Run the comparison; ``sides`` is both|ours|peer, the other side carried from ``previous``.

    ``reps`` > 1 runs both sides that many times, alternating which goes first (peer, ours, ours,
    peer, ...), so the machine's drift hits both alike: the speed is then the ratio of the median
    walls, with every run's wall and every pair's ratio recorded. Metrics are the last run's (each
    run of a side gives the same outputs)."""
    cfg = load_config(job.config, job.overrides)
    prepared = prepare(job.trace, job.workdir, max_requests=cfg.load.max_requests, sessions=job.sessions)
    tr = translate(cfg, PeerTraffic(path=str(prepared.peer_path.resolve()), block_size=prepared.peer_block_size))
    speculative = cfg.speculative is not None

    result: dict[str, Any] = {
        "name": job.name,
        "description": job.description,
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "versions": versions(),
        "trace": {"input": str(job.trace), "ours": str(prepared.ours_path), "peer": str(prepared.peer_path),
                  "peer_block_size": prepared.peer_block_size, "rows": prepared.rows,
                  "notes": job.trace_notes + prepared.notes},
        "config": {"path": _rel_to_repo(job.config), "overrides": job.overrides, "ours": cfg.model_dump(mode="json")},
        "peer_config": tr.peer,
        "translation_notes": tr.notes,
        "timing_backend": cfg.timing.backend,
    }
    same = previous is not None and previous.get("peer_config") == tr.peer and \
        previous.get("config", {}).get("ours") == result["config"]["ours"]
    runners = (("peer", lambda: run_peer(job, tr.peer, speculative)),
               ("ours", lambda: run_ours(job, prepared.ours_path)))
    walls: dict[str, list[float]] = {"peer": [], "ours": []}
    for rep in range(reps if sides == "both" else 1):
        for side, runner in (runners if rep % 2 == 0 else runners[::-1]):
            if sides in ("both", side):
                if rep and result[side].get("status") != "ok":
                    continue  # a side that failed is not run again
                result[side] = runner()
                if result[side].get("status") == "ok":
                    walls[side].append(result[side]["process"]["wall_s"])
            elif same and previous.get(side, {}).get("status") == "ok":
                result[side] = {**previous[side], "carried_from": previous.get("date_utc")}
            else:
                result[side] = {"status": "not_run", "reason": f"--side {sides}"}

    ours_m = result["ours"].get("metrics") if result["ours"].get("status") == "ok" else None
    peer_m = result["peer"].get("metrics") if result["peer"].get("status") == "ok" else None
    speed: dict[str, Any] = {}
    if ours_m is not None and peer_m is not None:
        ow, pw = result["ours"]["process"]["wall_s"], result["peer"]["process"]["wall_s"]
        if len(walls["ours"]) > 1 and len(walls["ours"]) == len(walls["peer"]):
            ow, pw = statistics.median(walls["ours"]), statistics.median(walls["peer"])
            for side in ("ours", "peer"):  # the medians are what the tables show
                result[side]["process"] = {**result[side]["process"], "wall_s": statistics.median(walls[side]),
                                           "wall_s_runs": walls[side]}
        speed = {"ours_over_peer_wall": ow / pw, "peer_over_ours_wall": pw / ow, "ours_not_slower": ow <= pw}
        if len(walls["ours"]) > 1 and len(walls["ours"]) == len(walls["peer"]):
            speed["reps"] = len(walls["ours"])
            speed["pair_ratios"] = [o / p for o, p in zip(walls["ours"], walls["peer"], strict=True)]
    result["speed"] = speed
    result["agreement"] = agreement(ours_m, peer_m, cfg.timing.backend)
    return result


def _rel_to_repo(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)

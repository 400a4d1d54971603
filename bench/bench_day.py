"""A day of traffic: one million requests on an autoscaled 4-32 replica fleet, end to end.

    python bench/bench_day.py day                         # synth the day (once), replay it autoscaled
    python bench/bench_day.py compare --window 12:00-15:00   # a slice: autoscaled vs static at max
    python bench/bench_day.py day --requests 200000       # a quicker, lighter day
    python bench/bench_day.py compare --requests 20000 --window 13:00-13:10 --results /tmp/x   # a smoke run

The trace is `replay synth`'s day (a cosine with peak-to-trough 4 peaking at 14:00, three bursts of
twice the rate for 15 minutes, requests / 86,400 per second on average to 3 decimals: 11.574 for a
million), written once to
$TMPDIR/replay-day/. Each replay is its own `replay run` process; wall time and peak RSS are per
process (``wait4`` rusage). `compare` replays one window of the day with the autoscaled config and
with a static fleet of the config's max_replicas, and reports GPU-hours and SLO attainment side by side (the same
figures `replay diff` prints). Results go to bench/results/day-*.json and are printed as markdown;
bench/README.md ("A day of traffic") quotes them with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "bench" / "configs" / "day-autoscale.yaml"
RESULTS = ROOT / "bench" / "results"
SLO = {"ttft": 2000.0, "tpot": 50.0}
WINDOW_S = 300.0
GOAL = 0.95


def _replay(*args: str) -> list[str]:
    return [sys.executable, "-c", "from replay.cli import main; main()", *args]


def _timed(cmd: list[str]) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of one process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, rusage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return time.perf_counter() - t0, rusage.ru_maxrss / 1024


def day_trace(requests: int) -> Path:
    path = Path(tempfile.gettempdir()) / "replay-day" / f"day-{requests}.parquet"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        rate = requests / 86_400.0
        wall, rss = _timed(_replay("synth", "-o", str(path), "-n", str(requests), "--seed", "0", "--rate", f"{rate:.3f}",
                                   "--peak-to-trough", "4", "--peak-hour", "14", "--bursts", "3",
                                   "--burst-factor", "2", "--burst-minutes", "15"))
        print(f"synth {requests:,} requests: {wall:.1f} s, peak {rss:.0f} MiB")
    return path


def attainment(outdir: Path) -> dict:
    """SLO attainment as the report computes it (reports/over_time.py)."""
    from replay.reports.metrics import compute
    from replay.reports.slo import Slo
    from replay.reports.views import open_run

    run = open_run(outdir)
    try:
        o = compute(run, Slo(ttft=SLO["ttft"], tpot=SLO["tpot"], window_s=WINDOW_S, goal=GOAL)).over_time
    finally:
        run.con.close()
    return {"attainment": o["attainment"], "windows_met_fraction": o["windows_met_fraction"],
            "windows": len(o["windows"])}


def max_replicas() -> int:
    """The static leg's size: the autoscaled config's max_replicas."""
    import yaml

    return int(yaml.safe_load(CONFIG.read_text())["fleet"]["autoscale"]["max_replicas"])


def replay(trace: Path, outdir: Path, sets: list[str]) -> dict:
    cmd = _replay("run", str(trace), "-c", str(CONFIG), "-o", str(outdir), "-q")
    for s in sets:
        cmd += ["--set", s]
    wall, rss = _timed(cmd)
    info = json.loads((outdir / "run.json").read_text())
    scaling = info.get("scaling") or {}
    return {"wall_s": round(wall, 1), "peak_rss_mib": round(rss), "requests": info["totals"]["requests"],
            "finished": info["totals"]["finished"], "steps": info["totals"]["steps"],
            "engine_core": info["engine_core"], "gpu_hours": round(info["cost"]["gpu_hours"], 2),
            "cost": round(info["cost"]["cost"], 2), "mean_replicas": round(info["cost"]["mean_replicas"], 2),
            "live_min_max": [scaling.get("min_live"), scaling.get("max_live")], **attainment(outdir)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["day", "compare"])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--window", default="12:00-15:00", help="compare: the slice of the day replayed")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the JSON result goes")
    args = ap.parse_args()
    trace = day_trace(args.requests)
    args.results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="replay-day-") as tmp:
        base = args.keep or Path(tmp)
        if args.what == "day":
            result = {"autoscaled": replay(trace, base / "auto", [])}
        else:
            window = [f"load.window={args.window}"]
            result = {"window": args.window,
                      "autoscaled": replay(trace, base / "auto", window),
                      "static_at_max": replay(trace, base / "static", window + [
                          "fleet.autoscale=null", f"fleet.replicas={max_replicas()}"])}
    out = args.results / f"day-{args.what}-{args.requests}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    rows = [(k, v) for k, v in result.items() if isinstance(v, dict)]
    keys = list(rows[0][1])
    print("| | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, r in rows:
        print(f"| {name} | " + " | ".join(str(r[k]) for k in keys) + " |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

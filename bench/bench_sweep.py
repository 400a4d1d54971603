"""Sweep benchmark: what a sweep costs beyond its runs, and a 32-config sweep against single runs.

    python bench/bench_sweep.py                         # 32 configs of the Mooncake trace (minutes)
    python bench/bench_sweep.py --max-requests 3000     # the first 3,000 Mooncake requests
    python bench/bench_sweep.py --quick                 # 4 configs of the bundled sample (smoke test)

Phases, one after the other in this process, so the ratios compare like with like:
1. single runs: every config as its own whole `replay run -q` process (what a user scripting the
   sweep by hand would pay), wall time each;
2. the sweep: `replay sweep` of the same 32 configs as one process on the local pool (all cores);
3. per-config overhead parts: spawning a pool worker (import of the engine), the worker's trace load,
   and the summary (result gathering) of one run, each timed on its own.

Reported: sweep wall / (sum of single-run walls / workers) -- the target is <= 1.2 -- and
the same ratio in CPU seconds (sweep process plus its pool workers against the single processes),
which other processes on the cores do not skew; and the overhead per config = summary + (worker
start + trace load) x workers / configs. The load average is printed before and after: on a shared
machine read the wall ratio with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.shared import shared_dir  # noqa: E402

SHARED = shared_dir()
MOONCAKE = SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"
BASE = ROOT / "bench" / "compare" / "configs" / "mooncake-0.25x.yaml"
# 4 x 4 x 2 = 32 configs, all valid on the Mooncake trace (no request exceeds the smallest cache)
GRID = ["scheduler.max_num_batched_tokens=2048,4096,8192,16384", "scheduler.max_num_seqs=32,64,128,256",
        "kv_cache.num_gpu_blocks=30001,55001"]
QUICK_GRID = ["scheduler.max_num_seqs=16,256", "kv_cache.num_gpu_blocks=3000,20000"]


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # includes the pool workers the sweep process joined
    return ru.ru_utime + ru.ru_stime


def _replay(*args: str) -> tuple[float, float]:
    """(wall, CPU seconds) of one whole `replay` process, its pool workers included."""
    t0, c0 = time.perf_counter(), _cpu()
    subprocess.run([sys.executable, "-m", "replay.cli", *args], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, _cpu() - c0


def _points(grid: list[str]) -> list[list[str]]:
    from replay.sweep.grid import parse_axes, product

    return [[f"{k}={v.raw}" for k, v in p] for p in product(parse_axes(grid))]


def _overhead_parts(trace: Path, run_dir: Path) -> dict[str, float]:
    """Each per-config cost a sweep adds, timed alone (the median of 3)."""
    code_spawn = ("import time,sys; t=time.perf_counter(); import replay.sweep.job, replay.engine.run, replay.reports.metrics; "
                  "print(time.perf_counter()-t)")
    spawn = sorted(float(subprocess.run([sys.executable, "-c", code_spawn], capture_output=True, text=True,
                                        check=True).stdout) for _ in range(3))[1]
    from replay.ingest.schema import read_trace
    from replay.sweep.slo import parse_sweep_slo
    from replay.sweep.summary import summarize

    loads, sums = [], []
    config = json.loads((run_dir / "run.json").read_text())["config"]
    for _ in range(3):
        t0 = time.perf_counter()
        read_trace(trace)
        loads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        summarize(run_dir, config, parse_sweep_slo("ttft_p99=2000,tpot_p99=50"))
        sums.append(time.perf_counter() - t0)
    return {"import_in_new_process_s": spawn, "trace_load_s": sorted(loads)[1], "summary_s": sorted(sums)[1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 configs of the bundled sample trace")
    ap.add_argument("--max-requests", type=int, default=None, help="replay only the first N requests")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    workers = os.cpu_count() or 1
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        tmp = Path(tmp)
        source = ROOT / "sample_traces" / "mooncake_sessions.jsonl" if args.quick else MOONCAKE
        trace = tmp / "trace.parquet"
        _replay("ingest", str(source), "-o", str(trace))
        grid = QUICK_GRID if args.quick else GRID
        base = [] if args.quick else ["-c", str(BASE)]
        extra = [f"--grid=load.max_requests={args.max_requests}"] if args.max_requests else []
        limit = [f"load.max_requests={args.max_requests}"] if args.max_requests else []
        points = _points(grid)
        singles = []
        for i, point in enumerate(points):
            sets = [a for kv in point + limit for a in ("--set", kv)]
            singles.append(_replay("run", str(trace), *base, "-o", str(tmp / f"single{i}"), "-q", *sets))
            print(f"single {i + 1}/{len(points)}: {singles[-1][0]:.2f} s wall, {singles[-1][1]:.2f} s CPU",
                  file=sys.stderr)
        sweep_dir = tmp / "sweep"
        sweep_wall, sweep_cpu = _replay("sweep", str(trace), *base, *(f"--grid={g}" for g in grid), *extra,
                             "--slo", "ttft_p99=2000,tpot_p99=50", "-o", str(sweep_dir), "-q")
        in_run = [json.loads(p.read_text())["wall_time_s"] for p in (sweep_dir / "results").glob("*.json")]
        errors = [json.loads(p.read_text())["error"] for p in (sweep_dir / "results").glob("*.json")]
        run_dir = next((sweep_dir / "runs").iterdir())
        parts = _overhead_parts(trace, run_dir)
    n = len(points)
    single_wall, single_cpu = sum(w for w, _ in singles), sum(c for _, c in singles)
    per_config = parts["summary_s"] + (parts["import_in_new_process_s"] + parts["trace_load_s"]) * workers / n
    figures = {
        "configs": n, "workers": workers, "trace": str(source), "max_requests": args.max_requests,
        "failed_configs": sum(e is not None for e in errors),
        "sum_single_run_wall_s": round(single_wall, 2), "sum_single_run_cpu_s": round(single_cpu, 2),
        "sweep_wall_s": round(sweep_wall, 2), "sweep_cpu_s": round(sweep_cpu, 2),
        "ratio_wall_sweep_vs_sum_single_over_workers": round(sweep_wall / (single_wall / workers), 3),
        "ratio_cpu_sweep_vs_sum_single": round(sweep_cpu / single_cpu, 3),
        "sum_in_run_wall_s": round(sum(in_run), 2),
        **{k: round(v, 3) for k, v in parts.items()},
        "overhead_per_config_s": round(per_config, 3),
        "load_avg_before": [round(x, 2) for x in load_before], "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()

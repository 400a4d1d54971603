"""Fleet benchmark: routers side by side on the shared Mooncake trace, and a large fleet's cost.

    python bench/bench_fleet.py routers     # every router on the Mooncake trace, 8 replicas (~15 min)
    python bench/bench_fleet.py large       # 100,000 synthetic requests on 32 replicas (wall, peak RSS)
    python bench/bench_fleet.py routers --replicas 4 --max-requests 3000   # a quicker look

Each replay is its own process (`replay run ... -q`), as a user runs it; wall time and peak RSS are
per process (``wait4`` rusage). Results go to bench/results/fleet-*.json and are printed as a
markdown table (docs/fleet.md and bench/README.md quote them with this command). The speed of the
fleet against AISimulate comes from `python -m bench.compare --workload mooncake-fleet8` and
`--workload synth-100k-fleet32` (the same traces and configs, round robin on both sides).
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.shared import shared_dir  # noqa: E402

SHARED = shared_dir()
MOONCAKE = SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"
CONFIGS = ROOT / "bench" / "compare" / "configs"
RESULTS = ROOT / "bench" / "results"
ROUTERS = ["round_robin", "random", "session_affinity", "least_loaded", "kv_aware", "kv_aware_approx",
           "prefix_score"]
ROUTER_SETTINGS = {"kv_aware_approx": ["fleet.router=kv_aware", "fleet.router_options.kv_events=false"]}


# `replay run` with a fleet's replicas never replayed apart (engine/fleet_partition.py): the one event
# loop a fleet with shared tiers must use, as the baseline that measures what the tiers cost.
ONE_LOOP = ("import replay.engine.run as run; run.replica_targets = lambda *args: None; "
            "from replay.cli import main; main()")


def replay_run(trace: Path, outdir: Path, config: Path, sets: list[str], options: tuple[str, ...] = (),
               launcher: str = "from replay.cli import main; main()") -> dict:
    """One quiet `replay run` process (``options``: more of its flags, e.g. ``--workers 2``;
    ``launcher``: the Python that starts it, e.g. ``ONE_LOOP``): its wall and CPU seconds (user +
    system, its worker processes included), peak RSS and run.json."""
    cmd = [sys.executable, "-c", launcher, "run", str(trace), "-c", str(config),
           "-o", str(outdir), "-q", *options]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    # stdout is not read: a pipe nobody drains could fill and stall the child while stderr is read
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()  # small: the run is quiet
    _, status, rusage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"replay run failed: {' '.join(cmd)}\n{err[-2000:]}")
    info = json.loads((outdir / "run.json").read_text())
    return {"wall_s": round(wall, 2), "cpu_s": round(rusage.ru_utime + rusage.ru_stime, 2),
            "peak_rss_mib": round(rusage.ru_maxrss / 1024, 1), "info": info}


def _latency(outdir: Path) -> dict:
    import duckdb

    con = duckdb.connect()
    row = con.execute(f"SELECT median(ttft_ms), quantile_cont(ttft_ms, 0.99), avg(e2e_ms) FROM "
                      f"read_parquet('{outdir / 'requests.parquet'}') WHERE status = 'finished'").fetchone()
    con.close()
    return {"ttft_p50_ms": row[0], "ttft_p99_ms": row[1], "e2e_mean_ms": row[2]}


def routers(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for name in args.routers or ROUTERS:
            sets = [f"fleet.replicas={args.replicas}"] + ROUTER_SETTINGS.get(name, [f"fleet.router={name}"])
            if args.max_requests:
                sets.append(f"load.max_requests={args.max_requests}")
            out = Path(tmp) / name
            r = replay_run(MOONCAKE, out, CONFIGS / "mooncake-fleet8.yaml", sets)
            info = r["info"]
            row = {"router": name, "wall_s": r["wall_s"], "peak_rss_mib": r["peak_rss_mib"],
                   "gpu_hit_ratio": info["prefix_hit_rate"], "busy_imbalance": info["fleet"]["busy_imbalance"],
                   "steps": info["totals"]["steps"], **_latency(out)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    ideal = _trace_ideal(args.max_requests)
    result = {"what": "routers on the shared Mooncake trace", "replicas": args.replicas,
              "max_requests": args.max_requests, "config": "bench/compare/configs/mooncake-fleet8.yaml",
              "trace_ideal_hit_ratio": ideal, "rows": rows, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _save(f"fleet-routers-{args.replicas}", result)
    print("\n| router | GPU prefix hit | TTFT p50 (ms) | TTFT p99 (ms) | E2E mean (ms) | imbalance | wall (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['router']} | {r['gpu_hit_ratio']:.2%} | {r['ttft_p50_ms']:,.1f} | {r['ttft_p99_ms']:,.1f} | "
              f"{r['e2e_mean_ms']:,.1f} | {r['busy_imbalance']:.3f} | {r['wall_s']} |")
    if ideal is not None:
        print(f"\nTrace ideal (one infinite cache): {ideal:.2%}")


def _trace_ideal(max_requests: int | None) -> float | None:
    """The trace's infinite-cache hit ratio, from `replay inspect --json` (ingest/stats.py)."""
    cmd = [sys.executable, "-c", "from replay.cli import main; main()", "inspect", str(MOONCAKE), "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode or max_requests:
        return None
    return json.loads(proc.stdout).get("token_prefix_hit_infinite")


def large(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        trace = Path(tmp) / "synth.parquet"
        synth = [sys.executable, "-c", "from replay.cli import main; main()", "synth", "-n", str(args.requests),
                 "--seed", "0", "--arrival", "poisson", "--rate", "3.0", "--turns-mean", "3.0", "-o", str(trace)]
        subprocess.run(synth, cwd=ROOT, check=True, capture_output=True)
        if args.flatten:  # every turn open-loop at its timestamp, as the AISimulate comparison replays it
            import pyarrow.parquet as pq

            sys.path.insert(0, str(ROOT))
            from bench.compare.traces import flatten_sessions

            table = pq.read_table(trace)
            pq.write_table(flatten_sessions(table).replace_schema_metadata(table.schema.metadata), trace)
        sets = [f"fleet.replicas={args.replicas}", f"load.speedup={args.speedup}"]
        r = replay_run(trace, Path(tmp) / "out", CONFIGS / "synth-100k-fleet32.yaml", sets)
        info = r["info"]
        row = {"requests": args.requests, "replicas": args.replicas, "speedup": args.speedup,
               "sessions": "flattened (open loop)" if args.flatten else "closed loop (delay_ms)",
               "wall_s": r["wall_s"], "peak_rss_mib": r["peak_rss_mib"], "steps": info["totals"]["steps"],
               "chunks": info["totals"]["chunks"], "engine_wall_s": info["wall_time_s"],
               "busy_imbalance": info["fleet"]["busy_imbalance"], "gpu_hit_ratio": info["prefix_hit_rate"],
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        print(json.dumps(row), flush=True)
        _save(f"fleet-large-{args.replicas}{'-flat' if args.flatten else ''}", row)


def _save(name: str, data: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("routers")
    r.add_argument("--replicas", type=int, default=8)
    r.add_argument("--max-requests", type=int, default=None)
    r.add_argument("--routers", nargs="*")
    lg = sub.add_parser("large")
    lg.add_argument("--requests", type=int, default=100_000)
    lg.add_argument("--replicas", type=int, default=32)
    lg.add_argument("--speedup", type=float, default=10.0)
    lg.add_argument("--flatten", action="store_true", help="sessions open-loop (the AISimulate comparison's trace)")
    args = ap.parse_args()
    routers(args) if args.what == "routers" else large(args)


if __name__ == "__main__":
    main()

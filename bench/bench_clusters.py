"""A fleet of clusters replayed in one process, and in parallel (Ray workers or local processes):
wall, the speed-up, the bytes.

    python bench/bench_clusters.py [--workload reuse-fleet8-64rps] [--clusters 2] [--max-requests N]
                                   [--ray auto|ADDRESS | --workers N] [--reps 3]

Each run is `replay run ... --set fleet.clusters=K` in its own process, alternately without and
with `--ray` (a local Ray instance started by the run itself with `auto`: its start-up is counted,
as a user waits for it) or, with `--workers N`, with `replay run --workers N` (forked local
processes). The baseline is the one-process run of the same topology in the same pass; the speed-up
is its wall / the parallel wall (medians). Outputs are compared byte for byte (requests, steps,
chunks): the parallel run must write what the one-process run writes. Only walls compare (Ray's
workers are not our children, so their CPU is not counted).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_ab import CONFIGS, _trace  # noqa: E402
from bench.bench_fleet import replay_run  # noqa: E402
from bench.compare.workloads import load_workloads  # noqa: E402

OUTPUTS = ("requests.parquet", "steps.parquet", "chunks.parquet")


def _run(trace: Path, config: Path, sets: list[str], parallel: list[str], out: Path) -> tuple[float, dict[str, str], dict]:
    res = replay_run(trace, out, config, sets, tuple(parallel))
    digests = {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in OUTPUTS}
    return res["wall_s"], digests, res["info"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="reuse-fleet8-64rps", help="a fleet workload of bench/compare/workloads.yaml")
    ap.add_argument("--clusters", type=int, default=2)
    ap.add_argument("--max-requests", type=int, default=0, help="replay only the first N requests (0: all)")
    side = ap.add_mutually_exclusive_group()
    side.add_argument("--ray", default="auto", help="Ray address for the parallel side (default: a local instance)")
    side.add_argument("--workers", type=int, default=0, help="the parallel side in N local processes instead of Ray")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    wl = load_workloads().workloads[args.workload]
    config = (CONFIGS.parent / wl.config).resolve()
    trace = _trace(args.workload)
    sets = [f"fleet.clusters={args.clusters}"]
    if args.max_requests:
        sets.append(f"load.max_requests={args.max_requests}")
    parallel = ["--workers", str(args.workers)] if args.workers > 1 else ["--ray", args.ray]
    label = f"{args.workers} processes" if args.workers > 1 else f"Ray {args.ray}"
    print(f"workload {args.workload}, {' '.join(sets)}, {label}; load average {os.getloadavg()}")
    walls: dict[str, list[float]] = {"local": [], "parallel": []}
    digests: dict[str, dict[str, str]] = {}
    engine_core = ""
    with tempfile.TemporaryDirectory(prefix="replay-clusters-") as tmp:
        for rep in range(args.reps):
            for side in (("local", "parallel") if rep % 2 == 0 else ("parallel", "local")):
                out = Path(tmp) / f"{side}-{rep}"
                wall, dig, info = _run(trace, config, sets, parallel if side == "parallel" else [], out)
                walls[side].append(wall)
                digests.setdefault(side, dig)
                engine_core = info.get("engine_core", "")
                print(f"  rep {rep} {side}: {wall:.2f} s", flush=True)
    local, par = statistics.median(walls["local"]), statistics.median(walls["parallel"])
    same = digests["local"] == digests["parallel"]
    print(f"| workload | clusters | core | one process wall (s) | {label} wall (s) | speed-up | outputs |")
    print("|---|---:|---|---:|---:|---:|---|")
    print(f"| {args.workload} | {args.clusters} | {engine_core} | {local:.2f} | {par:.2f} | {local / par:.2f}x | "
          f"{'identical' if same else 'DIFFERENT'} |")
    print(f"load average {os.getloadavg()}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

"""Engine benchmark: whole-process `replay run` on the workloads that have speed and memory targets.

    python bench/bench_engine.py                    # every workload (about 2-3 minutes)
    python bench/bench_engine.py --only ref-mtp-g2  # one workload

Each replay runs as its own process (`replay run ... -q`), like a user would run it; wall time and
peak RSS (``wait4`` rusage) are per process. The baseline, measured in the same run, is a fixed
pure-Python workload of the operations the engine lives on (OrderedDict LRU churn, dict inserts
and deletes): `x baseline` says how many baseline units a replay costs, which stays comparable
across machines and load. Ratios against NVIDIA AISimulate on the same workloads come from
`python -m bench.compare` (bench/compare/, docs/fidelity.md).

Workload configs are the comparison harness's (bench/compare/configs) plus bench/configs.
Generated traces go to a temp dir; the Mooncake trace is read from $REPLAY_SHARED/traces (default: a
`shared` folder beside the repository checkout).
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

# name -> (trace kind, config path, target in seconds or None, what the target is)
WORKLOADS = {
    "sample": ("sample", None, None, "the README's bundled sample, vLLM defaults"),
    "mooncake-0.25x": ("mooncake", CONFIGS / "mooncake-0.25x.yaml", None,
                       "no slower than AISimulate's whole process"),
    "synth-100k": ("synth-100k", CONFIGS / "synth-100k.yaml", None,
                   "no slower than AISimulate; peak < 1 GB"),
    "ref-mtp": ("reference", CONFIGS / "ref-mtp.yaml", 10.0, "reference workload, MTP only"),
    "ref-g2": ("reference", CONFIGS / "ref-g2.yaml", 10.0, "reference workload, G2 only"),
    "ref-mtp-g2": ("reference", ROOT / "bench" / "configs" / "ref-mtp-g2.yaml", 10.0,
                   "reference workload, MTP + G2 together, < 10 s"),
}


def _baseline_child(n: int = 2_000_000) -> None:
    from collections import OrderedDict

    t0 = time.perf_counter()
    lru: OrderedDict[int, None] = OrderedDict.fromkeys(range(50_000))
    cache: dict[int, int] = {}
    for i in range(n):
        b, _ = lru.popitem(False)
        cache[i] = b
        if i >= 50_000:
            del cache[i - 50_000]
        lru[b] = None
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def _measure(cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out = proc.stdout.read()
    err = proc.stderr.read()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({code}):\n{err[-2000:]}")
    return {"wall_s": wall, "peak_mb": usage.ru_maxrss / 1024.0, "stdout": out}


def _trace(kind: str, work: Path) -> Path:
    if kind == "sample":
        return ROOT / "sample_traces" / "mooncake_sessions.jsonl"
    if kind == "mooncake":
        if not MOONCAKE.exists():
            raise FileNotFoundError(MOONCAKE)
        return MOONCAKE
    if kind == "synth-100k":
        path = work / "synth-100k.parquet"
        if not path.exists():
            subprocess.run([sys.executable, "-m", "replay.cli", "synth", "-n", "100000", "--seed", "0",
                            "--arrival", "poisson", "--rate", "3.0", "--turns-mean", "3.0", "-o", str(path)],
                           check=True, cwd=ROOT, capture_output=True)
        return path
    if kind == "reference":
        path = work / "reference.parquet"
        if not path.exists():
            sys.path.insert(0, str(ROOT))
            from bench.compare.traces import write_reference_trace

            write_reference_trace(path, requests=2048, input_tokens=120_000, output_tokens=64,
                                  hash_block_size=512)
        return path
    raise ValueError(kind)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="run only these workloads")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--child-baseline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_baseline:
        _baseline_child()
        return 0
    names = args.only or list(WORKLOADS)
    baseline = json.loads(_measure([sys.executable, __file__, "--child-baseline"])["stdout"])["seconds"]
    print(f"baseline (2M LRU/dict cycles in pure Python): {baseline:.3f} s")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        work = Path(tmp)
        for name in names:
            kind, config, target, what = WORKLOADS[name]
            try:
                trace = _trace(kind, work)
            except FileNotFoundError as exc:
                print(f"{name}: skipped, trace not found: {exc}")
                continue
            cmd = [sys.executable, "-m", "replay.cli", "run", str(trace), "-o", str(work / f"out-{name}"), "-q"]
            if config is not None:
                cmd += ["-c", str(config)]
            m = _measure(cmd)
            info = json.loads((work / f"out-{name}" / "run.json").read_text())
            row = {"workload": name, "what": what, "wall_s": round(m["wall_s"], 2),
                   "x_baseline": round(m["wall_s"] / baseline, 1), "peak_mb": round(m["peak_mb"]),
                   "requests": info["totals"]["requests"], "steps": info["totals"]["steps"],
                   "core_s": info["wall_time_s"], "target_s": target,
                   "meets_target": None if target is None else m["wall_s"] < target}
            results.append(row)
            print(json.dumps(row))
    print()
    print("| workload | wall s | x baseline | peak MB | requests | steps | in-engine s | target |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        tgt = "-" if r["target_s"] is None else f"< {r['target_s']:g} s: {'met' if r['meets_target'] else 'missed'}"
        print(f"| {r['workload']} | {r['wall_s']} | {r['x_baseline']} | {r['peak_mb']} | {r['requests']:,} | "
              f"{r['steps']:,} | {r['core_s']} | {tgt} |")
    if args.json:
        args.json.write_text(json.dumps({"baseline_s": baseline, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

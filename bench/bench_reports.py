"""Benchmark: `replay report` and `replay diff` on a 1,000,000-request replay output.

Builds two synthetic OUTDIRs of one trace with tests/reports_fixtures.py (no engine needed), then times
the report (metrics + markdown + charts) and the diff (both runs' metrics, paired bootstrap, charts)
against a baseline measured in the same run: reading every column of the output Parquet files
(the I/O floor). Target: report and diff each under 10 s.

    python bench/bench_reports.py                # 1M requests, ~20M chunk rows
    python bench/bench_reports.py --requests 100000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replay.reports.diff import diff_runs, write_diff  # noqa: E402
from replay.reports.report import write_report  # noqa: E402
from replay.reports.slo import Slo  # noqa: E402
from tests.reports_fixtures import RunSpec, TraceSpec, write_run, write_trace  # noqa: E402


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def read_all(outdir: Path) -> int:
    """Baseline: read every column of the three output files (what any analysis must at least do)."""
    return sum(pq.read_table(outdir / f).num_rows for f in ("requests.parquet", "chunks.parquet", "steps.parquet"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--mean-output", type=float, default=15.0, help="median output tokens (chunks per request)")
    ap.add_argument("--rate", type=float, default=100.0, help="arrival rate, requests/s (sets the step count)")
    ap.add_argument("--keep", type=Path, default=None, help="build the outputs here instead of a temp dir")
    ap.add_argument("--reuse", action="store_true", help="with --keep: reuse outputs built by an earlier run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-reports-") as tmp:
        root = args.keep or Path(tmp)
        t0 = time.perf_counter()
        trace, a, b = root / "trace.parquet", root / "a", root / "b"
        if not (args.reuse and (b / "run.json").is_file()):
            write_trace(trace, TraceSpec(n_requests=args.requests, seed=0, rate_rps=args.rate,
                                         mean_output=args.mean_output))
            write_run(a, trace, RunSpec(seed=1))
            write_run(b, trace, RunSpec(seed=2, latency_scale=1.3, config_overrides=(("scheduler.max_num_seqs", 256),)))
        gen = time.perf_counter() - t0
        runs = pq.read_table(a / "chunks.parquet", columns=["num_steps"]).column("num_steps")
        chunks = int(pa.compute.sum(runs).as_py())
        steps = pq.read_metadata(a / "steps.parquet").num_rows
        ids = pq.read_table(trace, columns=["hash_ids"]).column("hash_ids").combine_chunks().values
        print(f"built in {gen:.1f} s: {pq.read_metadata(trace).num_rows:,} requests, {chunks:,} chunks in {len(runs):,} runs, "
              f"{steps:,} steps, "
              f"{len(ids):,} trace hash ids (per run)")
        t_base, _ = _timed(lambda: read_all(a))
        t_report, _ = _timed(lambda: write_report(a, root / "out" / "report.md", slo=Slo(ttft=500, tpot=50)))
        t_diff, _ = _timed(lambda: write_diff(diff_runs(a, b, slo=Slo(ttft=500, tpot=50)), root / "out" / "diff.md"))
        print(f"baseline  read all output columns (1 run): {t_base:6.2f} s")
        print(f"report    metrics + markdown + 6 charts:   {t_report:6.2f} s  ({t_report / t_base:.1f}x baseline)"
              f"  target < 10 s: {'ok' if t_report < 10 else 'MISSED'}")
        print(f"diff      2 runs + bootstrap + 4 charts:   {t_diff:6.2f} s  ({t_diff / t_base:.1f}x baseline)"
              f"  target < 10 s: {'ok' if t_diff < 10 else 'MISSED'}")


if __name__ == "__main__":
    main()

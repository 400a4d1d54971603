"""Peak memory of every command at scale: each command in its own process, against 2 GB.

    python bench/bench_memory.py --work /tmp/bench-memory            # every case (about 50 min, 9 GB of disk)
    python bench/bench_memory.py --work /tmp/bench-memory --reuse --only report --only inspect-ids

Target: peak RSS under 2 GB (2,048 MB) at 1 M requests / 10 M trace rows. Peak is ``ru_maxrss`` of
the command's own process (``wait4``). The parent only starts processes (fixtures are built by child
processes too), so it stays far below what it measures: on Linux a child inherits its parent's
high-water RSS across fork + exec (bench/README.md, "How to read the numbers"). A command that forks
workers (`replay run` with the replicas in step) is also measured as the PSS summed over its
processes, sampled every half second (``measure_process``); the target applies to both.

Fixtures, under --work (kept, and reused with --reuse; delete the directory when done):

* ``reports/``: a 1 M-request trace and two replay outputs of it built without the engine
  (tests/reports_fixtures.py, as bench/bench_reports.py: about 19 M chunk rows), and a denser output of
  a second 1 M-request trace at 278 requests/s (about 51 M chunk rows, 50 M pooled ITL samples);
* ``reports-dense4/``: that dense output with every step cut into four quarter steps and every chunk
  run four times as long: 204 M chunks, about 200 per request, the scale of a real 1 M-request replay
  (219.7 M), still about 1 M runs (chunks.parquet stores runs, engine/output_schema.py);
* ``trace10m.parquet``: a 10 M-row canonical trace with hash ids (tests/reports_fixtures.py, about 8
  hash ids a row);
* ``azure10m.csv`` and ``azure10m_ooo.csv``: the 10 M-row Azure-style CSV of bench/bench_ingest.py, and
  the same rows with the first two moved to the end (out of time order: ingest must sort);
* none for ``synth``, which writes a 10 M-request trace (about 0.5 GB) under ``out/``;
* ``synth1m.parquet``: `replay synth` of 1 M requests (bench_engine.py's synth-100k, ten times longer),
  replayed by the two `replay run` cases (about 6 min each on this machine);
* ``reuse1m.parquet`` / ``.jsonl`` and ``reuse10m.*``: the scale shapes, reuse-heavy traffic
  (bench/compare/reuse_traffic.py, seed 10) of 1 M requests at 64 req/s and 10 M at 115 req/s (a day),
  as a canonical trace and as the Mooncake JSONL that ``scale*-ingest`` reads. ``scale*-run`` replays
  the trace on 8 (64) replicas behind ``kv_aware`` into ``out/scale*-run``, which ``scale*-report``
  reports on (built by an unmeasured run first when the run case was not measured before it).

The scale cases end to end (ingest, run, report of one size, in that order):

    python bench/bench_memory.py --work /tmp/bench-memory --reuse --only scale1m-ingest --only scale1m-run --only scale1m-report
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.shared import measure_process  # noqa: E402

TARGET_MB = 2048
RUN_CONFIG = ROOT / "bench" / "compare" / "configs" / "synth-100k.yaml"
FLEET_CONFIG = ROOT / "bench" / "compare" / "configs" / "reuse-fleet8.yaml"  # 8 H200 replicas, reuse.yaml each
# The scale shapes: reuse-heavy traffic (bench/compare/reuse_traffic.py) replayed end to end,
# (requests, requests/s, replicas). 1 M at 64 req/s on 8 replicas; a day at 115 req/s on 64.
SCALES = {"1m": (1_000_000, 64.0, 8), "10m": (10_000_000, 115.0, 64)}


def _scale_cases(size: str) -> dict:
    n, rate, replicas = SCALES[size]
    run_dir = f"scale{size}-run"
    what = f"{n // 1_000_000} M reuse-heavy requests at {rate:g} req/s"

    def run(w: Path) -> list[str]:
        return _cli("run", str(w / f"reuse{size}.parquet"), "-c", str(FLEET_CONFIG), "--set", "fleet.router=kv_aware",
                    "--set", f"fleet.replicas={replicas}", "-o", str(w / "out" / run_dir), "-q")

    return {
        f"scale{size}-ingest": (f"reuse{size}", f"replay ingest, {what} (Mooncake JSONL)",
                                lambda w: _cli("ingest", str(w / f"reuse{size}.jsonl"), "-o", str(w / "out" / f"ingested{size}.parquet"))),
        f"scale{size}-run": (f"reuse{size}", f"replay run -q, {what}, {replicas} replicas, kv_aware", run),
        f"scale{size}-report": (run_dir, "replay report of that run (charts, --json)",
                                lambda w: _cli("report", str(w / "out" / run_dir), "-o", str(w / "out" / f"{run_dir}.md"),
                                               "--json", str(w / "out" / f"{run_dir}.json"))),
    }
DENSE_RATE = 1_000_000 / 3600  # requests/s of the dense reports fixture: 1 M requests in an hour


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "replay.cli", *args]


def _export(fixture: str, fmt: str, out_name: str):
    return lambda w: _cli("export", str(w / fixture / "a"), "-f", fmt, "-o", str(w / "out" / out_name))


# name -> (fixture it needs, what it measures, command builder over the work dir)
CASES = {
    "report": ("reports", "replay report, 1 M requests, 19 M chunk rows (charts, --json)",
               lambda w: _cli("report", str(w / "reports" / "a"), "-o", str(w / "out" / "report.md"),
                              "--json", str(w / "out" / "report.json"))),
    "report-dense": ("reports-dense", "replay report, 1 M requests, 51 M chunk rows (charts, --json)",
                     lambda w: _cli("report", str(w / "reports-dense" / "a"), "-o", str(w / "out" / "dense.md"),
                                    "--json", str(w / "out" / "dense.json"))),
    "report-dense4": ("reports-dense4", "replay report, 1 M requests, 204 M chunks (about 200 a request)",
                      lambda w: _cli("report", str(w / "reports-dense4" / "a"), "-o", str(w / "out" / "dense4.md"),
                                     "--json", str(w / "out" / "dense4.json"))),
    "diff": ("reports", "replay diff of two 1 M-request runs (paired bootstrap, charts)",
             lambda w: _cli("diff", str(w / "reports" / "a"), str(w / "reports" / "b"), "-o", str(w / "out" / "diff.md"))),
    "inspect-ids": ("trace10m", "replay inspect, 10 M rows with hash ids (reuse, 3 LRU sizes)",
                    lambda w: _cli("inspect", str(w / "trace10m.parquet"))),
    "inspect-csv": ("azure10m", "replay inspect, 10 M-row Azure-style CSV",
                    lambda w: _cli("inspect", str(w / "azure10m.csv"))),
    "ingest": ("azure10m", "replay ingest, 10 M-row Azure-style CSV",
               lambda w: _cli("ingest", str(w / "azure10m.csv"), "-o", str(w / "out" / "azure10m.parquet"))),
    "ingest-ooo": ("azure10m", "replay ingest, the same rows with 2 out of time order",
                   lambda w: _cli("ingest", str(w / "azure10m_ooo.csv"), "-o", str(w / "out" / "ooo.parquet"))),
    "synth": (None, "replay synth -n 10000000 --rate 100 (Parquet, 73 M hash-id references)",
              lambda w: _cli("synth", "-n", "10000000", "--rate", "100", "-o", str(w / "out" / "synth10m.parquet"))),
    **{f"export-{short}{suffix}": (fixture, f"replay export --format {fmt}, 1 M requests, {chunks} chunk rows",
                                   _export(fixture, fmt, f"export{suffix}.{ext}"))
       for short, fmt, ext in (("vllm", "vllm-bench", "json"), ("aiperf", "aiperf", "jsonl"))
       for fixture, suffix, chunks in (("reports", "", "19 M"), ("reports-dense", "-dense", "51 M"),
                                       ("reports-dense4", "-dense4", "204 M"))},
    "run-quiet": ("synth1m", "replay run -q, 1 M requests",
                  lambda w: _cli("run", str(w / "synth1m.parquet"), "-c", str(RUN_CONFIG), "-o",
                                 str(w / "out" / "run-q"), "-q")),
    "run": ("synth1m", "replay run with progress bar and summary table, 1 M requests",
            lambda w: _cli("run", str(w / "synth1m.parquet"), "-c", str(RUN_CONFIG), "-o", str(w / "out" / "run"))),
    **_scale_cases("1m"),
    **_scale_cases("10m"),
}


def _child(kind: str, work: Path) -> None:
    """Build one fixture (in its own process, so the parent stays small)."""
    sys.path.insert(0, str(ROOT))
    if kind in ("reports", "reports-dense"):
        from tests.reports_fixtures import RunSpec, TraceSpec, write_run, write_trace

        root = work / kind
        rate = 100.0 if kind == "reports" else DENSE_RATE
        trace = write_trace(root / "trace.parquet", TraceSpec(n_requests=1_000_000, seed=0, rate_rps=rate,
                                                              mean_output=15.0 if kind == "reports" else 40.0))
        write_run(root / "a", trace, RunSpec(seed=1))
        if kind == "reports":
            write_run(root / "b", trace, RunSpec(seed=2, latency_scale=1.3,
                                                 config_overrides=(("scheduler.max_num_seqs", 256),)))
    elif kind == "reports-dense4":
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not _built("reports-dense", work):
            _child("reports-dense", work)
        src, dst = work / "reports-dense" / "a", work / "reports-dense4" / "a"
        dst.mkdir(parents=True, exist_ok=True)
        for name in ("requests.parquet", "run.json"):
            shutil.copyfile(src / name, dst / name)
        steps = pq.read_table(src / "steps.parquet")
        quarter = steps.column("duration_ms").to_numpy() / 4
        start = steps.column("start_ms").to_numpy()
        cols = {name: np.repeat(steps.column(name).to_numpy(), 4) for name in steps.schema.names}
        cols["step"] = np.arange(4 * len(start), dtype=np.int64)
        cols["start_ms"] = (start[:, None] + quarter[:, None] * np.arange(4)).ravel()
        cols["duration_ms"] = np.repeat(quarter, 4)
        pq.write_table(pa.table(cols, schema=steps.schema), dst / "steps.parquet")
        runs = pq.read_table(src / "chunks.parquet")
        runs = runs.set_column(2, "first_step", pa.array(runs.column("first_step").to_numpy() * 4))
        runs = runs.set_column(3, "num_steps", pa.array(runs.column("num_steps").to_numpy() * 4))
        tmp = dst / "chunks.parquet.part"  # renamed when complete: chunks.parquet marks the fixture built
        pq.write_table(runs, tmp)
        tmp.rename(dst / "chunks.parquet")
    elif kind == "trace10m":
        from tests.reports_fixtures import TraceSpec, write_trace

        write_trace(work / "trace10m.parquet", TraceSpec(n_requests=10_000_000, seed=0, rate_rps=100.0))
    elif kind == "azure10m":
        from replay.ingest.synth import SynthConfig, write_azure_csv

        src = work / "azure10m.csv"
        write_azure_csv(SynthConfig(requests=10_000_000, seed=0, rate=100.0, turns_mean=1), src)
        with src.open("rb") as fin, (work / "azure10m_ooo.csv").open("wb") as fout:
            header, first, second = fin.readline(), fin.readline(), fin.readline()
            fout.write(header)
            shutil.copyfileobj(fin, fout, 1 << 24)  # the file has no final newline
            fout.write(b"\r\n" + first + second.rstrip(b"\r\n"))
    elif kind == "synth1m":
        subprocess.run(_cli("synth", "-n", "1000000", "--seed", "0", "--arrival", "poisson", "--rate", "3.0",
                            "--turns-mean", "3.0", "-o", str(work / "synth1m.parquet")), check=True, cwd=ROOT)
    elif kind.startswith("reuse"):
        _reuse_trace(kind.removeprefix("reuse"), work)
    elif kind.startswith("scale"):  # a replay output the report case reads: the run case, unmeasured
        size = kind.removeprefix("scale").removesuffix("-run")
        if not _built(f"reuse{size}", work):
            _reuse_trace(size, work)
        (work / "out").mkdir(exist_ok=True)
        subprocess.run(_scale_cases(size)[f"scale{size}-run"][2](work), check=True, cwd=ROOT)
    else:
        raise SystemExit(f"unknown fixture {kind}")


def _reuse_trace(size: str, work: Path) -> None:
    """The scale shape's canonical trace and the same rows as Mooncake JSONL (what ingest reads)."""
    import duckdb

    from bench.compare.reuse_traffic import ReuseTrafficConfig, write_reuse_trace

    n, rate, _ = SCALES[size]
    trace = work / f"reuse{size}.parquet"
    write_reuse_trace(trace, ReuseTrafficConfig(requests=n, rate=rate, seed=10))
    tmp = work / f"reuse{size}.jsonl.part"  # renamed when complete: the JSONL marks the fixture built
    duckdb.sql(f"COPY (SELECT arrival_ms AS timestamp, input_tokens AS input_length, output_tokens AS output_length, "
               f"hash_ids FROM read_parquet('{trace}') ORDER BY arrival_ms) TO '{tmp}' (FORMAT JSON)")
    tmp.rename(work / f"reuse{size}.jsonl")


def _built(kind: str, work: Path) -> bool:
    marker = {"reports": work / "reports" / "b" / "run.json", "reports-dense": work / "reports-dense" / "a" / "run.json",
              "reports-dense4": work / "reports-dense4" / "a" / "chunks.parquet",
              "trace10m": work / "trace10m.parquet", "azure10m": work / "azure10m_ooo.csv",
              "synth1m": work / "synth1m.parquet",
              **{f"reuse{size}": work / f"reuse{size}.jsonl" for size in SCALES},
              **{f"scale{size}-run": work / "out" / f"scale{size}-run" / "run.json" for size in SCALES}}[kind]
    return marker.exists()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None, help="fixtures and outputs go here (default: a temp dir, removed)")
    ap.add_argument("--reuse", action="store_true", help="reuse fixtures an earlier run left in --work")
    ap.add_argument("--only", action="append", choices=list(CASES), help="run only these cases")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--child", nargs=2, metavar=("FIXTURE", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], Path(args.child[1]))
        return 0
    tmp = None if args.work else tempfile.mkdtemp(prefix="bench-memory-")
    work = (args.work or Path(tmp)).resolve()
    try:
        work.mkdir(parents=True, exist_ok=True)
        results = []
        built: set[str] = set()
        for name in args.only or list(CASES):
            fixture, what, build = CASES[name]
            if fixture is not None and fixture not in built and not (args.reuse and _built(fixture, work)):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, __file__, "--child", fixture, str(work)], check=True, cwd=ROOT)
                print(f"(built {fixture} in {time.perf_counter() - t0:.0f} s)", flush=True)
            built.add(fixture)
            (work / "out").mkdir(exist_ok=True)
            row = {"case": name, "what": what, **measure_process(build(work))}
            row["meets_target"] = max(row["peak_mb"], row.get("tree_pss_mb", 0)) < TARGET_MB
            results.append(row)
            print(json.dumps(row), flush=True)
        print()
        print(f"| case | what | wall s | peak MB | PSS MB, all processes | target < {TARGET_MB:,} MB |")
        print("|---|---|---:|---:|---:|---|")
        for r in results:
            pss = f"{r['tree_pss_mb']:,}" if "tree_pss_mb" in r else "-"
            print(f"| {r['case']} | {r['what']} | {r['wall_s']} | {r['peak_mb']:,} | {pss} | "
                  f"{'met' if r['meets_target'] else 'MISSED'} |")
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        return 0 if all(r["meets_target"] for r in results) else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

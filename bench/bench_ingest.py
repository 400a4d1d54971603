"""Ingest benchmark: the Mooncake conversation trace and a synthesized N-row Azure-style CSV.

The Mooncake trace is read from $REPLAY_SHARED, else the `shared` folder beside the repository checkout
(traces/mooncake/conversation_trace.jsonl); it is skipped when absent.

    python bench/bench_ingest.py                 # 10M-row CSV (about 400 MB in a temp dir)
    python bench/bench_ingest.py --rows 1000000  # quicker

Each measurement runs in its own child process so its peak RSS (``ru_maxrss``) is its own. The
baseline in the same run is pyarrow's raw reader on the same file (``pyarrow.json.read_json`` /
``pyarrow.csv.read_csv`` with default type inference): the ratio says what validation, timestamp
parsing, provenance hashing and the Parquet write cost on top of just parsing the file.
Targets: > 1M rows/s and < 1.5 GB peak for 10M rows.
"""

from __future__ import annotations

import argparse
import json
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

MOONCAKE = shared_dir() / "traces" / "mooncake" / "conversation_trace.jsonl"


def _child(step: str, src: str, dest: str) -> None:
    sys.path.insert(0, str(ROOT))
    import pyarrow.csv  # noqa: F401  (imports outside the timed region)
    import pyarrow.json  # noqa: F401

    from replay.ingest import convert

    t0 = time.perf_counter()
    if step == "convert":
        rows = convert(src, dest).rows_written
    elif step == "raw-json":
        import pyarrow.json as pj

        rows = pj.read_json(src).num_rows
    elif step == "raw-csv":
        import pyarrow.csv as pcsv

        rows = pcsv.read_csv(src).num_rows
    elif step == "synth-csv":
        from replay.ingest.synth import SynthConfig, write_azure_csv

        rows = write_azure_csv(SynthConfig(requests=int(dest), seed=0, rate=100.0, turns_mean=1), src)
    else:
        raise SystemExit(f"unknown step {step}")
    elapsed = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB
    print(json.dumps({"rows": rows, "seconds": elapsed, "peak_mb": peak_mb}))


def _run(step: str, src: Path | str, dest: Path | str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", step, str(src), str(dest)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _line(name: str, r: dict, base: dict | None = None) -> str:
    rate = r["rows"] / r["seconds"]
    text = f"{name:<34} {r['rows']:>11,} rows  {r['seconds']:7.2f} s  {rate / 1e6:6.2f} M rows/s  " \
           f"peak {r['peak_mb']:7.0f} MB"
    if base is not None:
        text += f"  ({r['seconds'] / base['seconds']:.2f}x the raw read)"
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows of the synthesized Azure-style CSV")
    ap.add_argument("--child", nargs=3, metavar=("STEP", "SRC", "DEST"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    with tempfile.TemporaryDirectory(prefix="bench_ingest_") as tmp:
        tmpd = Path(tmp)
        if MOONCAKE.exists():
            base = _run("raw-json", MOONCAKE, "-")
            conv = _run("convert", MOONCAKE, tmpd / "m.parquet")
            print(_line("raw pyarrow.json (mooncake)", base))
            print(_line("replay ingest (mooncake)", conv, base))
        else:
            print(f"skipped Mooncake: {MOONCAKE} not present")
        csv_path = tmpd / "azure_big.csv"
        gen = _run("synth-csv", csv_path, args.rows)
        print(f"(generated {gen['rows']:,}-row CSV, {csv_path.stat().st_size / 1e6:.0f} MB, in {gen['seconds']:.1f} s)")
        base = _run("raw-csv", csv_path, "-")
        conv = _run("convert", csv_path, tmpd / "azure_big.parquet")
        print(_line("raw pyarrow.csv (azure-style)", base))
        print(_line("replay ingest (azure-style)", conv, base))


if __name__ == "__main__":
    main()

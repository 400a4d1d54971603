"""Bytes on disk, and `run` and `report` wall time and peak memory, of this checkout against a baseline
checkout (e.g. one before chunk runs), on the same traces, each command in its own process.

    python bench/bench_storage.py --baseline /path/to/baseline/checkout [--work DIR] [--only synth200k]

The baseline is another checkout with its own environment (``BASELINE/.venv/bin/python``, or
``--baseline-python``). Cases: ``synth200k`` (`replay synth -n 200000` default traffic, written once
under --work) and ``mooncake`` (the public Mooncake conversation trace, bench/shared.py). Peak is
``ru_maxrss`` of the command's own process (``wait4``), wall its elapsed time: on a shared machine
compare the two columns of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.shared import measure_process, shared_dir  # noqa: E402

OUTPUTS = ("requests.parquet", "steps.parquet", "chunks.parquet")


def _traces(work: Path, python: str) -> dict[str, Path]:
    synth = work / "synth200k.jsonl"
    if not synth.is_file():
        subprocess.run([python, "-m", "replay.cli", "synth", "-n", "200000", "--seed", "0", "-o", str(synth)],
                       check=True, cwd=ROOT)
    return {"synth200k": synth, "mooncake": shared_dir() / "traces" / "mooncake" / "conversation_trace.jsonl"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, required=True, help="baseline checkout")
    ap.add_argument("--baseline-python", help="its python (default BASELINE/.venv/bin/python)")
    ap.add_argument("--work", type=Path, default=None, help="traces and outputs (default: a temp dir, removed)")
    ap.add_argument("--only", action="append", choices=["synth200k", "mooncake"])
    args = ap.parse_args()
    sides = {"baseline": (args.baseline.resolve(), args.baseline_python or str(args.baseline / ".venv/bin/python")),
             "this": (ROOT, sys.executable)}
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        traces = _traces(work, sys.executable)
        rows = []
        for case in args.only or list(traces):
            for side, (checkout, python) in sides.items():
                out = work / f"{case}-{side}"
                run = measure_process([python, "-m", "replay.cli", "run", str(traces[case]), "-o", str(out), "-q"], checkout)
                sizes = {f: (out / f).stat().st_size for f in OUTPUTS}
                report = measure_process([python, "-m", "replay.cli", "report", str(out), "-o", str(work / f"{case}-{side}.md")],
                                  checkout)
                row = {"case": case, "side": side, "run": run, "report": report, "bytes": sizes}
                rows.append(row)
                print(row, flush=True)
        print()
        print("| case | side | run wall s | run peak MB | report wall s | report peak MB | chunks.parquet | "
              "requests.parquet | steps.parquet |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            b = r["bytes"]
            print(f"| {r['case']} | {r['side']} | {r['run']['wall_s']} | {r['run']['peak_mb']:,} | "
                  f"{r['report']['wall_s']} | {r['report']['peak_mb']:,} | {b['chunks.parquet']:,} | "
                  f"{b['requests.parquet']:,} | {b['steps.parquet']:,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

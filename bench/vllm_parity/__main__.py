"""python -m bench.vllm_parity [--regenerate] [--compare] [-w NAME ...] [--list]

--regenerate  run vLLM's own scheduler on every workload (the vLLM venv's python, with this
              project installed there too: pip install --no-deps -e .) and
              write tests/fixtures/vllm_parity/<workload>.json.gz (plus the rows each one replays)
--compare     replay every fixture through our engine and print the per-workload table; the first
              differing step is printed in full (project env; no vLLM needed)
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.vllm_parity.workloads import Workload, all_workloads, load_rows

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "vllm_parity"


def rows_file(w: Workload) -> Path:
    return FIXTURES / f"rows-{w.start}-{w.rows}.json.gz"


def write_rows(w: Workload) -> None:
    """The trace rows a workload replays, stored once per slice (tests must not need the shared traces)."""
    path = rows_file(w)
    if path.exists():
        return
    body = json.dumps(load_rows(w.start, w.rows), separators=(",", ":")).encode()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress(body, mtime=0))
    tmp.replace(path)


def read_rows(w: Workload) -> list[dict]:
    return json.loads(gzip.decompress(rows_file(w).read_bytes()))


def regenerate(names: list[str] | None, models_root: Path) -> int:
    from bench.vllm_parity.tables import write_fixture
    from bench.vllm_parity.vllm_driver import run_vllm

    FIXTURES.mkdir(parents=True, exist_ok=True)
    for w in all_workloads():
        if names and w.name not in names:
            continue
        write_rows(w)
        t0 = time.perf_counter()
        try:
            tables, meta = run_vllm(w, read_rows(w), models_root)
        except Exception as exc:  # keep the other workloads; the failure is reported
            print(f"{w.name}: vLLM run failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        write_fixture(FIXTURES / f"{w.name}.json.gz", w.to_json(), tables, meta)
        print(f"{w.name}: {len(tables.steps)} steps, {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


def compare_all(names: list[str] | None, models_root: Path, verbose: bool = True) -> int:
    from bench.vllm_parity.replay_driver import run_replay
    from bench.vllm_parity.tables import compare, read_fixture

    bad = 0
    print("| workload | steps (vLLM) | steps (replay) | identical steps | differing steps | requests differing |")
    print("|---|---|---|---|---|---|")
    firsts = []
    for path in sorted(FIXTURES.glob("*.json.gz")):
        if path.name.startswith("rows-"):
            continue
        wj, _, vt = read_fixture(path)
        w = Workload.from_json(wj)
        if names and w.name not in names:
            continue
        c = compare(vt, run_replay(w, read_rows(w), models_root))
        diff = max(c.steps_vllm, c.steps_replay) - c.identical_steps
        print(f"| {w.name} | {c.steps_vllm} | {c.steps_replay} | {c.identical_steps} | {diff} | "
              f"{c.request_differences} |", flush=True)
        if not c.identical:
            bad += 1
            firsts.append(f"{w.name}: {c.first_difference}")
    if verbose:
        for f in firsts:
            print(f)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.vllm_parity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regenerate", action="store_true")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("-w", "--workload", action="append", help="only these workloads (repeatable)")
    ap.add_argument("--models", type=Path, default=Path(tempfile.gettempdir()) / "vllm-parity-models",
                    help="where the config.json-only model folders are written")
    a = ap.parse_args(argv)
    if a.list:
        for w in all_workloads():
            print(w.name)
        return 0
    rc = 0
    if a.regenerate:
        rc |= regenerate(a.workload, a.models)
    if a.compare or not a.regenerate:
        rc |= compare_all(a.workload, a.models)
    return rc


if __name__ == "__main__":
    sys.exit(main())

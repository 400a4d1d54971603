"""python -m bench.compare: replay vs AISimulate, side by side, on one trace or the named workloads.

    python -m bench.compare --trace T --config ours.yaml [--name N] [--out bench/compare/results]
    python -m bench.compare --workload NAME | --all | --list   [--side both|ours|peer] [--reps N]
    python -m bench.compare --workload NAME --set KEY=VALUE [--set ...] --name RESULT

Run from the repository root. AISimulate is looked up at $AISIMULATE or ~/aisim/bin/aisimulate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from bench.compare import report
from bench.compare.compare import Job, compare
from bench.compare.traces import TraceInputError
from bench.compare.translate import TranslationError
from bench.compare.workloads import WORKLOADS_FILE, Skip, WorkloadError, load_workloads, resolve_trace
from replay.base.atomic import write_text_atomic
from replay.base.errors import ReplayError

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
DEFAULT_WORK = Path("/tmp/replay-compare")

console = Console()


def _previous(out: Path, name: str) -> dict | None:
    path = out / f"{name}.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _run(job: Job, args: argparse.Namespace) -> dict:
    result = compare(job, sides=args.side, previous=_previous(args.out, job.name), reps=args.reps)
    report.print_table(result, console)
    json_path, md_path = report.save(result, args.out)
    console.print(f"saved {json_path} and {md_path}", highlight=False)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--trace", type=Path, help="canonical Parquet trace or Mooncake JSONL")
    what.add_argument("--workload", action="append", help="a named workload (repeatable)")
    what.add_argument("--all", action="store_true", help="every named workload, one at a time")
    what.add_argument("--list", action="store_true", help="list the named workloads")
    what.add_argument("--summary", action="store_true",
                      help="write results/summary.md from the saved results of every named workload (runs nothing)")
    ap.add_argument("--config", type=Path, help="our config YAML (with --trace)")
    ap.add_argument("--name", help="result name (with --trace, or one --workload with --set); default: the config's "
                    "stem, or the workload's name")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of our config (repeatable, as `replay run --set`); AISimulate gets the "
                         "translation of the result; needs --name, so the workload's own result is kept")
    ap.add_argument("--sessions", choices=["refuse", "flatten"], default="refuse",
                    help="multi-turn sessions: refuse, or replay every turn open-loop on both sides")
    ap.add_argument("--workloads", type=Path, default=WORKLOADS_FILE)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where results JSON/markdown go")
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORK, help="scratch space for traces and outputs")
    ap.add_argument("--side", choices=["both", "ours", "peer"], default="both",
                    help="run one side only; the other is carried over from an earlier identical comparison")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per process (default: workload's, 1800)")
    ap.add_argument("--reps", type=int, default=1,
                    help="run both sides this many times, alternating which goes first; speed from the median walls")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps takes a positive count")
    if args.overrides and not args.name:
        ap.error("--set needs --name: the result is another comparison than the config's or workload's own")
    if args.name and args.all:
        ap.error("--name names one result: give one --workload, not --all")
    if args.name and args.workload and len(args.workload) > 1:
        ap.error("--name names one result: give one --workload")

    try:
        if args.trace is not None:
            if args.config is None:
                ap.error("--trace needs --config")
            name = args.name or args.config.stem
            job = Job(name=name, trace=args.trace, config=args.config, workdir=args.workdir / name,
                      sessions=args.sessions, timeout_s=args.timeout or 1800.0, overrides=args.overrides)
            _run(job, args)
            return 0
        wf = load_workloads(args.workloads)
        if args.list:
            for name, wl in wf.workloads.items():
                console.print(f"[bold]{name}[/]: {wl.description}", highlight=False)
            return 0
        if args.summary:
            saved = [_previous(args.out, n) or {"name": n, "skipped": "no saved result"} for n in wf.workloads]
            write_text_atomic(args.out / "summary.md", report.summary_markdown(saved))
            console.print(f"saved {args.out / 'summary.md'}", highlight=False)
            return 0
        names = list(wf.workloads) if args.all else args.workload
        unknown = [n for n in names if n not in wf.workloads]
        if unknown:
            raise WorkloadError(f"unknown workload(s) {unknown}; known: {', '.join(wf.workloads)}")
        results = []
        for name in names:
            wl = wf.workloads[name]
            workdir = args.workdir / name
            try:
                trace, notes = resolve_trace(name, wl, workdir, args.workloads.parent)
            except Skip as why:
                console.print(f"[yellow]skipping {name}: {why}[/]", highlight=False)
                results.append({"name": name, "skipped": str(why)})
                continue
            result_name = args.name or name
            description = wl.description + (f" With --set {' '.join(args.overrides)}." if args.overrides else "")
            job = Job(name=result_name, trace=trace, config=(args.workloads.parent / wl.config).resolve(),
                      workdir=args.workdir / result_name, description=description, sessions=wl.sessions,
                      timeout_s=args.timeout or wl.timeout_s, trace_notes=notes, overrides=args.overrides)
            results.append(_run(job, args))
        if args.all:
            kept = [r if r.get("skipped") else (_previous(args.out, r["name"]) or r) for r in results]
            write_text_atomic(args.out / "summary.md", report.summary_markdown(kept))
            console.print(f"saved {args.out / 'summary.md'}", highlight=False)
        return 0
    except (TranslationError, TraceInputError, WorkloadError, ReplayError) as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``replay plan TRACE -c base.yaml --slo ttft_p99=2000 --vary fleet.replicas=1..128``: fewest GPUs per
combination of the other grid values that meets the SLO. Without ``-o`` the runs go to a temporary
directory, removed at the end: the answer is printed."""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer
from rich.table import Table

from replay.base.errors import ReplayError
from replay.commands._common import console, user_errors
from replay.commands.sweep_cmd import GRID_HELP, RAY_HELP


def plan(
    trace: Path = typer.Argument(..., help="Canonical Parquet trace, or any file `replay ingest` reads."),
    config: Path | None = typer.Option(None, "--config", "-c", help="Base engine config YAML."),
    set_: list[str] = typer.Option([], "--set", help="Override a base config key, as `replay run --set`."),
    slo: list[str] = typer.Option(..., "--slo", help="Constraints to meet, e.g. ttft_p99=2000,tpot_p99=50 (ms, repeatable)."),
    vary: list[str] = typer.Option(..., "--vary", help="A key that sets the GPU count and its candidates, e.g. "
                                   "fleet.replicas=1..128; repeat it for a grid (e.g. prefill and decode replicas): "
                                   "the answer is the candidate with the fewest GPUs in total."),
    grid: list[str] = typer.Option([], "--grid", help="Other keys: one answer per combination. " + GRID_HELP),
    goal: str = typer.Option("min", "--goal", help="min: smallest passing value (more is better, e.g. replicas); "
                                                  "max: largest passing value (more is worse, e.g. load.speedup)."),
    search: str = typer.Option("auto", "--search", help="auto: bisect, then scan every cheaper candidate when the runs "
                               "contradict monotonicity; bisect: trust bisection (contradictions are only flagged); "
                               "scan: every candidate in order of GPUs until one passes (right on any curve)."),
    outdir: Path | None = typer.Option(None, "--output", "-o", help="Sweep directory (shared store: reruns reuse "
                                       "every run). Without it the runs go to a temporary directory, removed after "
                                       "the answer is printed."),
    summary_only: bool = typer.Option(False, "--summary-only", help="Keep only the summary rows, not each run's outdir."),
    ray: str | None = typer.Option(None, "--ray", help=RAY_HELP),
    workers: int | None = typer.Option(None, "--workers", "-j", min=1, help="Local worker processes (default: all cores)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or tables."),
    on_error: str = typer.Option("fail", "--on-error", help="As `replay run`: fail (a config with an unreplayable "
                                 "request fails, and so does the plan) or skip (such requests are marked rejected)."),
) -> None:
    """The fewest GPUs (replicas x tensor_parallel_size, over every pool) meeting --slo among the --vary candidates."""
    from replay.sweep.grid import check_axes, parse_axes, parse_axis
    from replay.sweep.plan import SEARCHES, answer_rows
    from replay.sweep.plan import plan as run_plan
    from replay.sweep.plan_output import write_plan
    from replay.sweep.progress import RichProgress
    from replay.sweep.runner import NoProgress, SweepOptions, SweepSession
    from replay.sweep.slo import parse_sweep_slo

    with user_errors():
        if goal not in ("min", "max"):
            raise ReplayError("--goal takes min or max")
        if search not in SEARCHES:
            raise ReplayError(f"--search takes {', '.join(SEARCHES)}")
        sweep_slo = parse_sweep_slo(slo)
        if not sweep_slo.constraints:
            raise ReplayError("--slo needs at least one <metric>_<stat>=ms constraint, e.g. ttft_p99=2000")
        vary_axes = check_axes([parse_axis(v, "--vary") for v in vary], "--vary")
        for axis in vary_axes:
            _check_numeric(axis)
        if len({a.key for a in vary_axes}) < len(vary_axes):
            raise ReplayError("--vary: each key once")
        if goal == "max" and len(vary_axes) > 1:
            raise ReplayError("--goal max takes one --vary key")
        others = check_axes(parse_axes(grid))
        both = {a.key for a in vary_axes} & {a.key for a in others}
        if both:
            raise ReplayError(f"--vary {sorted(both)[0]} is also a --grid key")
        with tempfile.TemporaryDirectory(prefix="replay-plan-") as scratch:
            where = outdir if outdir is not None else Path(scratch) / "plan"
            session = SweepSession.open(trace, config, where, sweep_slo,
                                        SweepOptions(ray=ray, workers=workers,
                                                     summary_only=summary_only or outdir is None, on_error=on_error),
                                        overrides=set_)
            session.write_definition({"command": "plan", "vary": vary, "grid": grid, "goal": goal,
                                      "search": search})
            try:
                if quiet:
                    outcome = run_plan(session, vary_axes, others, goal, search, NoProgress())
                else:
                    with RichProgress(console, "plan") as bar:
                        outcome = run_plan(session, vary_axes, others, goal, search, bar)
            except KeyboardInterrupt:
                kept = f"finished runs are kept in {outdir}; rerun" if outdir else "rerun with -o DIR to keep runs and"
                raise ReplayError(f"interrupted: {kept} the same command to resume (finished runs are reused)") from None
            finally:
                session.close()
            failures = _failed_runs(outcome.results)
            rows = answer_rows(outcome, session)
            paths = write_plan(session, others + vary_axes, outcome, rows) if outdir is not None else None
    if failures is not None and not quiet:
        console.print(f"[yellow]{failures}[/]", highlight=False)
    if not quiet:
        _print(rows, [a.key for a in vary_axes], [a.key for a in others], session, paths)
    elif outdir is None:
        _print_answers(rows, [a.key for a in vary_axes], [a.key for a in others])


def _failed_runs(results) -> str | None:
    """Runs that could not replay the trace (a config too small for its longest requests) count as
    missing the SLO, which is what they are for the search; the plan says so in a line. When every
    run failed nothing was learned (and "none in range" would hide the error): the plan stops, naming
    the first. Candidates whose config does not validate are not runs (the sweep counts them)."""
    ran = [r for r in results if r.key is not None]
    failed = [r for r in ran if r.error]
    if not failed:
        return None
    at = ", ".join(f"{k}={v.label}" for k, v in failed[0].point)
    if len(failed) == len(ran):
        raise ReplayError(f"all {len(ran)} runs failed, so no answer is given; the first ({at}): {failed[0].error}")
    return (f"{len(failed)} of {len(ran)} runs could not replay the trace and count as missing the SLO "
            f"(the first, {at}: {failed[0].error})")


def _check_numeric(axis) -> None:
    labels = [v.label for v in axis.values]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in labels):
        raise ReplayError(f"--vary {axis.key}: the values must be numbers (e.g. 1..64 or 1,2,4,8)")


def _answer(row, keys: list[str]) -> str:
    if not row["feasible"]:
        return "none in range"
    return ", ".join(f"{k}={row[k]}" for k in keys) if len(keys) > 1 else str(row[keys[0]])


def _print_answers(rows, keys: list[str], others: list[str]) -> None:
    """One plain line per answer (--quiet without -o: the answer is the only output)."""
    for row in rows:
        where = ", ".join(f"{c}={row[c]}" for c in others)
        gpus = f" ({row['gpus']} GPUs)" if row["feasible"] else ""
        console.print(f"{where + ': ' if where else ''}{_answer(row, keys)}{gpus}", highlight=False)


def _print(rows, keys: list[str], others: list[str], session, paths) -> None:
    table = Table(title=f"plan: {session.slo.text()}", title_justify="left")
    for col in [*others, *keys, "gpus", "runs", "search", "monotone"]:
        table.add_column(col.rsplit(".", 1)[-1] if col in others else col, justify="right")
    for row in rows:
        answer = [str(row[k]) for k in keys] if row["feasible"] else ["none in range"] + ["-"] * (len(keys) - 1)
        table.add_row(*(str(row[c]) for c in others), *answer, str(row["gpus"] or "-"), str(row["runs"]),
                      row["search"], "yes" if row["monotone"] else "[yellow]no[/]")
    console.print(table)
    for row in rows:
        where = ", ".join(f"{c}={row[c]}" for c in others)
        prefix = f"{where}: " if where else ""
        if row["deciding_pass"]:
            at = ", ".join(f"{k}={row[k]}" for k in keys)
            if not row["deciding_fail"]:
                why = "the cheapest candidate"
            elif row["scanned"]:
                why = f"scanned: every cheaper candidate ran and failed, the last {row['deciding_fail_value']}"
            else:
                why = f"bisection: {row['deciding_fail_value']} fails"
            console.print(f"{prefix}{at} passes with {row['gpus']} GPUs ({why})", highlight=False)
        elif row["scanned"]:
            console.print(f"{prefix}every candidate ran and failed", highlight=False)
        if row["violations"]:
            console.print(f"[yellow]not monotone[/] {prefix}{row['violations']}", highlight=False)
    if paths is not None:
        console.print(f"answers -> [bold]{paths[0]}[/], every run -> [bold]{paths[1]}[/]")
    else:
        console.print("(runs made in a temporary directory, now removed: pass -o DIR to keep them)")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)

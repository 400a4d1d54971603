"""``replay plan TRACE -c base.yaml --slo ttft_p99=2000 --vary fleet.replicas=1..128``: fewest GPUs per
combination of the other grid values that meets the SLO."""

from __future__ import annotations

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
    slo: str = typer.Option(..., "--slo", help="Constraints to meet, e.g. ttft_p99=2000,tpot_p99=50 (ms)."),
    vary: str = typer.Option(..., "--vary", help="The monotone key and its candidates, e.g. fleet.replicas=1..128."),
    grid: list[str] = typer.Option([], "--grid", help="Other keys: one answer per combination. " + GRID_HELP),
    goal: str = typer.Option("min", "--goal", help="min: smallest passing value (more is better, e.g. replicas); "
                                                  "max: largest passing value (more is worse, e.g. load.speedup)."),
    on_violation: str = typer.Option("warn", "--on-violation", help="When the runs contradict monotonicity: warn "
                                     "(flag the answer) or scan (run every value below the answer; smallest passing wins)."),
    outdir: Path = typer.Option(..., "--output", "-o", help="Sweep directory (shared store: reruns reuse every run)."),
    summary_only: bool = typer.Option(False, "--summary-only", help="Keep only the summary rows, not each run's outdir."),
    ray: str | None = typer.Option(None, "--ray", help=RAY_HELP),
    workers: int | None = typer.Option(None, "--workers", "-j", min=1, help="Local worker processes (default: all cores)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or tables."),
) -> None:
    """Bisect the monotone --vary key for the fewest GPUs (replicas x tensor_parallel_size) meeting --slo."""
    from replay.sweep.grid import parse_axes, parse_axis
    from replay.sweep.plan import answer_rows
    from replay.sweep.plan import plan as run_plan
    from replay.sweep.plan_output import write_plan
    from replay.sweep.progress import RichProgress
    from replay.sweep.runner import NoProgress, SweepOptions, SweepSession
    from replay.sweep.slo import parse_sweep_slo

    with user_errors():
        if goal not in ("min", "max"):
            raise ReplayError("--goal takes min or max")
        if on_violation not in ("warn", "scan"):
            raise ReplayError("--on-violation takes warn or scan")
        sweep_slo = parse_sweep_slo(slo)
        if not sweep_slo.constraints:
            raise ReplayError("--slo needs at least one <metric>_<stat>=ms constraint, e.g. ttft_p99=2000")
        vary_axis = parse_axis(vary, "--vary")
        _check_numeric(vary_axis)
        others = parse_axes(grid)
        if vary_axis.key in {a.key for a in others}:
            raise ReplayError(f"--vary {vary_axis.key} is also a --grid key")
        session = SweepSession.open(trace, config, outdir, sweep_slo,
                                    SweepOptions(ray=ray, workers=workers, summary_only=summary_only),
                                    overrides=set_)
        session.write_definition({"command": "plan", "vary": vary, "grid": grid, "goal": goal})
        try:
            if quiet:
                outcome = run_plan(session, vary_axis, others, goal, on_violation, NoProgress())
            else:
                with RichProgress(console, "plan") as bar:
                    outcome = run_plan(session, vary_axis, others, goal, on_violation, bar)
        except KeyboardInterrupt:
            raise ReplayError(f"interrupted: finished runs are kept in {outdir}; rerun the same command to "
                              "resume (finished runs are reused)") from None
        finally:
            session.close()
        rows = answer_rows(outcome, session)
        paths = write_plan(session, others + [vary_axis], outcome, rows)
    if not quiet:
        _print(rows, vary_axis.key, [a.key for a in others], session, paths)


def _check_numeric(axis) -> None:
    labels = [v.label for v in axis.values]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in labels):
        raise ReplayError(f"--vary {axis.key}: the values must be numbers (e.g. 1..64 or 1,2,4,8)")


def _print(rows, key: str, others: list[str], session, paths) -> None:
    table = Table(title=f"plan: {session.slo.text()}", title_justify="left")
    for col in [*others, key, "gpus", "runs", "monotone"]:
        table.add_column(col.rsplit(".", 1)[-1], justify="right")
    for row in rows:
        answer = str(row[key]) if row["feasible"] else "none in range"
        table.add_row(*(str(row[c]) for c in others), answer, str(row["gpus"] or "-"), str(row["runs"]),
                      "yes" if row["monotone"] else "[yellow]no[/]")
    console.print(table)
    for row in rows:
        where = ", ".join(f"{c}={row[c]}" for c in others)
        prefix = f"{where}: " if where else ""
        if row["deciding_pass"]:
            console.print(f"{prefix}{key}={row[key]} passes ({row['deciding_pass']})"
                          + (f", {key}={row['deciding_fail_value']} fails ({row['deciding_fail']})"
                             if row["deciding_fail"] else ", the smallest candidate"), highlight=False)
        if row["violations"]:
            console.print(f"[yellow]warning: not monotone[/] {prefix}{row['violations']}", highlight=False)
    console.print(f"answers -> [bold]{paths[0]}[/], every run -> [bold]{paths[1]}[/]")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)

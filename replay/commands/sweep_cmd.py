"""``replay sweep TRACE -c base.yaml --grid key=v1,v2 ... -o SWEEPDIR``: replay every combination."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from replay.base.errors import ReplayError
from replay.commands._common import console, user_errors

GRID_HELP = ("A config key and its values: key=v1,v2 (YAML scalars), key=LOW..HIGH[:STEP], or key=a.yaml,b.yaml "
             "(each file's mapping becomes the key's value). Repeat for a cartesian product.")
RAY_HELP = "Run on Ray: 'auto' starts a local Ray instance, an address (host:port or ray://...) joins a cluster."


def sweep(
    trace: Path = typer.Argument(..., help="Canonical Parquet trace, or any file `replay ingest` reads."),
    config: Path | None = typer.Option(None, "--config", "-c", help="Base engine config YAML (default: vLLM defaults)."),
    grid: list[str] = typer.Option(..., "--grid", help=GRID_HELP),
    set_: list[str] = typer.Option([], "--set", help="Override a base config key, as `replay run --set`."),
    outdir: Path = typer.Option(..., "--output", "-o", help="Sweep directory (resumable: rerun to finish it)."),
    slo: list[str] | None = typer.Option(None, "--slo", help="SLO, e.g. ttft_p99=2000,tpot_p99=50 (ms, repeatable): sets "
                                                             "slo_met and goodput."),
    summary_only: bool = typer.Option(False, "--summary-only", help="Keep only the summary rows, not each run's outdir."),
    ray: str | None = typer.Option(None, "--ray", help=RAY_HELP),
    workers: int | None = typer.Option(None, "--workers", "-j", min=1, help="Local worker processes (default: all cores)."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Rerun configs whose stored result is an error."),
    on_error: str = typer.Option("fail", "--on-error", help="As `replay run`: fail (a config with an unreplayable request fails) or skip."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or summary."),
) -> None:
    """Replay TRACE under every combination of the --grid values; write SWEEPDIR/sweep.parquet."""
    from replay.sweep.grid import check_axes, parse_axes, product
    from replay.sweep.progress import RichProgress
    from replay.sweep.runner import NoProgress, SweepOptions, SweepSession
    from replay.sweep.slo import parse_sweep_slo

    with user_errors():
        axes = check_axes(parse_axes(grid))
        points = product(axes)
        options = SweepOptions(ray=ray, workers=workers, summary_only=summary_only, retry_failed=retry_failed,
                               on_error=on_error)
        session = SweepSession.open(trace, config, outdir, parse_sweep_slo(slo), options, overrides=set_)
        session.refuse_all_invalid(points)  # before sweep.json is rewritten: a refused sweep changes nothing
        session.write_definition({"command": "sweep", "grid": grid})
        try:
            if quiet:
                results = session.run_points(points, NoProgress())
            else:
                with RichProgress(console) as bar:
                    results = session.run_points(points, bar)
        except KeyboardInterrupt:
            raise ReplayError(f"interrupted: finished configs are kept in {outdir}; rerun the same command to "
                              "run only the missing ones") from None
        finally:
            session.close()
        table_path = session.write_table(axes, results)
    if not quiet:
        _print_summary(results, session, table_path)


def _print_summary(results, session, table_path: Path) -> None:
    failed = [r for r in results if r.error is not None]
    c = session.counts
    console.print(f"{len(results)} configs: {c['ran']} run now, {c['reused']} reused from {session.sweepdir}, "
                  f"{len(failed)} failed -> [bold]{table_path}[/]")
    for r in failed[:5]:
        console.print(f"[yellow]failed[/] {escape(_label(r))}: {escape(_short(r.error))}", highlight=False)
    if len(failed) > 5:
        console.print(f"[yellow]{len(failed) - 5} more failed[/] (the error column of sweep.parquet has them all)")
    ok = [r for r in results if r.metrics]
    rank = "goodput_per_gpu" if session.slo.goodput is not None else "output_throughput_per_gpu"
    ok.sort(key=lambda r: -(r.metrics.get(rank) or 0.0))
    table = Table(title=f"best configs by {rank}", title_justify="left")
    for col in ("config", rank, "ttft_p99", "tpot_p99", "gpus", "slo_met"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in ok[:10]:
        m = r.metrics
        table.add_row(escape(_label(r)), *(f"{m[k]:,.4g}" if isinstance(m.get(k), float) else str(m.get(k))
                                   for k in (rank, "ttft_p99", "tpot_p99", "gpus", "slo_met")))
    console.print(table)


def _label(result) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v.label}" for k, v in result.point)


def _short(error: str, limit: int = 160) -> str:
    first = error.splitlines()[0]
    return first if len(first) <= limit else first[:limit] + "..."


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)

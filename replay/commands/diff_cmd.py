"""``replay diff``: two replays of one trace side by side (or run two configs first, then compare)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from replay.base.errors import ReplayError
from replay.commands._common import console, user_errors


def _run_shortcut(trace: Path, config_a: Path | None, config_b: Path | None, set_a: list[str], set_b: list[str],
                  runs_dir: Path) -> tuple[Path, Path]:
    """Replay the trace under both configs through the Python API; returns the two OUTDIRs."""
    if not trace.is_file():
        raise ReplayError(f"{trace}: no such trace file (with -a/-b the first argument is a trace)")
    try:
        from replay.api import run
    except ImportError as exc:
        raise ReplayError(f"the -a/-b shortcut needs the replay engine API (replay.api.run), which is not "
                          f"available: {exc}. Run both configs with `replay run` and diff the two OUTDIRs.") from None
    from replay.api import resolve_config
    from replay.base.atomic import check_output_dir
    from replay.engine.run import config_input_files

    # Both runs' folders are checked before either runs: neither may be, or hold, the trace or a file
    # either config reads (a config kept under <stem>_runs/ is an input, never replaced).
    inputs: list[Path] = [trace]
    for config, overrides in ((config_a, set_a), (config_b, set_b)):
        inputs += config_input_files(resolve_config(config, overrides)[0], config)
    for side in ("a", "b"):
        check_output_dir(runs_dir / side, inputs=inputs)
    outdirs = []
    for side, config, overrides in (("a", config_a, set_a), ("b", config_b, set_b)):
        outdir = runs_dir / side
        console.print(f"replaying {trace} with config {side.upper()} "
                      f"({config or 'defaults'}{' + ' + ' '.join(overrides) if overrides else ''}) -> {outdir}")
        try:
            result = run(trace, config, overrides=overrides or None, outdir=outdir, progress=False, overwrite=True)
        except ReplayError as exc:  # say which run failed; diff has no --on-error of its own
            text = str(exc).replace("or pass --on-error skip to mark them rejected",
                                    "or replay each config with `replay run --on-error skip` and diff the two OUTDIRs")
            raise ReplayError(f"replaying config {side.upper()} ({config or 'defaults'}): {text}") from None
        outdirs.append(Path(result.outdir))
    return outdirs[0], outdirs[1]


def _summary(d) -> Table:
    from replay.reports.diff import KEY_METRICS
    from replay.reports.fmt import change, num

    na, nb = d.names
    table = Table(title=f"replay diff: {na} vs {nb}", title_justify="left")
    for col, justify in (("metric", "left"), (na, "right"), (nb, "right"), ("change", "right"), ("better", "center")):
        table.add_column(col, justify=justify)
    by_key = {c.key: c for c in d.comparisons}
    for key in KEY_METRICS:
        c = by_key.get(key)
        if c is None:
            continue
        _, rel = change(c.row_a.value, c.value_b, c.row_a.unit)
        style = {"A": "bold red", "B": "bold green", "tie": "dim"}.get(c.winner, "")
        winner = {"A": na, "B": nb, "tie": "="}.get(c.winner, "")
        table.add_row(f"{c.row_a.label} ({c.row_a.unit})", num(c.row_a.value, c.row_a.unit),
                      num(c.value_b, c.row_a.unit), rel, f"[{style}]{winner}[/]" if style else winner)
    return table


def register(app: typer.Typer) -> None:
    @app.command("diff")
    def diff(
        first: Path = typer.Argument(..., help="OUTDIR of run A, or with -a/-b the trace to replay."),
        second: Path | None = typer.Argument(None, help="OUTDIR of run B (omit with -a/-b)."),
        output: Path = typer.Option(Path("diff.md"), "-o", "--output",
                                    help="Markdown file to write; charts go to <stem>_files/ beside it."),
        config_a: Path | None = typer.Option(None, "-a", "--config-a", help="Shortcut: config YAML for run A."),
        config_b: Path | None = typer.Option(None, "-b", "--config-b", help="Shortcut: config YAML for run B."),
        set_a: list[str] = typer.Option([], "--set-a", help="Shortcut: override for A, e.g. scheduler.max_num_seqs=256."),
        set_b: list[str] = typer.Option([], "--set-b", help="Shortcut: override for B."),
        runs_dir: Path | None = typer.Option(None, "--runs-dir", help="Shortcut: where the two runs go "
                                             "(default <output stem>_runs/ beside the markdown)."),
        name_a: str = typer.Option("A", "--name-a", help="Label of run A in tables and charts."),
        name_b: str = typer.Option("B", "--name-b", help="Label of run B."),
        slo: list[str] | None = typer.Option(None, "--slo", help="Goodput SLOs in ms, e.g. ttft=500,tpot=50 (repeatable)."),
        seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
        resamples: int | None = typer.Option(None, "--resamples", help="Bootstrap resamples (default 1000, "
                                             "fewer above 100k paired requests, min 200)."),
        charts: bool = typer.Option(True, "--charts/--no-charts", help="Draw the overlaid CDF charts."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write the comparison as JSON here."),
    ) -> None:
        """Compare two replays of the same trace: config changes, every metric, paired per-request deltas."""
        with user_errors():
            from replay.reports.diff import diff_runs, verdict_lines, write_diff
            from replay.reports.slo import parse_slo

            parsed_slo = parse_slo(slo)
            from replay.reports.bootstrap import MIN_RESAMPLES

            if resamples is not None and resamples < MIN_RESAMPLES:
                raise ReplayError(f"--resamples {resamples}: a 95% interval needs at least {MIN_RESAMPLES} "
                                  "resamples (default 1000)")
            if config_a is not None or config_b is not None or set_a or set_b:
                if second is not None:
                    raise ReplayError("give either two OUTDIRs, or a trace with -a/-b configs, not both")
                runs = runs_dir or output.parent / f"{output.stem}_runs"
                dir_a, dir_b = _run_shortcut(first, config_a, config_b, set_a, set_b, runs)
            else:
                if second is None:
                    raise ReplayError("replay diff needs two OUTDIRs (replay diff A B -o diff.md), or a trace "
                                      "and two configs (replay diff TRACE -a a.yaml -b b.yaml -o diff.md)")
                dir_a, dir_b = first, second
            result = diff_runs(dir_a, dir_b, slo=parsed_slo, names=(name_a, name_b), seed=seed, resamples=resamples)
            write_diff(result, output, charts=charts, json_path=json_out)
        console.print(_summary(result))
        for line in verdict_lines(result)[:1]:
            console.print(line.lstrip("- "), highlight=False)
        console.print(f"wrote [bold]{result.markdown}[/]" + (f" and {len(result.charts)} charts" if result.charts else ""))

"""``replay validate OUTDIR``: how close were the replay's predictions to what the server measured?"""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from replay.commands._common import console, user_errors


def _distribution_table(v) -> Table:
    """Measured vs predicted mean, p50, p90, p99 per metric (and label), signed error, MAPE."""
    from replay.reports.fmt import num
    from replay.reports.validate_render import distribution_header, distribution_rows

    table = Table(title=f"replay validate: {v.outdir}", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    header = distribution_header(v, short=True)
    for col in header:
        table.add_column(col, justify="left" if col in ("metric", "", v.by) else "right",
                         no_wrap=True)
    rows = distribution_rows(v, lambda value, unit: "-" if value is None else num(value, unit), short=True)
    for i, row in enumerate(rows):
        table.add_row(*row, end_section=i + 1 < len(rows) and rows[i + 1][0] != "")
    return table


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate(
        outdir: Path = typer.Argument(..., help="Replay output directory (from `replay run`)."),
        measured: Path | None = typer.Option(None, "--measured", "-m",
                                             help="Log with the measurements (default: the run's own trace)."),
        format: str | None = typer.Option(None, "--format", "-f", help="Format of --measured when not detected."),
        by: str | None = typer.Option(None, "--by", help="Group every metric by a label: model, tenant, "
                                                         "request_type, source_run or priority."),
        output: Path | None = typer.Option(None, "-o", "--output",
                                           help="Also write the markdown here (charts go to <stem>_files/ beside "
                                                "it); without it nothing is written."),
        charts: bool = typer.Option(True, "--charts/--no-charts", help="Print the CDF charts (and draw the PNG "
                                                                       "charts beside -o's markdown)."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write the figures as JSON here."),
    ) -> None:
        """Measured vs predicted TTFT, TPOT, ITL, E2E and queue time: mean, p50/p90/p99, error, MAPE, CDFs."""
        with user_errors():
            from replay.reports.validate_render import cdf_charts_text, conditions_lines, coverage_line
            from replay.reports.validate_report import write_validation

            result = write_validation(outdir, output, measured=measured, by=by, charts=charts, json_path=json_out,
                                      ingest_options={"format": format} if format else None)
        v = result.validation
        console.print(_distribution_table(v))
        console.print(coverage_line(v), highlight=False)
        for line in conditions_lines(v):
            if line:
                console.print(escape(line.replace("**", "")), highlight=False)
        if charts:
            for chart in cdf_charts_text(v):
                console.print()
                console.print(chart, markup=False, highlight=False)
        written = [str(p) for p in (result.markdown, json_out) if p is not None]
        if written:
            console.print(f"wrote [bold]{escape(', '.join(written))}[/]" +
                          (f" and {len(result.charts)} charts" if result.charts else ""))

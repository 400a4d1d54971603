"""``replay validate OUTDIR``: how close were the replay's predictions to what the server measured?"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from replay.commands._common import console, user_errors


def _table(v) -> Table:
    from replay.reports.fmt import num
    from replay.reports.validate import METRICS

    grouped = v.by is not None
    table = Table(title=f"replay validate: {v.outdir}", title_justify="left")
    for col in ["metric"] + ([v.by] if grouped else []) + ["n", "measured mean", "predicted mean", "MAPE", "bias",
                                                            "|err| p50", "|err| p90"]:
        table.add_column(col, justify="left" if col in ("metric", v.by) else "right")
    for s in v.summary:
        u = "count" if s["metric"] == "cached_tokens" else "ms"
        label, unit = METRICS[s["metric"]]
        table.add_row(f"{label} ({unit})", *([str(s["grp"])] if grouped else []), num(s["requests"], "count"),
                      num(s["measured_mean"], u), num(s["predicted_mean"], u),
                      "-" if s["mape_pct"] is None else f"{s['mape_pct']:.1f}%", num(s["bias"], u),
                      num(s["abs_error_p50"], u), num(s["abs_error_p90"], u))
    return table


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate(
        outdir: Path = typer.Argument(..., help="Replay output directory (from `replay run`)."),
        measured: Path | None = typer.Option(None, "--measured", "-m",
                                             help="Log with the measurements (default: the run's own trace)."),
        format: str | None = typer.Option(None, "--format", "-f", help="Format of --measured when not detected."),
        by: str | None = typer.Option(None, "--by", help="Group every metric by a label: model, tenant, "
                                                         "request_type or priority."),
        output: Path = typer.Option(Path("validate.md"), "-o", "--output",
                                    help="Markdown file to write; charts go to <stem>_files/ beside it."),
        charts: bool = typer.Option(True, "--charts/--no-charts", help="Draw the scatter and error-CDF charts."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write the figures as JSON here."),
    ) -> None:
        """Per request predicted minus measured TTFT, TPOT, E2E and cached tokens: MAPE, bias, p50/p90 error."""
        with user_errors():
            from replay.reports.validate_render import conditions_lines, coverage_line
            from replay.reports.validate_report import write_validation

            result = write_validation(outdir, output, measured=measured, by=by, charts=charts, json_path=json_out,
                                      ingest_options={"format": format} if format else None)
        v = result.validation
        console.print(_table(v))
        console.print(coverage_line(v), highlight=False)
        for line in conditions_lines(v):
            if line:
                console.print(line.replace("**", ""), highlight=False)
        console.print(f"wrote [bold]{result.markdown}[/]" + (f" and {len(result.charts)} charts" if result.charts else ""))

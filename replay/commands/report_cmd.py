"""``replay report OUTDIR -o report.md``: markdown with charts for one replay."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from replay.commands._common import console, user_errors


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        outdir: Path = typer.Argument(..., help="Replay output directory (from `replay run`) or sweep directory (`replay sweep`/`plan`)."),
        output: Path = typer.Option(Path("report.md"), "-o", "--output",
                                    help="Markdown file to write; charts go to <stem>_files/ beside it."),
        slo: list[str] | None = typer.Option(None, "--slo", help="Goodput SLOs in ms, e.g. ttft=500,tpot=50 (keys ttft, tpot, e2e; "
                                                                 "repeat --slo or separate with commas)."),
        charts: bool = typer.Option(True, "--charts/--no-charts", help="Draw the PNG charts."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write every metric as JSON here."),
        by: str | None = typer.Option(None, "--by", help="Also group the metrics by a trace label: model, tenant, "
                                                         "request_type, source_run or priority."),
    ) -> None:
        """Summarize one replay (or a sweep directory: ranked configs, best per SLO, Pareto chart)."""
        from replay.reports.sweep_views import is_sweep_dir

        if is_sweep_dir(outdir):
            with user_errors():
                from replay.reports.sweep_report import write_sweep_report

                done = write_sweep_report(outdir, output, charts=charts)
            console.print(f"wrote [bold]{done.markdown}[/] ({done.rows} configs, {len(done.charts)} charts)")
            return
        with user_errors():
            from replay.reports.report import write_report
            from replay.reports.slo import parse_slo

            result = write_report(outdir, output, slo=parse_slo(slo), charts=charts, json_path=json_out, by=by)
        console.print(f"wrote [bold]{escape(str(result.markdown))}[/]" + (f" and {len(result.charts)} charts in "
                                                           f"{next(iter(result.charts.values())).parent}"
                                                           if result.charts else ""))
        for w in result.metrics.warnings:
            console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)

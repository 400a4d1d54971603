"""``replay report``: one run -> markdown + PNG charts (+ optional metrics JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from replay.base.atomic import atomic_dir, write_json_atomic, write_text_atomic
from replay.reports.charts import report_charts
from replay.reports.metrics import RunMetrics, compute
from replay.reports.render import render_report
from replay.reports.report_files import charts_dir_for, check_report_outputs, run_files
from replay.reports.slo import Slo
from replay.reports.validate_report import validation_appendix
from replay.reports.views import open_run


@dataclass
class ReportResult:
    markdown: Path
    charts: dict[str, Path]
    metrics: RunMetrics


def write_report(outdir: str | Path, markdown: str | Path, *, slo: Slo | None = None, charts: bool = True,
                 json_path: str | Path | None = None, by: str | None = None) -> ReportResult:
    outdir, markdown = Path(outdir), Path(markdown)
    run = open_run(outdir)
    # Every output is checked before anything is written: no output may be one of the run's files.
    inputs = run_files(outdir) + [run.trace_path]
    try:
        check_report_outputs(markdown, json_path, charts, inputs, [outdir, run.trace_path])
        metrics = compute(run, slo)
    finally:
        run.con.close()
    appendix = validation_appendix(outdir, run.trace_path, by)  # per-label table, predicted vs measured (reports/validate.py)
    chart_paths: dict[str, Path] = {}
    rel: dict[str, str] = {}
    if charts:
        final_dir = charts_dir_for(markdown)
        with atomic_dir(final_dir, inputs=[outdir, run.trace_path], kind="report charts") as tmp:
            with_cpu = bool((run.info.get("config") or {}).get("host_offload")) or bool(metrics.steps["cpu_usage_max"])
            made = report_charts(tmp, metrics, with_cpu=with_cpu)
        chart_paths = {k: final_dir / p.name for k, p in made.items()}
        rel = {k: f"{final_dir.name}/{p.name}" for k, p in made.items()}
    write_text_atomic(markdown, render_report(metrics, run.info, outdir, rel) + appendix, inputs)
    if json_path is not None:
        write_json_atomic(json_path, metrics.to_json(), inputs)
    return ReportResult(markdown=markdown, charts=chart_paths, metrics=metrics)

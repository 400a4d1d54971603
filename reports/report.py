"""``replay report``: one run -> markdown + PNG charts (+ optional metrics JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.output_schema import CHUNKS_FILE, REQUESTS_FILE, RUN_FILE, STEPS_FILE
from replay.atomic import (
    atomic_dir,
    check_output_dir,
    check_output_file,
    write_json_atomic,
    write_text_atomic,
)
from reports.charts import report_charts
from reports.metrics import RunMetrics, compute
from reports.render import render_report
from reports.slo import Slo
from reports.validate import validation_appendix
from reports.views import open_run


def charts_dir_for(markdown: Path) -> Path:
    """Charts live beside the markdown, in ``<stem>_files/`` (as pandoc and Jupyter do)."""
    return markdown.parent / f"{markdown.stem}_files"


def run_files(outdir: Path) -> list[Path]:
    """The files of a replay output a report reads: no report output may land on one of them."""
    return [outdir / f for f in (RUN_FILE, REQUESTS_FILE, CHUNKS_FILE, STEPS_FILE)]


def check_report_outputs(markdown: Path, json_path: str | Path | None, charts: bool, inputs: list,
                         input_dirs: list) -> None:
    """Refuse before writing anything: an output onto an input, a markdown path that is a directory,
    a charts directory that is not ours to replace."""
    for path in (markdown, json_path):
        if path is not None:
            check_output_file(path, inputs)
    if charts:
        check_output_dir(charts_dir_for(markdown), inputs=input_dirs)


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
    appendix = validation_appendix(outdir, by)  # per-label table, predicted vs measured (reports/validate.py)
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

"""``replay validate``'s outputs and ``replay report``'s validation appendix: what validate.py computes,
written as markdown, charts and JSON."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.base.atomic import atomic_dir, check_output_file, write_json_atomic, write_text_atomic
from replay.base.errors import ReplayError
from replay.reports.report_files import charts_dir_for, check_report_outputs, run_files
from replay.reports.validate import Validation, compute_validation, has_measurements, label_groups
from replay.reports.validate_charts import validation_charts
from replay.reports.validate_render import labels_section, render_validation, validation_section
from replay.reports.views import open_run


@dataclass
class ValidationOutput:
    markdown: Path | None
    charts: dict[str, Path]
    validation: Validation


def write_validation(outdir: str | Path, markdown: str | Path | None, *, measured: str | Path | None = None,
                     by: str | None = None, charts: bool = True, json_path: str | Path | None = None,
                     ingest_options: dict[str, Any] | None = None) -> ValidationOutput:
    """Compute the validation and write what was asked for, atomically: markdown (+ PNG charts in
    ``<stem>_files/``) only when ``markdown`` is given, JSON only when ``json_path`` is; nothing
    otherwise (the command prints its tables and charts to the terminal).

    Every output is checked before anything is computed or written: none may be one of the inputs."""
    outdir = Path(outdir)
    markdown = None if markdown is None else Path(markdown)
    run = open_run(outdir)
    run.con.close()
    inputs = run_files(outdir) + [run.trace_path, measured]
    if markdown is not None:
        check_report_outputs(markdown, json_path, charts, inputs, [outdir, run.trace_path, measured])
    elif json_path is not None:
        check_output_file(json_path, inputs)
    v = compute_validation(outdir, measured=measured, by=by, ingest_options=ingest_options)
    paths: dict[str, Path] = {}
    rel: dict[str, str] = {}
    if markdown is not None and charts and v.samples:
        final_dir = charts_dir_for(markdown)
        with atomic_dir(final_dir, inputs=[outdir, run.trace_path, measured], kind="validate charts") as tmp:
            made = validation_charts(tmp, v)
        paths = {k: final_dir / p.name for k, p in made.items()}
        rel = {k: f"{final_dir.name}/{p.name}" for k, p in made.items()}
    if markdown is not None:
        write_text_atomic(markdown, render_validation(v, rel) + "\n", inputs)
    if json_path is not None:
        write_json_atomic(json_path, v.to_json(), inputs)
    return ValidationOutput(markdown=markdown, charts=paths, validation=v)


def validation_appendix(outdir: str | Path, trace_path: Path | None, by: str | None = None) -> str:
    """``replay report``'s extra sections: metrics per label (``by``) and, when the run's trace
    (``trace_path``, as ``open_run`` found it) carries measured columns, predictions against them ("" when
    neither applies). Tables only; ``replay validate`` draws the charts."""
    out: list[str] = []
    if by is not None:
        out += ["", *labels_section(by, label_groups(outdir, by))]
    if has_measurements(trace_path):
        try:
            v = compute_validation(outdir, by=by)
        except ReplayError as exc:  # e.g. no request matched: say so rather than fail the whole report
            return "\n".join(out + ["", "## Predicted vs measured", "", f"Not computed: {exc}", ""])
        out += ["", *validation_section(v, {}), "Charts: `replay validate " + str(outdir) + "`.", ""]
    return "\n".join(out)

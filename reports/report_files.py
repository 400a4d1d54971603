"""Which files a report reads and writes: a report's outputs never land on the run it reads, and its
charts live beside the markdown. Shared by every report writer (run, sweep, validation)."""

from __future__ import annotations

from pathlib import Path

from replay.base.atomic import check_output_dir, check_output_file
from replay.engine.output_schema import CHUNKS_FILE, REQUESTS_FILE, RUN_FILE, STEPS_FILE
from replay.engine.scaling_output import SCALING_FILE


def charts_dir_for(markdown: Path) -> Path:
    """Charts live beside the markdown, in ``<stem>_files/`` (as pandoc and Jupyter do)."""
    return markdown.parent / f"{markdown.stem}_files"


def run_files(outdir: Path) -> list[Path]:
    """The files of a replay output a report reads: no report output may land on one of them."""
    return [outdir / f for f in (RUN_FILE, REQUESTS_FILE, CHUNKS_FILE, STEPS_FILE, SCALING_FILE)]


def check_report_outputs(markdown: Path, json_path: str | Path | None, charts: bool, inputs: list,
                         input_dirs: list) -> None:
    """Refuse before writing anything: an output onto an input, a markdown path that is a directory,
    a charts directory that is not ours to replace."""
    for path in (markdown, json_path):
        if path is not None:
            check_output_file(path, inputs)
    if charts:
        check_output_dir(charts_dir_for(markdown), inputs=input_dirs)

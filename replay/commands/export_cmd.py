"""``replay export OUTDIR --format vllm-bench|aiperf|guidellm -o FILE``: results in a benchmark tool's shape."""

from __future__ import annotations

from pathlib import Path

import typer

from replay.commands._common import console, user_errors


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export(
        outdir: Path = typer.Argument(..., help="Replay output directory (from `replay run`)."),
        format: str = typer.Option(..., "--format", "-f", help="vllm-bench (vllm bench serve --save-detailed JSON), "
                                                               "aiperf (profile_export.jsonl) or guidellm "
                                                               "(benchmarks.json)."),
        output: Path = typer.Option(..., "-o", "--output", help="File to write."),
    ) -> None:
        """Write a replay's per-request results as vllm bench, aiperf or GuideLLM would, to compare in those tools."""
        with user_errors():
            from replay.reports.export import export as do_export

            dest = do_export(outdir, format, output)
        console.print(f"wrote [bold]{dest}[/] ({format})")

"""``replay ingest``: any supported trace file -> one canonical, validated Parquet trace."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from replay.commands._common import console, err_console, user_errors
from replay.ingest.formats import format_help


def register(app: typer.Typer) -> None:
    @app.command("ingest")
    def ingest(
        source: Path = typer.Argument(..., help="Trace file: a public trace (Mooncake, Bailian, Azure, BurstGPT), a "
                                                "benchmark export or gateway log (docs/trace-schema.md), or generic "
                                                "CSV/JSONL with --map."),
        output: Path = typer.Option(None, "--output", "-o", help="Canonical Parquet trace to write "
                                                                 "(default: ./<source name>.parquet)."),
        format: str = typer.Option(None, "--format", "-f", help=format_help()),
        block_size: int = typer.Option(None, "--block-size", help="Tokens per hash id (mooncake 512, bailian 16, "
                                                                  "requests 16 by default)."),
        on_error: str = typer.Option("fail", "--on-error", help="fail: stop at the first bad row, write nothing; "
                                                                "skip: write good rows, list bad ones in a side file."),
        time_unit: str = typer.Option(None, "--time-unit", help="s, ms, us, ns or iso (generic formats; request logs)."),
        map_: list[str] = typer.Option(None, "--map", help="CANONICAL=SOURCE column mapping (generic csv/jsonl), "
                                                           "repeatable: --map arrival=ts --map input_tokens=n_in"),
        tokenizer: str = typer.Option(None, "--tokenizer", help="HF tokenizer.json for text prompts "
                                                                "(default: byte-level fallback)."),
        drop_failed: bool = typer.Option(False, "--drop-failed", help="Drop and count failed requests (a format's "
                                                                      "error marker, or zero output tokens) instead "
                                                                      "of rejecting them."),
        where: list[str] = typer.Option(None, "--where", help="LABEL=VALUE: keep only those rows, e.g. one "
                                                              "benchmark of a GuideLLM sweep: "
                                                              "--where source_run=constant@4.00 (repeatable)."),
    ) -> None:
        """Convert a trace to the canonical Parquet schema (docs/trace-schema.md), validating every row."""
        from replay.ingest.api import convert
        from replay.ingest.options import parse_map_flags, parse_where_flags

        with user_errors():
            dest = output or Path(source.name.split(".")[0] + ".parquet")
            result = convert(source, dest, format=format, block_size=block_size, on_error=on_error,
                             time_unit=time_unit, mapping=parse_map_flags(map_ or []), tokenizer=tokenizer,
                             drop_failed=drop_failed, where=parse_where_flags(where or []))
        meta = result.metadata
        table = Table(title=f"ingested {source.name} -> {dest}", show_header=False)
        table.add_row("format", meta.source_format)
        table.add_row("rows written", f"{result.rows_written:,}")
        table.add_row("rows rejected", f"{result.rows_rejected:,}")
        table.add_row("rows re-sorted", f"{result.rows_resorted:,}")
        if result.skipped:
            table.add_row("records skipped", f"{sum(result.skipped.values()):,} (not requests; see warning)")
        if result.rows_dropped:
            table.add_row("rows dropped (failed)", f"{result.rows_dropped:,}")
        table.add_row("hash block size", str(meta.hash_block_size) if meta.hash_block_size else "-")
        table.add_row("prefix identity", meta.prefix_identity)
        table.add_row("start time", meta.start_time or "-")
        if meta.tokenizer:
            table.add_row("tokenizer", meta.tokenizer)
        console.print(table)
        for warning in result.warnings:
            err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
        if result.side_file:
            err_console.print(f"rejected rows and reasons: {escape(str(result.side_file))}", highlight=False)

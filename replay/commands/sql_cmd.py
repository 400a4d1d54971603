"""``replay sql OUTDIR "SELECT ..."``: ad-hoc DuckDB queries over a replay's views."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from replay.base.errors import ReplayError
from replay.commands._common import console, user_errors

VIEWS_HELP = ("One SELECT; it can read the run's files only (docs/reports.md). Views: requests, chunks, steps (the "
              "replay output), chunk_runs (chunks as stored: runs of steps), trace (the replayed trace), itl_gaps "
              "(one ITL sample per chunk), itl_counts (ITL samples per value), run_window (the measured window), "
              "scaling (autoscaler decisions, when the run has them). On a sweep directory: sweep, plan, and "
              "requests/steps across runs with a config column.")


def register(app: typer.Typer) -> None:
    @app.command("sql", help="Run a DuckDB SQL query over a replay output. " + VIEWS_HELP)
    def sql_command(
        outdir: Path = typer.Argument(..., help="Replay output directory."),
        query: str = typer.Argument(..., help='SQL, e.g. "SELECT status, count(*) FROM requests GROUP BY ALL".'),
        csv: bool = typer.Option(False, "--csv", help="Print CSV (all rows) instead of a table."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON records (all rows) instead of a table."),
        max_rows: int = typer.Option(50, "--max-rows", min=1, help="Rows shown in the table (CSV/JSON print all)."),
    ) -> None:
        with user_errors():
            from replay.reports.adhoc import stream_query
            from replay.reports.sweep_views import is_sweep_dir, open_sweep
            from replay.reports.views import open_run

            if csv and as_json:
                raise ReplayError("choose one of --csv and --json")
            run = open_sweep(outdir) if is_sweep_dir(outdir) else open_run(outdir)
            try:  # the result streams piece by piece: memory stays bounded whatever its size
                if csv or as_json:
                    stream_query(run, query, _write_csv if csv else _write_json)
                    return
                frame, total = stream_query(run, query, lambda next_piece: _head(next_piece, max_rows))
            finally:
                run.con.close()
        table = Table(show_lines=False)
        for col in frame.columns:
            table.add_column(escape(str(col)), justify="right" if frame[col].dtype.kind in "iuf" else "left")
        for row in frame.head(max_rows).itertuples(index=False):
            table.add_row(*("NULL" if _isnull(v) else f"{v:.6g}" if isinstance(v, float) else escape(str(v)) for v in row))
        console.print(table)
        if total > max_rows:
            console.print(f"[dim]{total - max_rows:,} more rows (use --max-rows, --csv or --json)[/]")


def _write_csv(next_piece) -> None:
    piece = next_piece()
    piece.to_csv(sys.stdout, index=False)  # the header, even for no rows
    while len(piece):
        piece = next_piece()
        piece.to_csv(sys.stdout, index=False, header=False)


def _write_json(next_piece) -> None:
    """One JSON array of records, written piece by piece (the bytes pandas writes for the whole)."""
    sys.stdout.write("[")
    first = True
    while len(piece := next_piece()):
        sys.stdout.write(("" if first else ",") + piece.to_json(orient="records", date_format="iso")[1:-1])
        first = False
    sys.stdout.write("]\n")


def _head(next_piece, rows: int):
    """The first ``rows`` rows, and how many rows there are in all (the rest is counted, not kept)."""
    import pandas as pd

    pieces = [next_piece()]
    total = len(pieces[0])
    while len(pieces[-1]) and total <= rows:
        pieces.append(next_piece())
        total += len(pieces[-1])
    head = pd.concat(pieces, ignore_index=True) if len(pieces) > 1 else pieces[0]
    while len(pieces[-1]):
        pieces = [next_piece()]
        total += len(pieces[0])
    return head.head(rows), total


def _isnull(value) -> bool:
    try:
        return value is None or bool(value != value)
    except (TypeError, ValueError):  # lists and arrays: never null here
        return False

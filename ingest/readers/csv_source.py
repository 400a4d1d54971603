"""Reading CSV by column name with pyarrow's streaming reader (bounded memory, no per-row Python).

Every needed column is read as a string and converted with the vectorised parsers in
``replay.ingest.columns``, so a bad value becomes a row-level rejection instead of aborting the file.
Rows with the wrong number of fields are caught by pyarrow's invalid-row handler. Line numbers are
worked out (by a Python pass over the file) only when there is a problem to report.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv

from replay.base.errors import TraceError

from ..rejections import Rejection
from .base import record_indices
from .decoding import open_binary

_BLOCK = 4 << 20


def read_header(path: Path) -> list[str]:
    """Column names of a CSV file (BOM and CRLF tolerated; spaces around a name are not part of it)."""
    return [c.strip() for c in _raw_header(path)]


def _raw_header(path: Path) -> list[str]:
    """The header's fields as written (a spreadsheet export may pad them: ``TIMESTAMP, ContextTokens``)."""
    with open_binary(path) as fh:
        text = io.TextIOWrapper(fh, encoding="utf-8-sig", newline="")
        for row in csv.reader(text):
            if row:
                return row
    raise TraceError("empty CSV file (no header)", path=str(path))


class CsvSource:
    """String-typed tables of the wanted columns, with record indices and shape rejections."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = Path(path)
        raw = _raw_header(self.path)
        self.header = [c.strip() for c in raw]
        missing = [c for c in columns if c not in self.header]
        if missing:
            raise TraceError(f"missing column(s) {missing}; the header has {self.header}",
                             path=str(self.path), line=1, field=missing[0])
        twice = [c for c in columns if self.header.count(c) > 1]
        if twice:
            raise TraceError(f"column {twice[0]!r} appears {self.header.count(twice[0])} times in the header: "
                             "which one holds the values is ambiguous", path=str(self.path), line=1, field=twice[0])
        self.columns = columns
        # pyarrow selects columns by the names as written: a wanted name's first padded spelling.
        as_written = {}
        for name, written in zip(self.header, raw):
            as_written.setdefault(name, written)
        self._raw_columns = [as_written[c] for c in columns]
        self._valid_lines: list[int] | None = None
        self._invalid_lines: list[int] | None = None
        self._invalid_seen = 0

    def tables(self) -> Iterator[tuple[pa.Table, pa.Array, list[Rejection]]]:
        invalid: list[Rejection] = []

        def on_invalid(row: pcsv.InvalidRow) -> str:
            invalid.append(Rejection(-1, "<row>", f"expected {row.expected_columns} fields, got {row.actual_columns}",
                                     None, {"text": (row.text or "")[:200]}))
            return "skip"

        convert = pcsv.ConvertOptions(column_types={c: pa.string() for c in self._raw_columns},
                                      include_columns=self._raw_columns, null_values=[""],
                                      strings_can_be_null=True, quoted_strings_can_be_null=True)
        try:
            reader = pcsv.open_csv(
                pa.input_stream(str(self.path), compression="detect"),
                read_options=pcsv.ReadOptions(block_size=_BLOCK, use_threads=True),
                parse_options=pcsv.ParseOptions(invalid_row_handler=on_invalid),
                convert_options=convert,
            )
        except pa.ArrowInvalid as exc:  # a header without its newline: no rows, as with the newline
            if "Empty CSV file or block" not in str(exc):
                raise
            return
        delivered = 0
        for batch in reader:
            rows = record_indices(delivered, batch.num_rows)
            delivered += batch.num_rows
            rej, invalid[:] = list(invalid), []
            for r in rej:
                r.line = self._next_invalid_line()
            yield pa.Table.from_batches([batch]).rename_columns(self.columns), rows, rej
        if invalid:
            for r in invalid:
                r.line = self._next_invalid_line()
            yield pa.table({c: pa.array([], pa.string()) for c in self.columns}), pa.array([], pa.int64()), invalid

    def _scan(self) -> None:
        valid: list[int] = []
        bad: list[int] = []
        with open_binary(self.path) as fh:
            text = io.TextIOWrapper(fh, encoding="utf-8-sig", newline="")
            reader = csv.reader(text)
            start = 1
            header_seen = False
            for row in reader:
                line = start
                start = reader.line_num + 1
                if not row:  # pyarrow skips only empty lines: a line of spaces is a row of one field
                    continue
                if not header_seen:
                    header_seen = True
                    continue
                (valid if len(row) == len(self.header) else bad).append(line)
        self._valid_lines, self._invalid_lines = valid, bad

    def _next_invalid_line(self) -> int | None:
        if self._invalid_lines is None:
            self._scan()
        assert self._invalid_lines is not None
        i = self._invalid_seen
        self._invalid_seen += 1
        return self._invalid_lines[i] if i < len(self._invalid_lines) else None

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        if self._valid_lines is None:
            self._scan()
        assert self._valid_lines is not None
        n = len(self._valid_lines)
        return {r: (self._valid_lines[r] if 0 <= r < n else None) for r in rows}

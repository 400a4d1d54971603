"""Reading JSON Lines: pyarrow's vectorised reader first, a per-line Python reader for bad files.

The fast path handles well-formed files at pyarrow speed. When pyarrow rejects the file (a bad
line, a value of the wrong type, an id outside uint64), reading restarts in Python from the first
record not yet delivered, so every problem is reported with its exact line and field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pj

from replay.base.errors import TraceError

from ..rejections import Rejection
from .base import record_indices
from .decoding import field_with_bad_utf8, open_binary

_U64_MAX = 2**64 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
_PY_BATCH = 65_536
# An object closing and another opening on the same line: the sign of two objects on one line.
_TWO_OBJECTS = re.compile(rb"\}[ \t]*\{")
_FAST_BLOCK = 8 << 20


def json_objects(path: Path, skip: int = 0) -> Iterator[tuple[int, int, dict | None, Rejection | None]]:
    """(record index, line number, object, None) for each JSON object line from record ``skip`` on,
    or (record, line, None, rejection) for a line that is not valid JSON or not an object.

    Blank lines are not records.
    """
    record = -1
    with open_binary(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            record += 1
            if record < skip:
                continue
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield record, lineno, None, Rejection(
                    record, field_with_bad_utf8(raw) or "<json>",
                    f"invalid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})", lineno,
                    {"text": raw.decode("utf-8", "replace")[:200]})
                continue
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                yield record, lineno, None, Rejection(record, "<json>", f"invalid JSON: {exc}", lineno,
                                                      {"text": raw.decode("utf-8", "replace")[:200]})
                continue
            if not isinstance(obj, dict):
                yield record, lineno, None, Rejection(record, "<json>", "line is not a JSON object", lineno,
                                                      {"text": raw.decode("utf-8", "replace")[:200]})
                continue
            yield record, lineno, obj, None


def first_record(path: Path) -> dict[str, Any] | None:
    """The first non-blank line parsed as JSON, or None (used by format detection). Lines may end
    in a bare carriage return, which pyarrow's reader also takes as a line end (JSON text cannot
    hold a raw one)."""
    with open_binary(path) as fh:
        for line in fh:
            raw = next((part for part in line.split(b"\r") if part.strip()), b"")
            if raw.strip():
                raw.decode("utf-8")  # UnicodeDecodeError: the caller names the line (readers.decoding)
                try:
                    obj = json.loads(raw)
                except ValueError:
                    return None
                return obj if isinstance(obj, dict) else None
    return None


def _coerce(value: Any, typ: pa.DataType) -> tuple[Any, str | None]:
    """A JSON value coerced to the staged Python type, or an error reason."""
    if value is None:
        return None, None
    if pa.types.is_string(typ):
        if isinstance(value, str):
            return value, None
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value), None
        return None, f"expected a string, got {json.dumps(value)[:60]}"
    if pa.types.is_integer(typ):
        if isinstance(value, bool):
            return None, f"not an integer: {value!r}"
        if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
            value = int(value)
        if not isinstance(value, int):
            return None, f"not an integer: {json.dumps(value)[:60]}"
        if not I64_MIN <= value <= I64_MAX:
            return None, f"{value} is out of range"
        return value, None
    if pa.types.is_floating(typ):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, f"not a number: {json.dumps(value)[:60]}"
        if isinstance(value, float) and value != value:  # JSON's non-standard NaN: not a missing value
            return None, "not a finite number: NaN"
        return float(value), None
    if pa.types.is_struct(typ):  # a nested object read through a dotted --map path
        if not isinstance(value, dict):
            return None, f"expected an object, got {json.dumps(value)[:60]}"
        out = {}
        for child in typ:
            out[child.name], reason = _coerce(value.get(child.name), child.type)
            if reason is not None:
                return None, f"{child.name}: {reason}"
        return out, None
    if pa.types.is_list(typ) and pa.types.is_floating(typ.value_type):
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int | float) for v in value):
            return None, f"expected a list of numbers, got {json.dumps(value)[:60]}"
        return [float(v) for v in value], None
    if pa.types.is_list(typ):
        if not isinstance(value, list):
            return None, f"expected a list of ids, got {json.dumps(value)[:60]}"
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int):
                return None, f"hash id is not an integer: {json.dumps(item)[:60]}"
            if not 0 <= item <= _U64_MAX:
                return None, f"hash id {item} is outside uint64 (0 .. 2^64-1)"
        return value, None
    raise TypeError(typ)


def _utf8_checked(table: pa.Table) -> pa.Table:
    """pyarrow's JSON reader copies string bytes unchecked: invalid UTF-8 raises ArrowInvalid here, so
    the per-line reader takes over and names the line and field."""
    for col in table.columns:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col.validate(full=True)
    return table


def _objects_in(raw: bytes) -> int:
    """How many JSON values follow one another on a line (1 when it does not parse as such)."""
    decoder = json.JSONDecoder()
    text = raw.decode("utf-8", "replace").strip()
    count, pos = 0, 0
    while pos < len(text):
        try:
            _, end = decoder.raw_decode(text, pos)
        except ValueError:
            return max(count, 1)
        count += 1
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return max(count, 1)


class JsonlSource:
    """Raw tables (source field names, typed by ``schema``) plus ``_row``/``_line`` and rejections."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = Path(path)
        self.schema = schema
        self._lines: list[int] | None = None

    def tables(self) -> Iterator[tuple[pa.Table, pa.Array, list[Rejection], pa.Array | None]]:
        """Yield ``(table, record indices, rejections, lines)``; ``lines`` is None on the fast path."""
        delivered = 0
        try:
            for table in self._fast():
                yield table, record_indices(delivered, table.num_rows), [], None
                delivered += table.num_rows
            self._check_one_object_per_line()
            return
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            pass
        yield from self._python(skip=delivered)

    def _fast(self) -> Iterator[pa.Table]:
        parse = pj.ParseOptions(explicit_schema=self.schema, unexpected_field_behavior="ignore",
                                newlines_in_values=False)
        read = pj.ReadOptions(block_size=_FAST_BLOCK, use_threads=True)
        stream = pa.input_stream(str(self.path), compression="detect")
        if hasattr(pj, "open_json"):
            reader = pj.open_json(stream, read_options=read, parse_options=parse)
            for batch in reader:
                if batch.num_rows:
                    yield _utf8_checked(pa.Table.from_batches([batch]).select(self.schema.names))
        else:  # pragma: no cover - pyarrow < 19
            yield _utf8_checked(pj.read_json(stream, read_options=read, parse_options=parse).select(self.schema.names))

    def _check_one_object_per_line(self) -> None:
        """pyarrow reads a line holding two JSON objects as two records, and every line number after
        it would then be off by one: refuse such a file, naming the line. An object closing and the
        next opening on one line (``}{``, ``} {``) is the sign, searched in C; each line is parsed
        only when it appears (in a string it is not one)."""
        tail = b""
        with open_binary(self.path) as fh:
            while chunk := fh.read(1 << 24):
                if _TWO_OBJECTS.search(tail + chunk):
                    break
                tail = chunk[-64:]
            else:
                return
        with open_binary(self.path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                if _TWO_OBJECTS.search(raw) and _objects_in(raw) > 1:
                    raise TraceError("the line holds more than one JSON object (JSON Lines has one per line)",
                                     path=str(self.path), line=lineno)

    def _python(self, skip: int) -> Iterator[tuple[pa.Table, pa.Array, list[Rejection], pa.Array | None]]:
        names = self.schema.names
        types = [self.schema.field(n).type for n in names]
        cols: list[list[Any]] = [[] for _ in names]
        lines: list[int] = []
        rows: list[int] = []
        rejections: list[Rejection] = []
        for record, lineno, obj, rejection in json_objects(self.path, skip):
            if rejection is not None:
                rejections.append(rejection)
                continue
            values = []
            bad = False
            for name, typ in zip(names, types, strict=True):
                value, reason = _coerce(obj.get(name), typ)
                if reason is not None:
                    rejections.append(Rejection(record, name, reason, lineno, obj))
                    bad = True
                    break
                values.append(value)
            if bad:
                continue
            for col, value in zip(cols, values, strict=True):
                col.append(value)
            lines.append(lineno)
            rows.append(record)
            if len(lines) >= _PY_BATCH:
                yield (self._table(cols, types), pa.array(rows, pa.int64()), rejections,
                       pa.array(lines, pa.int64()))
                cols, lines, rows, rejections = [[] for _ in names], [], [], []
        if lines or rejections:
            yield self._table(cols, types), pa.array(rows, pa.int64()), rejections, pa.array(lines, pa.int64())

    def _table(self, cols: list[list[Any]], types: list[pa.DataType]) -> pa.Table:
        return pa.table({n: pa.array(c, t) for n, c, t in zip(self.schema.names, cols, types, strict=True)})

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        """Map record indices to line numbers (blank lines are not records)."""
        if self._lines is None:
            self._lines = []
            with open_binary(self.path) as fh:
                for lineno, raw in enumerate(fh, start=1):
                    if raw.strip():
                        # pyarrow's fast path reads each object of a line holding several as a record
                        count = _objects_in(raw) if _TWO_OBJECTS.search(raw) else 1
                        self._lines.extend([lineno] * count)
        return {r: (self._lines[r] if 0 <= r < len(self._lines) else None) for r in rows}

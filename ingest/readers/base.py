"""What every reader produces: staged batches in one intermediate shape, plus provenance.

A reader only parses. It turns its source into *staged* tables (the columns below, any of which may
be missing) and reports values it could not parse as ``Rejection``s; validation, ordering and
writing are shared (``replay.ingest.pipeline``), so every format gets the same rules and error wording.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..options import IngestOptions
from ..rejections import Rejection
from ..schema import OPTIONAL_SCHEMA

# Staged columns: ``t_ms`` is the arrival in ms (from trace start, or epoch ms for wall clocks);
# ``_row`` is the 0-based record index in the source and ``_line`` its file line when known.
STAGED_TYPES: dict[str, pa.DataType] = {
    "request_id": pa.string(),
    "t_ms": pa.int64(),
    "input_tokens": pa.int64(),
    "output_tokens": pa.int64(),
    "hash_ids": pa.list_(pa.uint64()),
    "session_id": pa.string(),
    "parent_id": pa.string(),
    "turn": pa.int64(),
    "delay_ms": pa.int64(),
    "priority": pa.int64(),
    "_row": pa.int64(),
    "_line": pa.int64(),
    # optional canonical columns (replay.ingest.schema.OPTIONAL_SCHEMA), staged in their canonical types
    **{f.name: f.type for f in OPTIONAL_SCHEMA},
}

Staged = tuple[pa.Table, list[Rejection]]


@dataclass
class ReaderInfo:
    """Provenance and handling rules a reader declares before reading."""

    source_format: str
    time_unit: str
    rebase: bool  # arrival = time - earliest time (absolute clocks); False: times are already from trace start
    wallclock: bool  # times are epoch ms, so the trace start is recorded as an ISO time
    hash_block_size: int | None
    prefix_identity: str  # real | synthesized | absent
    hash_ids_required: bool
    field_names: dict[str, str]  # staged column -> source field name, for error messages
    tokenizer: str | None = None
    generated_ids: bool = False  # request ids are record indices (cannot collide)
    sessions_from_parents: bool = False  # session = root of the parent chain (Bailian)
    notes: list[str] = field(default_factory=list)
    extra_columns: tuple[str, ...] = ()  # optional canonical columns this reader fills (measured_*, labels)
    source_run: dict | None = None  # how the source run was driven (load mode, rate, model), when known
    no_timestamps: bool = False  # the source has no arrival times (arrivals are 0: replay with a load mode)
    # How the source marks a failed request (its output length is then 0), for the zero-output
    # message: "status.code 2 (an error span)" tells an OTel user what BurstGPT's wording would not.
    failed_as: str = ""


class Reader:
    """Base class: subclasses set ``name`` and implement ``info``, ``batches`` and ``line_of``."""

    name: ClassVar[str] = ""
    # Which of the ingest options that shape reading (``time_unit``, ``block_size``, ``mapping``)
    # this format reads; ``make_reader`` refuses the others instead of ignoring them.
    options_read: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, path: Path, opts: IngestOptions) -> None:
        self.path = Path(path)
        self.opts = opts
        # Source records that are not requests, counted by reason (spans of other operations, a
        # benchmark's warm-up...): filled while ``batches`` runs, reported by the ingest, so that a
        # file read as "no rows" says what it skipped.
        self.skipped: dict[str, int] = {}
        # What the user must know about the file as a whole (a sampled report, prompt bodies that
        # could not be read): shown by ``replay ingest`` beside the skipped and rejected counts.
        self.warnings: list[str] = []

    def skip(self, reason: str, count: int = 1) -> None:
        """Count ``count`` source records left out for ``reason`` (not an error: not a request)."""
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def warn(self, text: str) -> None:
        """Say ``text`` once at the end of the ingest (the rows are still written)."""
        if text not in self.warnings:
            self.warnings.append(text)

    def info(self) -> ReaderInfo:
        raise NotImplementedError

    def batches(self) -> Iterator[Staged]:
        raise NotImplementedError

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        """File line numbers for record indices (only called when reporting problems)."""
        return {}


def record_indices(start: int, count: int) -> pa.Array:
    """The 0-based record indices ``start .. start + count - 1`` as int64, made by numpy: pyarrow
    converts a Python ``range`` element by element (0.11 s per million rows, against 2 ms)."""
    return pa.array(np.arange(start, start + count, dtype=np.int64))


def staged_table(columns: dict[str, pa.Array | None], rows: pa.Array, lines: pa.Array | None = None) -> pa.Table:
    """Assemble a staged table, casting each column to its staged type."""
    arrays: dict[str, pa.Array] = {}
    for name, arr in columns.items():
        if arr is None:
            continue
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        want = STAGED_TYPES[name]
        if arr.type != want:
            arr = arr.cast(want)
        arrays[name] = arr
    arrays["_row"] = rows.cast(pa.int64())
    if lines is not None:
        arrays["_line"] = lines.cast(pa.int64())
    return pa.table(arrays)


@dataclass(frozen=True)
class Col:
    """How to build one staged column: the source fields (first non-null wins) and their kind.

    ``kind`` is ``int``, ``float``, ``str``, ``ids`` (list of uint64) or ``time:<unit>`` (unit as in
    ``replay.ingest.columns.parse_time_ms``).
    """

    sources: tuple[str, ...]
    kind: str


def _coalesced(raw: pa.Table, sources: tuple[str, ...]) -> tuple[pa.Array | None, str]:
    present = [s for s in sources if s in raw.column_names]
    if not present:
        return None, sources[0]
    arrays = [raw.column(s).combine_chunks() for s in present]
    if len(arrays) == 1:
        return arrays[0], present[0]
    base_type = arrays[0].type
    arrays = [a if a.type == base_type else a.cast(base_type) for a in arrays]
    return pc.coalesce(*arrays), "/".join(present)


def stage(raw: pa.Table, rows: pa.Array, lines: pa.Array | None, spec: dict[str, Col],
          rejections: list[Rejection] | None = None, unit_given: bool = False) -> Staged:
    """Convert a raw source table to a staged one; rows with unparseable values become rejections.
    ``unit_given``: the time unit came from ``--time-unit`` (a contradicted unit is then the flag's)."""
    from ..columns import parse_float, parse_int, parse_time_ms

    rejections = list(rejections or [])
    cols: dict[str, pa.Array | None] = {}
    bad: dict[int, tuple[str, str]] = {}
    for name, col in spec.items():
        arr, field_name = _coalesced(raw, col.sources)
        if arr is None:
            continue
        if col.kind == "int":
            arr, problems = parse_int(arr)
        elif col.kind == "float":
            arr, problems = parse_float(arr)
        elif col.kind.startswith("time:"):
            arr, problems = parse_time_ms(arr, col.kind.split(":", 1)[1], unit_given=unit_given)
        elif col.kind == "str":
            if not pa.types.is_string(arr.type):
                arr = arr.cast(pa.string())
            problems = []
        elif col.kind in ("ids", "floats"):
            problems = []
        else:  # pragma: no cover - programming error
            raise ValueError(col.kind)
        for i, reason in problems:
            bad.setdefault(i, (field_name, reason))
        cols[name] = arr
    table = staged_table(cols, rows, lines)
    if bad:
        idx = sorted(bad)
        records = raw.take(pa.array(idx, pa.int64())).to_pylist()
        row_vals = rows.to_pylist()
        line_vals = lines.to_pylist() if lines is not None else None
        for i, record in zip(idx, records, strict=True):
            field_name, reason = bad[i]
            rejections.append(Rejection(row_vals[i], field_name, reason,
                                        line_vals[i] if line_vals is not None else None, record))
        keep = np.ones(table.num_rows, dtype=bool)
        keep[idx] = False
        table = table.filter(pa.array(keep))
    return table, rejections

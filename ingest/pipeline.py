"""The shared ingest pipeline: staged batches -> validated, session-aware canonical batches.

Per batch: the reader's parse rejections, the row rules (``replay.ingest.validate``), duplicate request
ids, session bookkeeping, then conversion to the canonical schema with arrivals from trace start.
State carried across batches is per request id / per session only, so memory stays bounded by
the number of sessions, not rows. Out-of-order rows are counted here and sorted at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.base.errors import TraceError

from .options import IngestOptions
from .readers.base import Reader, ReaderInfo
from .readers.decoding import guarded
from .rejections import Rejection, read_values
from .schema import LABEL_COLUMNS, TRACE_SCHEMA, trace_schema_for
from .validate import validate


@dataclass
class Progress:
    """Running totals of one ingest."""

    rows_read: int = 0
    rows_good: int = 0
    rows_dropped: int = 0
    rows_out_of_order: int = 0
    base_ms: int | None = None  # subtracted from every time: the first batch's earliest (every trace is rebased)
    min_t: int | None = None
    max_t: int | None = None
    rejections: list[Rejection] = field(default_factory=list)
    sessions_derived: bool = False


class _Sessions:
    """Per-session bookkeeping in file order: turn numbers, parents, closed-loop arrivals."""

    def __init__(self, from_parents: bool) -> None:
        self.from_parents = from_parents
        self.count: dict[str, int] = {}
        self.last_id: dict[str, str] = {}
        self.last_t: dict[str, int] = {}
        self.root: dict[str, str] = {}

    def apply(self, st: pa.Table, field_names: dict[str, str]) -> tuple[pa.Table, list[Rejection]]:
        n = st.num_rows
        rid = st.column("request_id").to_pylist()
        sess = st.column("session_id").to_pylist() if "session_id" in st.column_names else [None] * n
        parent = st.column("parent_id").to_pylist() if "parent_id" in st.column_names else [None] * n
        turn = st.column("turn").to_pylist() if "turn" in st.column_names else [None] * n
        t = st.column("t_ms").to_pylist() if "t_ms" in st.column_names else [None] * n
        delay = st.column("delay_ms").to_pylist() if "delay_ms" in st.column_names else [None] * n
        rows = st.column("_row").to_pylist()
        bad: dict[int, str] = {}
        for i in range(n):
            if self.from_parents:
                p = parent[i]
                root = self.root.get(p, p) if p is not None else rid[i]
                self.root[rid[i]] = root
                if sess[i] is None:
                    sess[i] = root
                continue
            s = sess[i]
            if s is None:
                continue
            k = self.count.get(s, 0) + 1
            self.count[s] = k
            if turn[i] is None:
                turn[i] = k
            if parent[i] is None and s in self.last_id:
                parent[i] = self.last_id[s]
            if t[i] is None:
                if s in self.last_t and delay[i] is not None:
                    t[i] = self.last_t[s] + delay[i]
                else:
                    bad[i] = "missing timestamp: a row with only a delay must follow an earlier turn of its session"
            self.last_id[s] = rid[i]
            if t[i] is not None:
                self.last_t[s] = t[i]
        out = st
        for name, values, typ in (("session_id", sess, pa.string()), ("parent_id", parent, pa.string()),
                                  ("turn", turn, pa.int64()), ("t_ms", t, pa.int64())):
            arr = pa.array(values, typ)
            if name in out.column_names:
                out = out.set_column(out.column_names.index(name), name, arr)
            else:
                out = out.append_column(name, arr)
        rejections = []
        if bad:
            idx = sorted(bad)
            recs = st.take(pa.array(idx, pa.int64())).to_pylist()
            for i, rec in zip(idx, recs, strict=True):
                rejections.append(Rejection(rows[i], field_names.get("t_ms", "timestamp"), bad[i],
                                            rec.pop("_line", None), read_values(rec)))
            keep = np.ones(n, dtype=bool)
            keep[idx] = False
            out = out.filter(pa.array(keep))
        return out, rejections


class _Dedupe:
    """Rejects a request id seen earlier in the file (the first occurrence is kept)."""

    def __init__(self) -> None:
        self.first_row: dict[str, int] = {}

    def apply(self, st: pa.Table, field_name: str) -> tuple[pa.Table, list[Rejection]]:
        ids = st.column("request_id").to_pylist()
        rows = st.column("_row").to_pylist()
        bad = []
        seen = self.first_row
        for i, (rid, row) in enumerate(zip(ids, rows, strict=True)):
            first = seen.setdefault(rid, row)
            if first != row:
                bad.append(i)
        if not bad:
            return st, []
        recs = st.take(pa.array(bad, pa.int64())).to_pylist()
        rejections = [Rejection(rows[i], field_name, f"duplicate request id {ids[i]!r} (first at record {seen[ids[i]] + 1})",
                                rec.pop("_line", None), read_values(rec)) for i, rec in zip(bad, recs, strict=True)]
        keep = np.ones(st.num_rows, dtype=bool)
        keep[bad] = False
        return st.filter(pa.array(keep)), rejections


def _with_request_ids(st: pa.Table) -> pa.Table:
    """Rows without a source request id get their record index (0-based) as id."""
    fallback = st.column("_row").cast(pa.string())
    if "request_id" in st.column_names:
        return st.set_column(st.column_names.index("request_id"), "request_id",
                             pc.coalesce(st.column("request_id"), fallback))
    return st.append_column("request_id", fallback)


def to_canonical(st: pa.Table, base_ms: int, extras: tuple[str, ...] = ()) -> pa.Table:
    """Staged (validated) rows -> the canonical schema (+ the reader's optional columns); arrivals from trace start."""
    n = st.num_rows

    def col(name: str, typ: pa.DataType) -> pa.Array:
        if name in st.column_names:
            return st.column(name).cast(typ)
        return pa.nulls(n, typ)

    arrival = pc.subtract(st.column("t_ms"), pa.scalar(base_ms, pa.int64()))
    return pa.table({
        "request_id": col("request_id", pa.string()),
        "arrival_ms": arrival,
        "input_tokens": col("input_tokens", pa.int32()),
        "output_tokens": col("output_tokens", pa.int32()),
        "hash_ids": col("hash_ids", pa.list_(pa.uint64())),
        "session_id": col("session_id", pa.string()),
        "parent_id": col("parent_id", pa.string()),
        "turn": col("turn", pa.int32()),
        "delay_ms": col("delay_ms", pa.int64()),
        "priority": col("priority", pa.int32()),
        **{f.name: col(f.name, f.type) for f in trace_schema_for(extras) if f.name in extras},
    }).cast(trace_schema_for(extras))


def _selected(st: pa.Table, where: dict[str, str], reader: Reader) -> pa.Table:
    """Rows whose labels equal every ``--where`` value; the others are counted as skipped."""
    keep = pa.array(np.ones(st.num_rows, dtype=bool))
    for label, value in where.items():
        col = st.column(label).cast(pa.string()) if label in st.column_names else pa.nulls(st.num_rows, pa.string())
        keep = pc.and_(keep, pc.fill_null(pc.equal(col, pa.scalar(value, pa.string())), False))
    out = st.filter(keep)
    if out.num_rows < st.num_rows:
        cond = ", ".join(f"{k}={v}" for k, v in where.items())
        reader.skip(f"not selected by --where {cond}", st.num_rows - out.num_rows)
    return out


def resolve_lines(reader: Reader, rejections: list[Rejection]) -> None:
    missing = [r.row for r in rejections if r.line is None and r.row >= 0]
    if missing:
        lines = reader.line_of(missing)
        for r in rejections:
            if r.line is None and r.row >= 0:
                r.line = lines.get(r.row)


def canonical_batches(reader: Reader, info: ReaderInfo, opts: IngestOptions, progress: Progress) -> Iterator[pa.Table]:
    """Yield canonical batches in file order; raises on the first problem when ``on_error='fail'``."""
    absent = [label for label in opts.where or {} if label in LABEL_COLUMNS and label != "priority"
              and label not in info.extra_columns]
    if absent:
        raise TraceError(f"--where {absent[0]}=...: {info.source_format} files carry no {absent[0]} label "
                         "(every row would be left out)", path=str(reader.path))
    sessions = _Sessions(info.sessions_from_parents)
    dedupe = None if info.generated_ids else _Dedupe()
    running_max: int | None = None
    for staged, parse_rej in guarded(reader.batches(), reader.path):
        progress.rows_read += staged.num_rows + len(parse_rej)
        good, rej, dropped = validate(staged, info, drop_failed=opts.drop_failed)
        rej = parse_rej + rej
        progress.rows_dropped += dropped
        good = _with_request_ids(good)
        if dedupe is not None and good.num_rows:
            good, more = dedupe.apply(good, info.field_names.get("request_id", "request_id"))
            rej += more
        has_sessions = info.sessions_from_parents or (
            "session_id" in good.column_names and good.column("session_id").null_count < good.num_rows)
        if has_sessions and good.num_rows:
            progress.sessions_derived = True
            good, more = sessions.apply(good, info.field_names)
            rej += more
        if opts.where and good.num_rows:
            good = _selected(good, opts.where, reader)
        if rej:
            if opts.on_error == "fail":
                resolve_lines(reader, rej)
                first = min(rej, key=lambda r: (r.row < 0, r.row))
                raise first.to_error(reader.path, more=len(rej) - 1)
            progress.rejections.extend(rej)
        if good.num_rows == 0:
            continue
        t = good.column("t_ms").to_numpy()
        if progress.base_ms is None:
            progress.base_ms = int(t.min())
        lo, hi = int(t.min()), int(t.max())
        progress.min_t = lo if progress.min_t is None else min(progress.min_t, lo)
        progress.max_t = hi if progress.max_t is None else max(progress.max_t, hi)
        prefix = np.maximum.accumulate(t)
        before = np.empty_like(prefix)
        before[0] = running_max if running_max is not None else t[0]
        before[1:] = prefix[:-1]
        if running_max is not None:
            before = np.maximum(before, running_max)
        progress.rows_out_of_order += int((t < before).sum())
        running_max = hi if running_max is None else max(running_max, hi)
        progress.rows_good += good.num_rows
        yield to_canonical(good, progress.base_ms, info.extra_columns)


def sort_by_arrival(table: pa.Table) -> tuple[pa.Table, int]:
    """Stable sort by arrival, shifted so the earliest arrival is 0. Returns the shift."""
    order = pc.sort_indices(table, sort_keys=[("arrival_ms", "ascending")])
    table = table.take(order)
    shift = 0
    if table.num_rows:
        shift = int(table.column("arrival_ms")[0].as_py())
        if shift:
            idx = table.column_names.index("arrival_ms")
            table = table.set_column(idx, TRACE_SCHEMA.field("arrival_ms"),
                                     pc.subtract(table.column("arrival_ms"), pa.scalar(shift, pa.int64())))
    return table, shift


def skipped_text(skipped: dict[str, int]) -> str:
    """``"12 records skipped (10 spans without ...; 2 ...)"`` or "" when nothing was skipped."""
    total = sum(skipped.values())
    if not total:
        return ""
    reasons = "; ".join(f"{n:,} {why}" for why, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{total:,} record{'s' if total != 1 else ''} skipped ({reasons})"


def no_rows_error(reader: Reader, progress: Progress, side_file: Path | None = None) -> TraceError:
    skipped = skipped_text(reader.skipped)
    if progress.rows_read == 0:
        if skipped:
            return TraceError(f"no request records in the file: {skipped}", path=str(reader.path))
        return TraceError("no rows in the file", path=str(reader.path))
    where = f" (rejected rows and reasons: {side_file})" if side_file is not None else ""
    also = f"; {skipped}" if skipped else ""
    return TraceError(f"no usable rows: {progress.rows_read} read, {len(progress.rejections)} rejected, "
                      f"{progress.rows_dropped} dropped{where}{also}", path=str(reader.path))

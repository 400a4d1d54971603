"""Generic CSV and JSONL: any columns, named with ``--map CANONICAL=SOURCE`` flags.

Required: ``arrival``, ``input_tokens``, ``output_tokens`` and ``--time-unit s|ms|us|iso`` (a
generic file cannot tell seconds from milliseconds, the most common trace mistake, so the unit
is never guessed). Optional: ``request_id``, ``session_id``, ``parent_id``, ``turn``,
``delay_ms``, ``priority``, ``hash_ids`` (then ``--block-size`` is required; in CSV a cell like
``[1, 2, 3]`` or ``1 2 3``). Arrivals are rebased to the first request.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from replay.errors import ConfigError

from ..rejections import Rejection
from ._csv import CsvSource
from ._jsonl import JsonlSource
from .base import Col, Reader, ReaderInfo, Staged, stage

_KINDS = {"request_id": "str", "session_id": "str", "parent_id": "str", "turn": "int", "delay_ms": "int",
          "priority": "int", "input_tokens": "int", "output_tokens": "int", "hash_ids": "ids"}
_U64_MAX = 2**64 - 1


def _check(opts) -> None:
    missing = [k for k in ("arrival", "input_tokens", "output_tokens") if k not in opts.mapping]
    if missing:
        raise ConfigError("generic formats need --map for " + ", ".join(missing)
                          + " (e.g. --map arrival=ts --map input_tokens=prompt_len --map output_tokens=gen_len)")
    if opts.time_unit is None:
        raise ConfigError("generic formats need --time-unit s|ms|us|iso (the unit is never guessed)")
    if "hash_ids" in opts.mapping and opts.block_size is None:
        raise ConfigError("--map hash_ids=... needs --block-size (tokens per hash id)")


def _spec(opts) -> dict[str, Col]:
    spec = {"t_ms": Col((opts.mapping["arrival"],), f"time:{opts.time_unit}")}
    for target, source in opts.mapping.items():
        if target != "arrival":
            spec[target] = Col((source,), _KINDS[target])
    return spec


def _info(name: str, opts) -> ReaderInfo:
    has_ids = "hash_ids" in opts.mapping
    fields = {("t_ms" if k == "arrival" else k): v for k, v in opts.mapping.items()}
    return ReaderInfo(
        source_format=name, time_unit=opts.time_unit, rebase=True, wallclock=opts.time_unit == "iso",
        hash_block_size=opts.block_size if has_ids else None, prefix_identity="real" if has_ids else "absent",
        hash_ids_required=has_ids, generated_ids="request_id" not in opts.mapping, field_names=fields,
        notes=["columns mapped with --map " + ",".join(f"{k}={v}" for k, v in sorted(opts.mapping.items()))],
    )


def parse_id_lists(arr: pa.Array) -> tuple[pa.Array, list[tuple[int, str]]]:
    """Cells like ``[1, 2, 3]`` or ``1 2 3`` -> list<uint64>; bad cells are reported, not guessed."""
    inner = pc.utf8_trim(arr, characters="[] \t")
    parts = pc.split_pattern_regex(inner, r"[,;\s]+")
    parts = pc.if_else(pc.equal(inner, ""), pa.scalar([], pa.list_(pa.string())), parts)
    try:
        return parts.cast(pa.list_(pa.uint64())), []
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    values, bad = [], []
    for i, cell in enumerate(parts.to_pylist()):
        if cell is None:
            values.append(None)
            continue
        try:
            ids = [int(x) for x in cell]
            if any(not 0 <= x <= _U64_MAX for x in ids):
                raise ValueError
            values.append(ids)
        except ValueError:
            values.append(None)
            bad.append((i, f"hash ids must be integers in 0 .. 2^64-1: {arr[i].as_py()[:60]!r}"))
    return pa.array(values, pa.list_(pa.uint64())), bad


class GenericCsvReader(Reader):
    name = "csv"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        _check(opts)
        self.source = CsvSource(self.path, sorted(set(opts.mapping.values())))

    def info(self) -> ReaderInfo:
        return _info(self.name, self.opts)

    def batches(self) -> Iterator[Staged]:
        spec = _spec(self.opts)
        ids_col = self.opts.mapping.get("hash_ids")
        for raw, rows, rejections in self.source.tables():
            if ids_col is not None:
                ids, bad = parse_id_lists(raw.column(ids_col).combine_chunks())
                if bad:
                    idx = [i for i, _ in bad]
                    recs = raw.take(pa.array(idx, pa.int64())).to_pylist()
                    rows_list = rows.to_pylist()
                    rejections = rejections + [Rejection(rows_list[i], ids_col, reason, None, rec)
                                               for (i, reason), rec in zip(bad, recs, strict=True)]
                    keep = pc.invert(pc.is_in(pa.array(range(raw.num_rows)), pa.array(idx)))
                    raw, rows, ids = raw.filter(keep), rows.filter(keep), ids.filter(keep)
                raw = raw.set_column(raw.column_names.index(ids_col), ids_col, ids)
            yield stage(raw, rows, None, spec, rejections)

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        return self.source.line_of(rows)


_JSON_TYPES = {"str": pa.string(), "int": pa.int64(), "ids": pa.list_(pa.uint64())}


class GenericJsonlReader(Reader):
    name = "jsonl"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        _check(opts)
        spec = _spec(opts)
        fields = {}
        for col in spec.values():
            kind = col.kind
            typ = (pa.string() if kind == "time:iso" else pa.float64()) if kind.startswith("time:") else _JSON_TYPES[kind]
            fields[col.sources[0]] = typ
        self.source = JsonlSource(self.path, pa.schema(list(fields.items())))

    def info(self) -> ReaderInfo:
        return _info(self.name, self.opts)

    def batches(self) -> Iterator[Staged]:
        spec = _spec(self.opts)
        for raw, rows, rejections, lines in self.source.tables():
            yield stage(raw, rows, lines, spec, rejections)

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        return self.source.line_of(rows)

"""Generic CSV and JSONL: any columns, named with ``--map CANONICAL=SOURCE`` flags.

Required: ``arrival``, ``input_tokens``, ``output_tokens`` and ``--time-unit s|ms|us|iso`` (a
generic file cannot tell seconds from milliseconds, the most common trace mistake, so the unit
is never guessed). Optional: ``request_id``, ``session_id``, ``parent_id``, ``turn``,
``delay_ms``, ``priority``, ``hash_ids`` (then ``--block-size`` is required; in CSV a cell like
``[1, 2, 3]`` or ``1 2 3``), and the optional ``measured_*`` and label columns
(``replay.ingest.schema.OPTIONAL_SCHEMA``). Arrivals are rebased to the first request. In JSONL a source
may be a dotted path into nested objects (``--map input_tokens=usage.prompt_tokens``) unless the
first record has that literal key.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from replay.base.errors import ConfigError

from ..rejections import Rejection
from ..schema import OPTIONAL_SCHEMA, optional_columns
from .base import Col, Reader, ReaderInfo, Staged, record_indices, stage
from .csv_source import CsvSource
from .jsonl import JsonlSource, first_record


def _optional_kind(typ: pa.DataType) -> str:
    if pa.types.is_list(typ):
        return "floats"
    if pa.types.is_integer(typ):
        return "int"
    return "float" if pa.types.is_floating(typ) else "str"


_KINDS = {"request_id": "str", "session_id": "str", "parent_id": "str", "turn": "int", "delay_ms": "int",
          "priority": "int", "input_tokens": "int", "output_tokens": "int", "hash_ids": "ids",
          **{f.name: _optional_kind(f.type) for f in OPTIONAL_SCHEMA}}
_U64_MAX = 2**64 - 1


def _check(opts) -> None:
    missing = [k for k in ("arrival", "input_tokens", "output_tokens") if k not in opts.mapping]
    if missing:
        raise ConfigError("generic formats need --map for " + ", ".join(missing)
                          + " (e.g. --map arrival=ts --map input_tokens=prompt_len --map output_tokens=gen_len)")
    if opts.time_unit is None:
        raise ConfigError("generic formats need --time-unit s|ms|us|ns|iso (the unit is never guessed)")
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
        extra_columns=optional_columns(list(opts.mapping)),
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
    options_read = frozenset({"time_unit", "block_size", "mapping"})
    name = "csv"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        _check(opts)
        if "measured_itl_ms" in opts.mapping:
            raise ConfigError("--map measured_itl_ms needs a JSON list: use JSONL, or map measured_itl_mean_ms")
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
                    keep = pc.invert(pc.is_in(record_indices(0, raw.num_rows), pa.array(idx, pa.int64())))
                    raw, rows, ids = raw.filter(keep), rows.filter(keep), ids.filter(keep)
                raw = raw.set_column(raw.column_names.index(ids_col), ids_col, ids)
            yield stage(raw, rows, None, spec, rejections, unit_given=True)

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        return self.source.line_of(rows)


_JSON_TYPES = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "ids": pa.list_(pa.uint64()),
               "floats": pa.list_(pa.float64())}


def nested_schema(fields: dict[str, pa.DataType], literal: set[str]) -> pa.Schema:
    """A read schema where each dotted name (not in ``literal``) becomes nested struct fields."""
    tree: dict = {}
    for name, typ in fields.items():
        parts = [name] if name in literal else name.split(".")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--map: {name!r} reads into {part!r}, which another mapping uses as a value")
        if isinstance(node.get(parts[-1]), dict):
            raise ConfigError(f"--map: {name!r} is an object that another mapping reads into")
        node[parts[-1]] = typ

    def build(node: dict) -> list[pa.Field]:
        return [pa.field(k, pa.struct(build(v)) if isinstance(v, dict) else v) for k, v in node.items()]

    return pa.schema(build(tree))


def flatten_structs(table: pa.Table) -> pa.Table:
    """Nested struct columns -> flat columns named by their dotted paths."""
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    return table


class GenericJsonlReader(Reader):
    options_read = frozenset({"time_unit", "block_size", "mapping"})
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
        first = first_record(self.path) or {}
        literal = {name for name in fields if name in first}
        self.source = JsonlSource(self.path, nested_schema(fields, literal))

    def info(self) -> ReaderInfo:
        return _info(self.name, self.opts)

    def batches(self) -> Iterator[Staged]:
        spec = _spec(self.opts)
        for raw, rows, rejections, lines in self.source.tables():
            yield stage(flatten_structs(raw), rows, lines, spec, rejections, unit_given=True)

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        return self.source.line_of(rows)

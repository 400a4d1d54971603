"""Mooncake JSONL: the FAST'25 release rows and the extended (Dynamo / aiperf) fields.

FAST'25: ``{"timestamp": ms from trace start, "input_length", "output_length", "hash_ids"}`` with
one id per 512-token block (the last block partial). Extended rows may add ``request_id``,
``session_id``, ``delay``/``delay_ms`` (think time after the previous turn completes),
``created_time`` (alias of ``timestamp``), ``input_tokens``/``output_tokens`` (aliases of the
lengths) and ``priority`` (or aiperf's ``extra.nvext.priority``). Rows with prompt text
(``text_input``/``messages``) instead of ids are the ``mooncake-text`` reader's. Timestamps are kept as given (they are already from trace start).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from .base import Col, Reader, ReaderInfo, Staged, stage
from .generic import flatten_structs
from .jsonl import JsonlSource

DEFAULT_BLOCK_SIZE = 512  # tokens per hash id in the FAST'25 release (its README; docs/trace-schema.md)

FAST_SCHEMA = pa.schema([
    ("timestamp", pa.float64()), ("created_time", pa.float64()),
    ("input_length", pa.int64()), ("input_tokens", pa.int64()),
    ("output_length", pa.int64()), ("output_tokens", pa.int64()),
    ("hash_ids", pa.list_(pa.uint64())),
    ("request_id", pa.string()), ("session_id", pa.string()),
    ("delay", pa.float64()), ("delay_ms", pa.float64()),
    ("priority", pa.int64()),
    ("extra", pa.struct([("nvext", pa.struct([("priority", pa.int64())]))])),  # aiperf/Dynamo request extras
])

SPEC = {
    "t_ms": Col(("timestamp", "created_time"), "time:ms"),
    "input_tokens": Col(("input_length", "input_tokens"), "int"),
    "output_tokens": Col(("output_length", "output_tokens"), "int"),
    "hash_ids": Col(("hash_ids",), "ids"),
    "request_id": Col(("request_id",), "str"),
    "session_id": Col(("session_id",), "str"),
    "delay_ms": Col(("delay_ms", "delay"), "time:ms"),
    "priority": Col(("priority", "extra.nvext.priority"), "int"),
}


class MooncakeReader(Reader):
    options_read = frozenset({"block_size"})
    name = "mooncake"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        self.source = JsonlSource(self.path, FAST_SCHEMA)

    def info(self) -> ReaderInfo:
        return ReaderInfo(
            source_format=self.name,
            time_unit="ms",
            rebase=False,
            wallclock=False,
            hash_block_size=self.opts.block_size or DEFAULT_BLOCK_SIZE,
            prefix_identity="real",
            hash_ids_required=True,
            field_names={"t_ms": "timestamp", "input_tokens": "input_length", "output_tokens": "output_length",
                         "hash_ids": "hash_ids", "request_id": "request_id", "session_id": "session_id",
                         "delay_ms": "delay_ms", "priority": "priority"},
            notes=["delay_ms taken from the source's delay/delay_ms fields; never inferred from timestamps"],
        )

    def batches(self) -> Iterator[Staged]:
        for raw, rows, rejections, lines in self.source.tables():
            yield stage(flatten_structs(raw), rows, lines, SPEC, rejections)

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        return self.source.line_of(rows)

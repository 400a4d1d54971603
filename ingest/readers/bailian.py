"""Alibaba Bailian usage traces (qwen-bailian-usagetraces-anon) JSONL.

Fields: ``chat_id``, ``parent_chat_id`` (-1 for a conversation's first request), ``timestamp``
(float seconds), ``input_length``, ``output_length``, ``turn``, ``hash_ids`` (salted SipHash of
16-token blocks). The session of a request is the root of its parent chain; times are rebased
to the first request.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from .base import Col, Reader, ReaderInfo, Staged, stage
from .jsonl import JsonlSource

DEFAULT_BLOCK_SIZE = 16  # the release's hash block size (docs/trace-schema.md)

FAST_SCHEMA = pa.schema([
    ("chat_id", pa.int64()), ("parent_chat_id", pa.int64()), ("timestamp", pa.float64()),
    ("input_length", pa.int64()), ("output_length", pa.int64()), ("turn", pa.int64()),
    ("hash_ids", pa.list_(pa.uint64())),
])

SPEC = {
    "request_id": Col(("chat_id",), "str"),
    "parent_id": Col(("parent_chat_id",), "str"),
    "t_ms": Col(("timestamp",), "time:s"),
    "input_tokens": Col(("input_length",), "int"),
    "output_tokens": Col(("output_length",), "int"),
    "turn": Col(("turn",), "int"),
    "hash_ids": Col(("hash_ids",), "ids"),
}


class BailianReader(Reader):
    options_read = frozenset({"block_size"})
    name = "bailian"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        self.source = JsonlSource(self.path, FAST_SCHEMA)

    def info(self) -> ReaderInfo:
        return ReaderInfo(
            source_format=self.name, time_unit="s", rebase=True, wallclock=False,
            hash_block_size=self.opts.block_size or DEFAULT_BLOCK_SIZE, prefix_identity="real",
            hash_ids_required=True, sessions_from_parents=True,
            field_names={"request_id": "chat_id", "parent_id": "parent_chat_id", "t_ms": "timestamp",
                         "input_tokens": "input_length", "output_tokens": "output_length", "turn": "turn",
                         "hash_ids": "hash_ids"},
            notes=["session_id = root chat_id of the parent chain; no think-time delays in the source"],
        )

    def batches(self) -> Iterator[Staged]:
        for raw, rows, rejections, lines in self.source.tables():
            table, rej = stage(raw, rows, lines, SPEC, rejections)
            if "parent_id" in table.column_names:
                parent = table.column("parent_id")
                root = pc.fill_null(pc.equal(parent, "-1"), False)
                table = table.set_column(table.column_names.index("parent_id"), "parent_id",
                                         pc.if_else(root, pa.scalar(None, pa.string()), parent))
            yield table, rej

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        return self.source.line_of(rows)

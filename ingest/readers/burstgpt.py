"""BurstGPT CSV, v1 and v2, read by column name.

v1: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``; v2 inserts
``Session ID,Elapsed time``. Timestamps are float seconds, not zero-based: arrivals are rebased to
the first request. Failed requests have ``Response tokens == 0``: rejected by default, or dropped
and counted with ``--drop-failed``. ``Elapsed time`` is the full response time (not TTFT) and is
not used; ``Model`` and ``Log Type`` are not part of the canonical trace.
"""

from __future__ import annotations

from collections.abc import Iterator

from .base import Col, Reader, ReaderInfo, Staged, stage
from .csv_source import CsvSource, read_header

SPEC = {
    "t_ms": Col(("Timestamp",), "time:s"),
    "input_tokens": Col(("Request tokens",), "int"),
    "output_tokens": Col(("Response tokens",), "int"),
    "session_id": Col(("Session ID",), "str"),
}


class BurstGPTReader(Reader):
    name = "burstgpt"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        header = read_header(self.path)
        cols = ["Timestamp", "Request tokens", "Response tokens"]
        self.version = 2 if "Session ID" in header else 1
        if self.version == 2:
            cols.append("Session ID")
        self.source = CsvSource(self.path, cols)

    def info(self) -> ReaderInfo:
        return ReaderInfo(
            source_format=f"{self.name}-v{self.version}", time_unit="s", rebase=True, wallclock=False,
            hash_block_size=None, prefix_identity="absent", hash_ids_required=False, generated_ids=True,
            field_names={"t_ms": "Timestamp", "input_tokens": "Request tokens", "output_tokens": "Response tokens",
                         "session_id": "Session ID"},
            notes=["no prefix data in the source (reuse unknown, not zero)",
                   "Model, Log Type and Elapsed time are not carried over"],
            failed_as="BurstGPT logs a failure with 'Response tokens' 0",
        )

    def batches(self) -> Iterator[Staged]:
        for raw, rows, rejections in self.source.tables():
            yield stage(raw, rows, None, SPEC, rejections)

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        return self.source.line_of(rows)

"""Azure LLM inference traces: 2023 (Splitwise), 2024 (week-long) and 2025 multimodal CSV releases.

Columns by name: ``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens`` (2025 adds ``NumImages``).
Timestamps are wall-clock ISO strings in every release's form: ``2023-11-16 18:17:03.9799600``
(7 fractional digits, no zone), ``2024-05-10 00:00:00.009930+00:00`` (mixed precision), and
``...Z``; zone-less ones are taken as UTC. Arrivals are rebased to the first request and the
absolute start is kept in the metadata. No prefix data: reuse is unknown, not zero.
"""

from __future__ import annotations

from collections.abc import Iterator

from .base import Col, Reader, ReaderInfo, Staged, stage
from .csv_source import CsvSource, read_header

SPEC = {
    "t_ms": Col(("TIMESTAMP",), "time:iso"),
    "input_tokens": Col(("ContextTokens",), "int"),
    "output_tokens": Col(("GeneratedTokens",), "int"),
}


class AzureReader(Reader):
    name = "azure"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        self.source = CsvSource(self.path, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"])

    def info(self) -> ReaderInfo:
        notes = ["no prefix data in the source (reuse unknown, not zero)"]
        if "NumImages" in read_header(self.path):
            notes.append("NumImages ignored: image tokens are not modelled beyond ContextTokens")
        return ReaderInfo(
            source_format=self.name, time_unit="iso", rebase=True, wallclock=True, hash_block_size=None,
            prefix_identity="absent", hash_ids_required=False, generated_ids=True,
            field_names={"t_ms": "TIMESTAMP", "input_tokens": "ContextTokens", "output_tokens": "GeneratedTokens"},
            notes=notes,
        )

    def batches(self) -> Iterator[Staged]:
        for raw, rows, rejections in self.source.tables():
            yield stage(raw, rows, None, SPEC, rejections)

    def line_of(self, rows: list[int]) -> dict[int, int | None]:
        return self.source.line_of(rows)

"""Shared plumbing for readers of tool logs: each source record becomes staged rows in Python.

Benchmark results and gateway logs are small (one row per request, thousands to millions) and
deeply nested, so these readers walk each record in Python rather than through pyarrow's JSON
reader. A reader yields ``Item``s (record index, line, row dict or a rejection); ``RecordReader``
batches them into staged tables with the types of ``base.STAGED_TYPES``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..hashing import Tokenizer, chain_hash_blocks, render_messages
from ..rejections import Rejection
from .base import STAGED_TYPES, Reader, Staged, staged_table
from .decoding import open_binary
from .jsonl import json_objects

_BATCH = 16_384
_MS_PER = {"s": 1000.0, "sec": 1000.0, "ms": 1.0, "us": 1e-3, "ns": 1e-6}


class Bad(Exception):
    """A value a reader cannot use: the source field (dotted path) and why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field, self.reason = field, reason


@dataclass
class Item:
    row: int
    line: int | None
    values: dict[str, Any] | None = None
    rejection: Rejection | None = None


def dig(obj: Any, path: str) -> Any:
    """The value at a dotted path in nested dicts, or None when any step is missing."""
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def first(obj: dict, *paths: str) -> tuple[Any, str]:
    """The first non-null value among dotted ``paths`` and the path it came from."""
    for path in paths:
        value = dig(obj, path)
        if value is not None:
            return value, path
    return None, paths[0]


def number(value: Any, field: str, *, integer: bool = False, allow_none: bool = True) -> float | int | None:
    """A JSON number (or numeric string) checked finite and >= 0; integers when ``integer``."""
    if value is None:
        if allow_none:
            return None
        raise Bad(field, "missing value")
    if isinstance(value, str):
        try:
            value = float(value) if not value.strip().lstrip("-").isdigit() else int(value)
        except ValueError:
            raise Bad(field, f"not a number: {value[:60]!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Bad(field, f"not a number: {json.dumps(value)[:60]}")
    if value < 0:
        raise Bad(field, f"negative value {value}")
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise Bad(field, f"not an integer: {value!r}")
        return int(value)
    return float(value)


def to_ms(value: Any, unit: str, field: str) -> float | None:
    """A non-negative duration in ``unit`` converted to ms (None stays None)."""
    v = number(value, field)
    if v is None:
        return None
    if unit not in _MS_PER:
        raise Bad(field, f"unknown time unit {unit!r}")
    return v * _MS_PER[unit]


def tpot_ms(e2e: float | None, ttft: float | None, output_tokens: int | None) -> float | None:
    """vLLM's TPOT: (E2E - TTFT) / (output tokens - 1); None for one-token outputs."""
    if e2e is None or ttft is None or not output_tokens or output_tokens < 2:
        return None
    return (e2e - ttft) / (output_tokens - 1)


def text_of(messages_or_prompt: Any, field: str) -> str:
    """Prompt text from a string, a list of chat messages, or text parts."""
    if isinstance(messages_or_prompt, str):
        return messages_or_prompt
    if isinstance(messages_or_prompt, list):
        try:
            return render_messages(messages_or_prompt)
        except (ValueError, AttributeError) as exc:
            raise Bad(field, str(exc)) from None
    raise Bad(field, "expected text or a list of chat messages")


def fit_ids(ids: list[int], n_tokens: int, block_size: int) -> list[int]:
    """Hash ids resized to ``ceil(n_tokens / block_size)`` when a recorded token count differs
    from the tokenizer's: leading ids (the shared prefix) are kept; extra ids continue the chain
    from the last one (identical prompts still get identical ids)."""
    want = -(-n_tokens // block_size)
    if len(ids) >= want:
        return ids[:want]
    out = list(ids)
    parent = (out[-1] if out else 0).to_bytes(8, "little")
    while len(out) < want:
        parent = hashlib.blake2b(len(out).to_bytes(8, "little"), digest_size=8, key=parent).digest()
        out.append(int.from_bytes(parent, "little"))
    return out


class TextIds:
    """Prompt text -> (input tokens, chained hash ids), preferring a recorded prompt token count."""

    def __init__(self, tokenizer: str | None, block_size: int) -> None:
        self.tokenizer = Tokenizer(tokenizer)
        self.block_size = block_size
        self.resized = 0  # prompts whose recorded count differed from the tokenizer's

    def __call__(self, text: str, recorded: int | None = None) -> tuple[int, list[int]]:
        tokens = self.tokenizer.encode(text)
        ids = chain_hash_blocks(tokens, self.block_size)
        if recorded is None or recorded == len(tokens):
            return len(tokens), ids
        self.resized += 1
        return recorded, fit_ids(ids, recorded, self.block_size)

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def notes(self) -> list[str]:
        """The metadata note owed when counts come from the byte-level fallback."""
        if self.tokenizer.name.startswith("byte-fallback"):
            return ["tokenized with the byte-level fallback: token counts from text are approximate"]
        return []


def load_json_document(path) -> Any:
    """A whole JSON file (one document), or the list of objects of a JSON Lines file; a document cut
    short is one error saying so (``json_report.load_json_report``), an empty file an empty list."""
    from .json_report import load_json_report

    with open_binary(path) as fh:
        if not fh.read(1 << 16).strip():
            return []
    return load_json_report(path, "JSON")


def json_lines(path) -> Iterator[tuple[int, int, Any]]:
    """(record index, line, object) per non-blank line; a bad line's object is a ``Bad``."""
    for record, line, obj, rejection in json_objects(path):
        yield record, line, obj if rejection is None else Bad(rejection.field, rejection.reason)


class RecordReader(Reader):
    """Base for readers that produce row dicts; subclasses implement ``items`` and ``info``."""

    def items(self) -> Iterator[Item]:
        raise NotImplementedError

    def _row(self, obj: dict) -> dict[str, Any]:
        """One source object -> one staged row (raise ``Bad`` for an unusable value)."""
        raise NotImplementedError

    def each(self, records: Iterator[tuple[int, int | None, Any]]) -> Iterator[Item]:
        """``_row`` over (record index, line, object) triples; problems become rejections."""
        for record, line, obj in records:
            try:
                if isinstance(obj, Bad):
                    raise obj
                if not isinstance(obj, dict):
                    raise Bad("<json>", "a record must be a JSON object")
                yield Item(record, line, self._row(obj))
            except Bad as bad:
                yield self.reject(record, line, bad, obj)

    @staticmethod
    def reject(row: int, line: int | None, bad: Bad, record: Any = None) -> Item:
        rec = record if isinstance(record, dict) else None
        if rec is not None:  # keep side files small: drop long text
            rec = {k: v for k, v in rec.items() if not isinstance(v, str | list | dict) or len(json.dumps(v)) < 200}
        return Item(row, line, rejection=Rejection(row, bad.field, bad.reason, line, rec))

    def batches(self) -> Iterator[Staged]:
        rows: list[dict[str, Any]] = []
        idx: list[int] = []
        lines: list[int | None] = []
        rejections: list[Rejection] = []
        for item in self.items():
            if item.rejection is not None:
                rejections.append(item.rejection)
                continue
            rows.append(item.values or {})
            idx.append(item.row)
            lines.append(item.line)
            if len(rows) >= _BATCH:
                yield self._table(rows, idx, lines), rejections
                rows, idx, lines, rejections = [], [], [], []
        if rows or rejections:
            yield self._table(rows, idx, lines), rejections

    def _table(self, rows: list[dict[str, Any]], idx: list[int], lines: list[int | None]) -> pa.Table:
        names = [n for n in STAGED_TYPES if not n.startswith("_") and any(n in r for r in rows)]
        cols = {n: pa.array([r.get(n) for r in rows], STAGED_TYPES[n]) for n in names}
        line_arr = pa.array(lines, pa.int64()) if any(x is not None for x in lines) else None
        return staged_table(cols, pa.array(idx, pa.int64()), line_arr)


def iso_ms(value: Any, field: str) -> float | None:
    """An ISO-8601 time (zone-less = UTC) or epoch seconds as float ms since the epoch."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return number(value, field) * 1000.0
    if not isinstance(value, str):
        raise Bad(field, f"not a timestamp: {json.dumps(value)[:60]}")
    from datetime import UTC, datetime

    try:
        dt = datetime.fromisoformat(value.strip())
    except ValueError:
        raise Bad(field, f"unparseable timestamp: {value[:60]!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp() * 1000.0


def duration_ms(start: float | None, end: float | None, field: str) -> float | None:
    """end - start in ms, or None; a negative span is a bad value."""
    if start is None or end is None:
        return None
    if end < start:
        raise Bad(field, f"ends {start - end:.3f} ms before the request started")
    return end - start

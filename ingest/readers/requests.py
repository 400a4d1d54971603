"""Request logs (OpenAI-style / vLLM request logs) as JSONL: the prompt is text, chat messages or token ids.

Per line: ``prompt_token_ids`` (exact), or ``prompt`` (text, or a list of token ids), or chat
``messages`` (rendered with a fixed role-tag template). Text is tokenized with ``--tokenizer
tokenizer.json`` or the deterministic byte-level fallback (approximate counts; the metadata
says which). Token ids are chain-hashed into blocks of ``--block-size`` (default 16, vLLM's
block size) so prefix identity is exact. Output length: ``output_tokens``,
``completion_tokens``, ``usage.completion_tokens``, ``output_token_ids`` or, last,
``max_tokens`` (the cap, not the real length: noted in the metadata). A recorded prompt count
(``usage.prompt_tokens`` / ``usage.input_tokens`` / ``prompt_tokens``) wins over the tokenizer's
count (hash ids resized to it, shared leading blocks kept); ``usage.prompt_tokens_details
.cached_tokens`` and ``model`` are kept when the first line has them. Arrival: ``timestamp``,
``arrival_time``, ``created`` or ``created_at``; ISO strings, or numbers in ``--time-unit``
(default seconds, the unit of OpenAI's ``created``); rebased to the first request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..columns import parse_time_ms
from ..hashing import Tokenizer, chain_hash_blocks, render_messages
from ..rejections import Rejection
from .base import STAGED_TYPES, Reader, ReaderInfo, Staged, staged_table
from .jsonl import I64_MAX, first_record, json_objects
from .records import fit_ids

DEFAULT_BLOCK_SIZE = 16  # vLLM's default KV block size: exact identity at the engine's granularity
_BATCH = 16_384
_TIME_KEYS = ("timestamp", "arrival_time", "created", "created_at")
_ID_KEYS = ("request_id", "id")


class _Bad(Exception):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field, self.reason = field, reason


def _int(obj: dict, key: str) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not -I64_MAX <= v <= I64_MAX:
        raise _Bad(key, f"not an integer: {json.dumps(v)[:60]}")
    return v


def _token_list(value: Any, key: str) -> list[int]:
    if not isinstance(value, list) or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= 0xFFFFFFFF
                                          for t in value):
        raise _Bad(key, "token ids must be a list of integers in 0 .. 2^32-1")
    return value


class RequestsReader(Reader):
    options_read = frozenset({"time_unit", "block_size"})
    name = "requests"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        self.tokenizer = Tokenizer(opts.tokenizer)
        self.block_size = opts.block_size or DEFAULT_BLOCK_SIZE
        head = first_record(self.path) or {}
        self.extras = tuple(name for name, present in (
            ("measured_cached_tokens", isinstance(head.get("usage"), dict)), ("model", "model" in head)) if present)

    def info(self) -> ReaderInfo:
        notes = ["hash ids: blake2b chain hash of token-id blocks (replay.ingest.hashing)",
                 "output length from output_tokens/completion_tokens/usage/output_token_ids, else max_tokens (a cap)"]
        if self.tokenizer.name.startswith("byte-fallback"):
            notes.append("text prompts (if any) tokenized with the byte-level fallback: token counts are approximate")
        return ReaderInfo(
            source_format=self.name, time_unit=self.opts.time_unit or "s", rebase=True,
            wallclock=True,
            hash_block_size=self.block_size, prefix_identity="real", hash_ids_required=True,
            tokenizer=self.tokenizer.name,
            field_names={"t_ms": "timestamp", "input_tokens": "prompt", "output_tokens": "output_tokens",
                         "request_id": "request_id", "hash_ids": "prompt"},
            notes=notes + ["recorded prompt counts (usage.prompt_tokens) win over the tokenizer's"],
            extra_columns=self.extras,
        )

    def _prompt_tokens(self, obj: dict) -> list[int]:
        if obj.get("prompt_token_ids") is not None:
            return _token_list(obj["prompt_token_ids"], "prompt_token_ids")
        prompt = obj.get("prompt")
        if isinstance(prompt, list):
            return _token_list(prompt, "prompt")
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt).tolist()
        if prompt is not None:
            raise _Bad("prompt", "prompt must be text or a list of token ids")
        if obj.get("messages") is not None:
            try:
                text = render_messages(obj["messages"])
            except (ValueError, AttributeError) as exc:
                raise _Bad("messages", str(exc)) from None
            return self.tokenizer.encode(text).tolist()
        raise _Bad("prompt", "missing prompt (prompt, messages or prompt_token_ids)")

    def _output(self, obj: dict) -> int | None:
        for key in ("output_tokens", "completion_tokens"):
            if obj.get(key) is not None:
                return _int(obj, key)
        usage = obj.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            return _int(usage, "completion_tokens")
        if obj.get("output_token_ids") is not None:
            return len(_token_list(obj["output_token_ids"], "output_token_ids"))
        if obj.get("max_tokens") is not None:
            return _int(obj, "max_tokens")
        return None

    def _recorded(self, obj: dict) -> tuple[int | None, int | None]:
        """(recorded prompt tokens, recorded cached prompt tokens) from the log's usage counts."""
        usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
        prompt = next(((usage, k) for k in ("prompt_tokens", "input_tokens") if usage.get(k) is not None),
                      (obj, "prompt_tokens"))
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        cached = _int(details, "cached_tokens") if isinstance(details, dict) else None
        return _int(*prompt), cached

    def _row(self, obj: dict) -> dict[str, Any]:
        tokens = self._prompt_tokens(obj)
        recorded, cached = self._recorded(obj)
        ids = chain_hash_blocks(tokens, self.block_size)
        if recorded is not None and recorded != len(tokens):
            if recorded < 1:
                raise _Bad("usage.prompt_tokens", f"recorded prompt length {recorded} is not positive")
            ids = fit_ids(ids, recorded, self.block_size)
        rid = next((obj[k] for k in _ID_KEYS if obj.get(k) is not None), None)
        t = next((obj[k] for k in _TIME_KEYS if obj.get(k) is not None), None)
        if t is not None and not isinstance(t, str | int | float) or isinstance(t, bool):
            raise _Bad("timestamp", f"unparseable timestamp: {json.dumps(t)[:60]}")
        return {
            "request_id": None if rid is None else str(rid),
            "t_raw": t,
            "input_tokens": len(tokens) if recorded is None else recorded,
            "output_tokens": self._output(obj),
            "hash_ids": ids,
            "measured_cached_tokens": cached,
            "model": obj.get("model") if isinstance(obj.get("model"), str) else None,
            "session_id": None if obj.get("session_id") is None else str(obj["session_id"]),
            "parent_id": None if obj.get("parent_id") is None else str(obj["parent_id"]),
            "delay_ms": _int(obj, "delay_ms"),
            "priority": _int(obj, "priority"),
        }

    def _flush(self, rows_out: list[dict], rows: list[int], lines: list[int], rejections: list[Rejection]) -> Staged:
        unit = self.opts.time_unit or ("iso" if any(isinstance(r["t_raw"], str) for r in rows_out) else "s")
        raw_t = [r["t_raw"] for r in rows_out]
        t_arr = pa.array([str(v) if v is not None else None for v in raw_t], pa.string()) if unit == "iso" else \
            pa.array([None if isinstance(v, str) else v for v in raw_t], pa.float64())
        t_ms, bad = parse_time_ms(t_arr, unit)
        for i, v in enumerate(raw_t):
            if unit != "iso" and isinstance(v, str):
                bad.append((i, f"unparseable timestamp: {v[:60]!r} (the file mixes text and numeric times)"))
        cols = {name: pa.array([r[name] for r in rows_out], typ) for name, typ in (
            ("request_id", pa.string()), ("input_tokens", pa.int64()), ("output_tokens", pa.int64()),
            ("hash_ids", pa.list_(pa.uint64())), ("session_id", pa.string()), ("parent_id", pa.string()),
            ("delay_ms", pa.int64()), ("priority", pa.int64()))}
        cols.update({name: pa.array([r[name] for r in rows_out], STAGED_TYPES[name]) for name in self.extras})
        cols["t_ms"] = t_ms
        table = staged_table(cols, pa.array(rows, pa.int64()), pa.array(lines, pa.int64()))
        if bad:
            bad_idx = sorted({i for i, _ in bad})
            reasons = dict(bad)
            for i in bad_idx:
                rejections.append(Rejection(rows[i], "timestamp", reasons[i], lines[i], {"timestamp": raw_t[i]}))
            bad_set = set(bad_idx)
            keep = [i not in bad_set for i in range(len(rows))]
            table = table.filter(pa.array(keep))
        return table, rejections

    def batches(self) -> Iterator[Staged]:
        rows_out: list[dict] = []
        rows: list[int] = []
        lines: list[int] = []
        rejections: list[Rejection] = []
        for record, lineno, obj, rejection in json_objects(self.path):
            if rejection is not None:
                rejections.append(rejection)
                continue
            try:
                rows_out.append(self._row(obj))
            except _Bad as bad:
                rejections.append(Rejection(record, bad.field, bad.reason, lineno,
                                            {k: v for k, v in obj.items() if k not in ("prompt", "messages")}))
                continue
            rows.append(record)
            lines.append(lineno)
            if len(rows) >= _BATCH:
                yield self._flush(rows_out, rows, lines, rejections)
                rows_out, rows, lines, rejections = [], [], [], []
        if rows or rejections:
            yield self._flush(rows_out, rows, lines, rejections)

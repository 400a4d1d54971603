"""Extended Mooncake rows that carry the prompt instead of hash ids (aiperf / Dynamo traces):
``text_input`` (text) or ``messages`` (chat), with ``output_length``, ``timestamp`` (ms from
trace start), ``session_id``, ``delay``/``delay_ms`` (think time after the previous turn),
``request_id`` and ``priority`` or ``extra.nvext.priority``.

Prompts are chain-hashed into block ids from their text (``--block-size``, default 16) as for
request logs; ``input_length`` when given is the recorded count and wins over the tokenizer's
(the ids are resized to it, keeping the shared leading blocks).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import ReaderInfo
from .records import Bad, Item, RecordReader, TextIds, first, json_lines, number, text_of

DEFAULT_BLOCK_SIZE = 16


def _priority(value: Any, field: str) -> int | None:
    """vLLM priorities are any integer (lower is served first), negative included."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Bad(field, f"priority must be an integer, got {value!r}")
    return value


class MooncakeTextReader(RecordReader):
    options_read = frozenset({"block_size"})
    name = "mooncake-text"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        self.text = TextIds(opts.tokenizer, opts.block_size or DEFAULT_BLOCK_SIZE)

    def info(self) -> ReaderInfo:
        notes = ["prompt text (text_input/messages) chain-hashed into block ids; input_length, when given, wins",
                 "delay_ms taken from the source's delay/delay_ms fields; never inferred from timestamps"]
        notes += self.text.notes()
        return ReaderInfo(
            source_format=self.name, time_unit="ms", rebase=False, wallclock=False,
            hash_block_size=self.text.block_size, prefix_identity="real", hash_ids_required=True,
            tokenizer=self.text.tokenizer.name,
            field_names={"t_ms": "timestamp", "input_tokens": "input_length", "output_tokens": "output_length",
                         "hash_ids": "text_input", "request_id": "request_id", "session_id": "session_id",
                         "delay_ms": "delay", "priority": "priority"},
            notes=notes,
        )

    def _row(self, obj: dict) -> dict[str, Any]:
        prompt, where = first(obj, "text_input", "messages")
        if prompt is None:
            raise Bad("text_input", "missing prompt (text_input or messages)")
        recorded, f_in = first(obj, "input_length", "input_tokens")
        n_in, ids = self.text(text_of(prompt, where), number(recorded, f_in, integer=True))
        out, f_out = first(obj, "output_length", "output_tokens")
        t, f_t = first(obj, "timestamp", "created_time")
        delay, f_d = first(obj, "delay_ms", "delay")
        prio, f_p = first(obj, "priority", "extra.nvext.priority")
        sid, rid = obj.get("session_id"), obj.get("request_id")
        return {"request_id": None if rid is None else str(rid), "session_id": None if sid is None else str(sid),
                "t_ms": None if t is None else round(number(t, f_t)),
                "delay_ms": None if delay is None else round(number(delay, f_d)),
                "input_tokens": n_in, "hash_ids": ids, "output_tokens": number(out, f_out, integer=True),
                "priority": _priority(prio, f_p)}

    def items(self) -> Iterator[Item]:
        return self.each(json_lines(self.path))

"""Conversation datasets: ShareGPT (``conversations: [{from, value}]``) and LMSYS-Chat-1M
(``conversation: [{role, content}]``), as a JSON array or JSON Lines.

Every assistant reply is one request: its prompt is the whole conversation before it (rendered
with ``replay.ingest.hashing.render_messages``), so later turns share a real prefix with earlier ones
and get chained hash ids from their text (the ``requests`` reader's hashing). Output length is
the reply's token count under the tokenizer (no recorded count exists: approximate with the byte
fallback). A conversation is a session, its replies turns 1..n. There are no timestamps: every
first turn arrives at 0 and later turns follow their previous turn with ``delay_ms`` 0 (no think
time known); replay with ``load.mode`` poisson or concurrency. A trailing user message with no
reply is not a request. LMSYS ``model`` is kept as a label.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from replay.base.errors import TraceError

from ..hashing import render_messages
from .base import ReaderInfo
from .records import Bad, Item, RecordReader, TextIds, load_json_document

DEFAULT_BLOCK_SIZE = 16  # vLLM's default KV block size, as for request logs
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
          "bing": "assistant", "assistant": "assistant", "system": "system", "tool": "tool"}


class ConversationReader(RecordReader):
    """ShareGPT and LMSYS-Chat records (the field names tell them apart per record)."""
    options_read = frozenset({"block_size"})

    name = "sharegpt"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        self.text = TextIds(opts.tokenizer, opts.block_size or DEFAULT_BLOCK_SIZE)
        doc = load_json_document(self.path)
        if isinstance(doc, dict):
            doc = [doc]
        if not isinstance(doc, list):
            raise TraceError("expected a JSON array of conversations (or one conversation per line)",
                             path=str(self.path))
        self.doc = doc

    def info(self) -> ReaderInfo:
        notes = ["one request per assistant reply; prompt = the conversation before it (render_messages)",
                 "output length = reply tokens under the tokenizer (no recorded count in the source)",
                 "no timestamps: first turns at 0, later turns closed-loop with delay_ms 0; "
                 "replay with load.mode poisson or concurrency"]
        notes += self.text.notes()
        return ReaderInfo(
            source_format=self.name, time_unit="ms", rebase=False, wallclock=False,
            hash_block_size=self.text.block_size, prefix_identity="real", hash_ids_required=True,
            tokenizer=self.text.tokenizer.name,
            field_names={"input_tokens": "conversations", "output_tokens": "conversations",
                         "hash_ids": "conversations", "request_id": "id", "session_id": "id"},
            notes=notes, extra_columns=("model",), no_timestamps=True,
        )

    @staticmethod
    def _messages(obj: dict) -> tuple[list[dict[str, str]], str]:
        if isinstance(obj.get("conversations"), list):
            raw, key, role_key, text_key = obj["conversations"], "conversations", "from", "value"
        elif isinstance(obj.get("conversation"), list):
            raw, key, role_key, text_key = obj["conversation"], "conversation", "role", "content"
        else:
            raise Bad("conversations", "missing conversation list ('conversations' or 'conversation')")
        out = []
        for j, msg in enumerate(raw):
            if not isinstance(msg, dict) or not isinstance(msg.get(text_key), str):
                raise Bad(f"{key}[{j}]", f"expected an object with a text '{text_key}'")
            role = _ROLES.get(str(msg.get(role_key, "")).lower())
            if role is None:
                raise Bad(f"{key}[{j}].{role_key}", f"unknown role {msg.get(role_key)!r}")
            out.append({"role": role, "content": msg[text_key]})
        return out, key

    def _rows(self, obj: dict, index: int) -> list[dict[str, Any]]:
        messages, key = self._messages(obj)
        conv = obj.get("id", obj.get("conversation_id"))
        conv = str(index) if conv is None else str(conv)
        rows = []
        for j, msg in enumerate(messages):
            if msg["role"] != "assistant" or j == 0:
                continue
            prompt = render_messages(messages[:j])
            n_in, ids = self.text(prompt)
            n_out = self.text.count(msg["content"])
            turn = len(rows) + 1
            rows.append({"request_id": f"{conv}-{turn}", "session_id": conv, "turn": turn, "t_ms": 0,
                         "delay_ms": 0 if turn > 1 else None, "input_tokens": n_in, "output_tokens": n_out,
                         "hash_ids": ids, "model": obj.get("model")})
        return rows

    def items(self) -> Iterator[Item]:
        for i, obj in enumerate(self.doc):
            try:
                if not isinstance(obj, dict):
                    raise Bad("<json>", "a conversation must be a JSON object")
                rows = self._rows(obj, i)
                if not rows:
                    self.skip("conversations without an assistant reply after a prompt (no request to replay)")
                for row in rows:
                    yield Item(i, None, row)
            except Bad as bad:
                yield self.reject(i, None, bad, obj)


class LmsysReader(ConversationReader):
    name = "lmsys"

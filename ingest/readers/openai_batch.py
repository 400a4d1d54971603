"""OpenAI Batch API files (JSON Lines), input and output.

Input lines ``{"custom_id", "method", "url", "body": {...}}``: the prompt is ``body.messages``
(chat), ``body.input`` (responses) or ``body.prompt`` (completions), hashed into chained block ids
from its text like request logs; the output length is ``body.max_tokens`` /
``max_completion_tokens`` / ``max_output_tokens``, a cap and not the real length (noted).
Output lines ``{"custom_id", "response": {"status_code", "body": {"usage": ...}}, "error"}``:
the recorded ``usage`` counts (``prompt_tokens``/``completion_tokens``, or ``input_tokens``/
``output_tokens``) and ``prompt_tokens_details.cached_tokens`` as ``measured_cached_tokens``; no
prompt text, so no prefix identity. Neither file has arrival times (a batch runs when the service
chooses): arrivals are 0, replay with a load mode. Failed requests (status not 200, or an
``error``) get output length 0 (``--drop-failed`` drops them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import ReaderInfo
from .records import Bad, Item, RecordReader, TextIds, first, json_lines, number, text_of

DEFAULT_BLOCK_SIZE = 16


class _BatchReader(RecordReader):
    def items(self) -> Iterator[Item]:
        return self.each(json_lines(self.path))


class OpenAIBatchInputReader(_BatchReader):
    options_read = frozenset({"block_size"})  # prompts are tokenized into blocks of this size
    name = "openai-batch-input"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        self.text = TextIds(opts.tokenizer, opts.block_size or DEFAULT_BLOCK_SIZE)

    def info(self) -> ReaderInfo:
        notes = ["prompt text from body.messages/input/prompt, chain-hashed (replay.ingest.hashing)",
                 "output length is the request's max_tokens cap, not the real length",
                 "no arrival times in a batch file: arrivals are 0, replay with a load mode"] + self.text.notes()
        return ReaderInfo(
            source_format=self.name, time_unit="ms", rebase=False, wallclock=False,
            hash_block_size=self.text.block_size, prefix_identity="real", hash_ids_required=True,
            tokenizer=self.text.tokenizer.name,
            field_names={"input_tokens": "body.messages", "output_tokens": "body.max_tokens",
                         "request_id": "custom_id", "hash_ids": "body.messages"},
            notes=notes, extra_columns=("model", "request_type"), no_timestamps=True,
        )

    def _row(self, obj: dict) -> dict[str, Any]:
        body = obj.get("body")
        if not isinstance(body, dict):
            raise Bad("body", "missing request body object")
        prompt, where = first(body, "messages", "input", "prompt")
        if prompt is None:
            raise Bad("body.messages", "missing prompt (body.messages, body.input or body.prompt)")
        n_in, ids = self.text(text_of(prompt, f"body.{where}"))
        cap, cap_field = first(body, "max_completion_tokens", "max_tokens", "max_output_tokens")
        return {"request_id": obj.get("custom_id"), "t_ms": 0, "input_tokens": n_in, "hash_ids": ids,
                "output_tokens": number(cap, f"body.{cap_field}", integer=True),
                "model": body.get("model"), "request_type": obj.get("url")}


class OpenAIBatchOutputReader(_BatchReader):
    name = "openai-batch-output"

    def info(self) -> ReaderInfo:
        return ReaderInfo(
            source_format=self.name, time_unit="ms", rebase=False, wallclock=False, hash_block_size=None,
            prefix_identity="absent", hash_ids_required=False,
            field_names={"input_tokens": "response.body.usage.prompt_tokens",
                         "output_tokens": "response.body.usage.completion_tokens", "request_id": "custom_id"},
            notes=["recorded usage counts from response.body.usage; no prompt text, so no prefix identity",
                   "no arrival times in a batch file: arrivals are 0, replay with a load mode"],
            extra_columns=("measured_cached_tokens", "model"), no_timestamps=True,
            failed_as="the line has an 'error', or a response status_code other than 200",
        )

    def _row(self, obj: dict) -> dict[str, Any]:
        response = obj.get("response")
        body = response.get("body") if isinstance(response, dict) else None
        failed = obj.get("error") is not None or not isinstance(body, dict) or response.get("status_code") != 200
        usage = body.get("usage") if isinstance(body, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        p = "response.body.usage."
        n_in, f_in = first(usage, "prompt_tokens", "input_tokens")
        n_out, f_out = first(usage, "completion_tokens", "output_tokens")
        cached, f_cached = first(usage, "prompt_tokens_details.cached_tokens", "input_tokens_details.cached_tokens")
        return {"request_id": obj.get("custom_id"), "t_ms": 0,
                "input_tokens": number(n_in, p + f_in, integer=True),
                "output_tokens": 0 if failed else number(n_out, p + f_out, integer=True),
                "measured_cached_tokens": number(cached, p + f_cached, integer=True),
                "model": body.get("model") if isinstance(body, dict) else None}

"""llm-d / Kubernetes ``inference-perf`` per-request report (``per_request_lifecycle_metrics.json``,
written with ``report.request_lifecycle.per_request: true``).

A JSON list, one object per request: ``start_time``, ``end_time`` (client ``time.perf_counter``
seconds, so arrivals are rebased and carry no wall clock), ``request`` (the HTTP body as JSON text),
``response``, ``error`` (``{"error_type", "error_msg"}`` or null) and ``info``, whose shape changed
across versions: 0.3-0.4 ``{"input_tokens", "output_tokens", "output_token_times"}``; 0.5 moves the
output under ``response_info`` (``output_tokens``, ``output_token_times``, ``chunk_times``,
``server_usage``); 0.6 on ``{"request_metrics": {"text": {"input_tokens"}}, "response_metrics":
{...the same...}, "input_tokens"}``.

Lengths are the server's ``usage`` (``server_usage.prompt_tokens`` / ``completion_tokens``) when the
stream reported one, else inference-perf's own counts. TTFT = first output token time - start,
E2E = end - start, ITL = the gaps between streamed chunks (``chunk_times``, else
``output_token_times``); non-streamed requests have E2E only. Cached = ``server_usage.
prompt_tokens_details.cached_tokens``. Prompt text in ``request`` (``messages`` / ``prompt``) is
chain-hashed into prefix ids (``--block-size``, default 16). Requests with an ``error`` have output
length 0 (``--drop-failed``). The file does not say which load stage a request belonged to.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from replay.base.errors import TraceError

from .base import ReaderInfo
from .json_report import load_json_report
from .records import Bad, Item, RecordReader, TextIds, dig, first, number, text_of, tpot_ms

DEFAULT_BLOCK_SIZE = 16
_EXTRAS = ("measured_ttft_ms", "measured_e2e_ms", "measured_tpot_ms", "measured_itl_ms", "measured_itl_mean_ms",
           "measured_cached_tokens", "model")
_RESPONSE = ("response_metrics", "response_info")  # 0.6+, 0.5; 0.3-0.4 keep the fields in info itself


def is_inference_perf_record(obj: Any) -> bool:
    return isinstance(obj, dict) and {"start_time", "end_time", "request", "info"} <= set(obj)


def request_body(req: dict) -> dict | None:
    body = req.get("request")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return None
    return body if isinstance(body, dict) else None


def prompt_of(body: dict | None) -> tuple[str | None, str]:
    if body is None:
        return None, "request"
    value, where = first(body, "messages", "prompt")
    if value is None:
        return None, "request"
    return text_of(value, f"request.{where}"), f"request.{where}"


def _response(info: dict) -> dict:
    for key in _RESPONSE:
        if isinstance(info.get(key), dict):
            return info[key]
    return info


class InferencePerfReader(RecordReader):
    options_read = frozenset({"block_size"})
    name = "inference-perf"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        doc = load_json_report(self.path, "inference-perf per-request report")
        if not isinstance(doc, list) or not doc or not is_inference_perf_record(doc[0]):
            raise TraceError("not an inference-perf per_request_lifecycle_metrics.json (a JSON list of requests "
                             "with start_time, end_time, request and info)", path=str(self.path))
        self.doc = doc
        has_text = any(prompt_of(request_body(r))[0] for r in doc[:1] if isinstance(r, dict))
        self.text = TextIds(opts.tokenizer, opts.block_size or DEFAULT_BLOCK_SIZE) if has_text else None
        bodies = [request_body(r) for r in doc[:1] if isinstance(r, dict)]
        self.model = (bodies[0] or {}).get("model") if bodies else None

    def info(self) -> ReaderInfo:
        notes = ["inference-perf per-request lifecycle metrics; lengths from the server's usage when streamed",
                 "ITL = gaps between streamed chunks; arrivals from client perf_counter (no wall clock)"]
        if self.text is not None:
            notes += ["prompt text chain-hashed into prefix ids; recorded prompt tokens win"] + self.text.notes()
        return ReaderInfo(
            source_format=self.name, time_unit="s", rebase=True, wallclock=False,
            hash_block_size=self.text.block_size if self.text else None,
            prefix_identity="real" if self.text else "absent", hash_ids_required=False,
            tokenizer=self.text.tokenizer.name if self.text else None, generated_ids=True,
            field_names={"t_ms": "start_time", "input_tokens": "info.input_tokens",
                         "output_tokens": "info.response_metrics.output_tokens", "hash_ids": "request"},
            notes=notes, extra_columns=_EXTRAS,
            source_run={"tool": "inference-perf", **({"model_id": self.model} if self.model else {})},
            failed_as="the request has an 'error'",
        )

    def _row(self, req: dict) -> dict[str, Any]:
        info = req.get("info")
        if not isinstance(info, dict):
            raise Bad("info", "missing info object")
        resp = _response(info)
        usage = resp.get("server_usage") if isinstance(resp.get("server_usage"), dict) else {}
        start = number(req.get("start_time"), "start_time", allow_none=False)
        end = number(req.get("end_time"), "end_time")
        n_in = number(usage.get("prompt_tokens"), "server_usage.prompt_tokens", integer=True)
        if n_in is None:
            value, where = first(info, "input_tokens", "request_metrics.text.input_tokens")
            n_in = number(value, f"info.{where}", integer=True, allow_none=False)
        n_out = number(usage.get("completion_tokens"), "server_usage.completion_tokens", integer=True)
        if n_out is None:
            n_out = number(resp.get("output_tokens"), "output_tokens", integer=True) or 0
        body = request_body(req)
        row: dict[str, Any] = {"t_ms": round(start * 1000.0), "input_tokens": n_in,
                               "model": (body or {}).get("model") if isinstance((body or {}).get("model"), str) else None,
                               "measured_cached_tokens": number(dig(usage, "prompt_tokens_details.cached_tokens"),
                                                                "server_usage.prompt_tokens_details.cached_tokens",
                                                                integer=True)}
        if self.text is not None:
            text, _where = prompt_of(body)
            if text is not None:
                row["input_tokens"], row["hash_ids"] = self.text(text, n_in)
        if req.get("error") is not None:
            row["output_tokens"] = 0  # failed: --drop-failed drops and counts it
            return row
        row["output_tokens"] = n_out
        e2e = None if end is None else (end - start) * 1000.0
        if e2e is not None and e2e < 0:
            raise Bad("end_time", "ends before it started")
        token_times = resp.get("output_token_times") if isinstance(resp.get("output_token_times"), list) else []
        chunks = resp.get("chunk_times") if isinstance(resp.get("chunk_times"), list) and resp["chunk_times"] \
            else token_times
        ttft = None
        if token_times:
            ttft = (number(token_times[0], "output_token_times", allow_none=False) - start) * 1000.0
            if ttft < 0:
                raise Bad("output_token_times", "first token before the request started")
        gaps = [(number(b, "chunk_times", allow_none=False) - number(a, "chunk_times", allow_none=False)) * 1000.0
                for a, b in zip(chunks, chunks[1:], strict=False)] if chunks else None
        row.update({"measured_ttft_ms": ttft, "measured_e2e_ms": e2e, "measured_tpot_ms": tpot_ms(e2e, ttft, n_out),
                    "measured_itl_ms": gaps if token_times else None,
                    "measured_itl_mean_ms": sum(gaps) / len(gaps) if gaps else None})
        return row

    def items(self) -> Iterator[Item]:
        return self.each((i, None, r) for i, r in enumerate(self.doc))

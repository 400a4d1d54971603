"""OpenTelemetry GenAI spans in OTLP JSON (a collector's file exporter: one
``{"resourceSpans": [...]}`` export per line, or one document).

A span is a request when it carries ``gen_ai.usage.input_tokens`` (GenAI semantic conventions);
other spans (HTTP, tools, agents) are skipped. Arrival = ``startTimeUnixNano`` (epoch ns,
rebased); E2E = ``endTimeUnixNano - startTimeUnixNano``; tokens from ``gen_ai.usage.input_tokens``
/ ``gen_ai.usage.output_tokens``; cached from ``gen_ai.usage.cache_read.input_tokens``; model from
``gen_ai.response.model`` (else ``gen_ai.request.model``); session from
``gen_ai.conversation.id``; request type from ``gen_ai.operation.name``; request id from
``gen_ai.response.id`` (else the span id). The conventions define no TTFT span attribute, so
none is read. Spans with ``status.code`` 2 (error) get output length 0 (``--drop-failed``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import ReaderInfo
from .records import Bad, Item, RecordReader, duration_ms, load_json_document, number

_EXTRAS = ("measured_e2e_ms", "measured_cached_tokens", "model", "request_type")


def attributes(span: dict) -> dict[str, Any]:
    """OTLP ``[{key, value: {stringValue|intValue|doubleValue|boolValue}}]`` -> ``{key: value}``."""
    out: dict[str, Any] = {}
    for attr in span.get("attributes") or []:
        if not isinstance(attr, dict) or not isinstance(attr.get("value"), dict):
            continue
        value = attr["value"]
        for kind in ("stringValue", "intValue", "doubleValue", "boolValue"):
            if kind in value:
                v = value[kind]
                out[attr.get("key")] = int(v) if kind == "intValue" and isinstance(v, str) and v.lstrip("-").isdigit() \
                    else v
                break
    return out


def spans(export: dict) -> Iterator[dict]:
    for rs in export.get("resourceSpans") or []:
        for ss in (rs or {}).get("scopeSpans") or []:
            yield from (ss or {}).get("spans") or []


class OtelReader(RecordReader):
    name = "otel"

    def info(self) -> ReaderInfo:
        return ReaderInfo(
            source_format=self.name, time_unit="ns", rebase=True, wallclock=True, hash_block_size=None,
            prefix_identity="absent", hash_ids_required=False,
            field_names={"t_ms": "startTimeUnixNano", "input_tokens": "gen_ai.usage.input_tokens",
                         "output_tokens": "gen_ai.usage.output_tokens", "request_id": "gen_ai.response.id",
                         "session_id": "gen_ai.conversation.id"},
            notes=["OTLP JSON GenAI spans (those with gen_ai.usage.input_tokens); E2E = span duration; no TTFT"],
            extra_columns=_EXTRAS, source_run={"tool": "opentelemetry"},
        )

    def _row(self, span: dict) -> dict[str, Any]:
        a = attributes(span)
        start = number(span.get("startTimeUnixNano"), "startTimeUnixNano", allow_none=False) * 1e-6
        end = number(span.get("endTimeUnixNano"), "endTimeUnixNano")
        failed = (span.get("status") or {}).get("code") in (2, "STATUS_CODE_ERROR")
        rid = a.get("gen_ai.response.id") or span.get("spanId")
        return {"request_id": None if rid is None else str(rid),
                "session_id": a.get("gen_ai.conversation.id"), "t_ms": round(start),
                "input_tokens": number(a.get("gen_ai.usage.input_tokens"), "gen_ai.usage.input_tokens", integer=True),
                "output_tokens": 0 if failed else number(a.get("gen_ai.usage.output_tokens"),
                                                         "gen_ai.usage.output_tokens", integer=True),
                "measured_e2e_ms": duration_ms(start, None if end is None else end * 1e-6, "endTimeUnixNano"),
                "measured_cached_tokens": number(a.get("gen_ai.usage.cache_read.input_tokens"),
                                                 "gen_ai.usage.cache_read.input_tokens", integer=True),
                "model": a.get("gen_ai.response.model") or a.get("gen_ai.request.model"),
                "request_type": a.get("gen_ai.operation.name")}

    def items(self) -> Iterator[Item]:
        doc = load_json_document(self.path)
        exports = doc if isinstance(doc, list) else [doc]
        k = -1  # index among GenAI spans
        for export in exports:
            if not isinstance(export, dict):
                continue
            for span in spans(export):
                if not isinstance(span, dict) or "gen_ai.usage.input_tokens" not in attributes(span):
                    continue
                k += 1
                try:
                    yield Item(k, None, self._row(span))
                except Bad as bad:
                    yield self.reject(k, None, bad, span)

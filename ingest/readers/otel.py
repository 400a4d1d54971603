"""Request spans: OpenTelemetry GenAI spans and vLLM's own ``llm_request`` spans, as OTLP JSON (a
collector's file exporter, one ``{"resourceSpans": [...]}`` per line or one document), as Grafana
Tempo returns a trace (``{"batches": [...]}`` or ``{"trace": {"resourceSpans": [...]}}``, with
``scopeSpans`` or the older ``instrumentationLibrarySpans``) or as Jaeger's JSON export
(``{"data": [{"traceID", "spans": [{"tags": [{"key", "type", "value"}], "startTime" (us),
"duration" (us)}]}]}``).

A span is a request when it carries an input token count: ``gen_ai.usage.input_tokens`` (GenAI
semantic conventions) or ``gen_ai.usage.prompt_tokens`` (what vLLM writes, with
``gen_ai.usage.completion_tokens``); every other span (HTTP, tools, agents) is skipped and counted.
Arrival = span start (vLLM starts its span at the request's arrival; epoch, rebased). vLLM's
``gen_ai.latency.*`` attributes (seconds, every version since tracing was added: 0.5 to the V1
engine) become measured columns: ``time_to_first_token`` -> TTFT, ``e2e`` -> E2E (else the span's
duration), ``time_in_queue`` -> queue, ``time_in_model_prefill`` -> prefill (first scheduled to
first token), ``time_in_model_decode`` -> decode (first to last token). Request id =
``gen_ai.response.id``, else ``gen_ai.request.id`` (vLLM), else the span id; model =
``gen_ai.response.model`` (else ``gen_ai.request.model``); session = ``gen_ai.conversation.id``;
request type = ``gen_ai.operation.name``; cached = ``gen_ai.usage.cache_read.input_tokens``.
Error spans (OTLP ``status.code`` 2, Jaeger tag ``error`` or ``otel.status_code`` ERROR) get
output length 0 (``--drop-failed``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from replay.base.errors import TraceError

from .base import ReaderInfo
from .json_report import load_json_report
from .records import Bad, Item, RecordReader, duration_ms, number, to_ms, tpot_ms

_EXTRAS = ("measured_ttft_ms", "measured_e2e_ms", "measured_tpot_ms", "measured_cached_tokens",
           "measured_queue_ms", "measured_prefill_ms", "measured_decode_ms", "model", "request_type")
INPUT_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
OUTPUT_KEYS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
# vLLM's gen_ai.latency.* attributes (seconds) -> measured columns
LATENCIES = {"gen_ai.latency.time_to_first_token": "measured_ttft_ms",
             "gen_ai.latency.time_in_queue": "measured_queue_ms",
             "gen_ai.latency.time_in_model_prefill": "measured_prefill_ms",
             "gen_ai.latency.time_in_model_decode": "measured_decode_ms"}
NOT_A_REQUEST = "spans without an input token count (gen_ai.usage.input_tokens / prompt_tokens): not model requests"


@dataclass
class Span:
    """One span in any of the export shapes: times in ms since the epoch, attributes flattened."""

    span_id: str | None
    start_ms: float
    end_ms: float | None
    attributes: dict[str, Any]
    failed: bool


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


def jaeger_tags(span: dict) -> dict[str, Any]:
    """Jaeger ``[{key, type, value}]`` -> ``{key: value}``."""
    return {t.get("key"): t.get("value") for t in span.get("tags") or [] if isinstance(t, dict)}


def _otlp_span(span: dict) -> Span:
    start = number(span.get("startTimeUnixNano"), "startTimeUnixNano", allow_none=False) * 1e-6
    end = number(span.get("endTimeUnixNano"), "endTimeUnixNano")
    status = span.get("status") or {}
    failed = isinstance(status, dict) and status.get("code") in (2, "STATUS_CODE_ERROR")
    return Span(span.get("spanId"), start, None if end is None else end * 1e-6, attributes(span), failed)


def _jaeger_span(span: dict) -> Span:
    start = number(span.get("startTime"), "startTime", allow_none=False) * 1e-3
    duration = number(span.get("duration"), "duration")
    tags = jaeger_tags(span)
    failed = tags.get("error") in (True, "true") or str(tags.get("otel.status_code", "")).upper() == "ERROR"
    return Span(span.get("spanID"), start, None if duration is None else start + duration * 1e-3, tags, failed)


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def raw_spans(doc: Any) -> Iterator[tuple[str, dict]]:
    """(shape, span object) for every span of a document in any supported export shape."""
    if isinstance(doc, list):
        for part in doc:
            yield from raw_spans(part)
        return
    if not isinstance(doc, dict):
        return
    if isinstance(doc.get("trace"), dict):  # Tempo v2 API
        yield from raw_spans(doc["trace"])
    for key in ("resourceSpans", "batches"):  # OTLP JSON; Tempo v1 API
        for rs in _list(doc.get(key)):
            if not isinstance(rs, dict):
                continue
            for scope in _list(rs.get("scopeSpans")) + _list(rs.get("instrumentationLibrarySpans")):
                for span in _list(scope.get("spans")) if isinstance(scope, dict) else []:
                    yield "otlp", span
    for trace in _list(doc.get("data")):  # Jaeger
        for span in _list(trace.get("spans")) if isinstance(trace, dict) else []:
            yield "jaeger", span


class OtelReader(RecordReader):
    name = "otel"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        self.doc = load_json_report(self.path, "span export")
        shapes = {shape for shape, _ in raw_spans(self.doc)}
        if not shapes:
            raise TraceError("no spans found: expected OTLP JSON (resourceSpans), a Tempo trace (batches) or a "
                             "Jaeger export (data[].spans)", path=str(self.path))
        self.shape = "jaeger" if shapes == {"jaeger"} else "otlp"

    def info(self) -> ReaderInfo:
        return ReaderInfo(
            source_format=self.name, time_unit="us" if self.shape == "jaeger" else "ns", rebase=True,
            wallclock=True, hash_block_size=None, prefix_identity="absent", hash_ids_required=False,
            field_names={"t_ms": "startTime" if self.shape == "jaeger" else "startTimeUnixNano",
                         "input_tokens": "gen_ai.usage.input_tokens/prompt_tokens",
                         "output_tokens": "gen_ai.usage.output_tokens/completion_tokens",
                         "request_id": "gen_ai.response.id/gen_ai.request.id",
                         "session_id": "gen_ai.conversation.id"},
            notes=["request spans (those with an input token count); vLLM's gen_ai.latency.* kept as measured "
                   "TTFT, queue, prefill and decode times; E2E = gen_ai.latency.e2e, else the span duration"],
            extra_columns=_EXTRAS, source_run={"tool": "opentelemetry"},
            failed_as=("an error span: Jaeger tag error or otel.status_code ERROR" if self.shape == "jaeger"
                       else "an error span: status.code 2"),
        )

    def _row(self, span: Span) -> dict[str, Any]:
        a = span.attributes
        n_in, in_key = next(((a[k], k) for k in INPUT_KEYS if a.get(k) is not None), (None, INPUT_KEYS[0]))
        n_out, out_key = next(((a[k], k) for k in OUTPUT_KEYS if a.get(k) is not None), (None, OUTPUT_KEYS[0]))
        rid = a.get("gen_ai.response.id") or a.get("gen_ai.request.id") or span.span_id
        row: dict[str, Any] = {
            "request_id": None if rid is None else str(rid), "session_id": a.get("gen_ai.conversation.id"),
            "t_ms": round(span.start_ms),
            "input_tokens": number(n_in, in_key, integer=True),
            "output_tokens": 0 if span.failed else number(n_out, out_key, integer=True),
            "measured_cached_tokens": number(a.get("gen_ai.usage.cache_read.input_tokens"),
                                             "gen_ai.usage.cache_read.input_tokens", integer=True),
            "model": a.get("gen_ai.response.model") or a.get("gen_ai.request.model"),
            "request_type": a.get("gen_ai.operation.name")}
        for key, column in LATENCIES.items():
            row[column] = to_ms(a.get(key), "s", key)
        e2e = to_ms(a.get("gen_ai.latency.e2e"), "s", "gen_ai.latency.e2e")
        row["measured_e2e_ms"] = e2e if e2e is not None else duration_ms(span.start_ms, span.end_ms, "end time")
        row["measured_tpot_ms"] = tpot_ms(row["measured_e2e_ms"], row["measured_ttft_ms"], row["output_tokens"])
        return row

    def items(self) -> Iterator[Item]:
        k = -1  # index among request spans
        for shape, raw in raw_spans(self.doc):
            if not isinstance(raw, dict):
                self.skip("span entries that are not JSON objects")
                continue
            keys = attributes(raw) if shape == "otlp" else jaeger_tags(raw)
            if not any(keys.get(key) is not None for key in INPUT_KEYS):
                self.skip(NOT_A_REQUEST)
                continue
            k += 1
            try:
                span = _otlp_span(raw) if shape == "otlp" else _jaeger_span(raw)
                yield Item(k, None, self._row(span))
            except Bad as bad:
                yield self.reject(k, None, bad, raw)

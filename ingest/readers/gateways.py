"""Gateway / observability logs with recorded token counts and times: LiteLLM spend logs,
Langfuse generations, Helicone requests. Each as a JSON array or JSON Lines of flat-ish records,
read as far as the tools' public export schemas go (field names below). Token counts are the
recorded ones; times are wall clock (ISO-8601, zone-less = UTC) rebased to the first request.
No prompt text is hashed (exports often omit or truncate it): prefix identity is absent.

| tool | arrival | TTFT | E2E | tokens | cached | labels |
|---|---|---|---|---|---|---|
| LiteLLM ``LiteLLM_SpendLogs`` | ``startTime`` | ``completionStartTime - startTime`` (none when it equals ``endTime``) | ``endTime - startTime`` | ``prompt_tokens``, ``completion_tokens`` | ``metadata.usage_object.prompt_tokens_details.cached_tokens`` | ``model``, ``team_id``/``user``/``end_user`` -> tenant, ``call_type`` -> request_type, ``session_id`` |
| Langfuse observations | ``startTime`` | ``completionStartTime - startTime`` (or ``timeToFirstToken`` s) | ``endTime - startTime`` (or ``latency`` s) | ``usageDetails.input``/``output`` (or ``usage``, ``promptTokens``) | ``usageDetails.input_cached_tokens``/``cache_read_input_tokens`` | ``model``, ``userId`` -> tenant, ``name`` -> request_type, ``sessionId`` (else ``traceId``) |
| Helicone requests | ``request_created_at`` | ``time_to_first_token`` ms | ``delay_ms`` (else ``response_created_at - request_created_at``) | ``prompt_tokens``, ``completion_tokens`` | ``prompt_cache_read_tokens`` | ``model``, ``request_user_id`` -> tenant, ``request_path`` -> request_type |

Failed requests (LiteLLM ``status: failure``, Langfuse ``level: ERROR``, Helicone
``response_status`` >= 400) get output length 0 (``--drop-failed`` drops and counts them).

LiteLLM writes ``completionStartTime = endTime`` when a response was not streamed (LiteLLM's
``litellm_core_utils/litellm_logging.py`` sets the completion start to the end time when no chunk
set it): for a request of more than one output token that is no first-token time, so TTFT and
TPOT stay empty and E2E is kept. Langfuse observations of other types than ``GENERATION``
(``SPAN``, ``EVENT``, and the agent, tool and retriever types of recent versions) are not model
calls: they are skipped and counted, as are the spans of other operations in request spans.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from replay.base.errors import TraceError

from .base import ReaderInfo
from .records import (
    Bad,
    Item,
    RecordReader,
    duration_ms,
    first,
    iso_ms,
    load_json_document,
    number,
    to_ms,
    tpot_ms,
)

_EXTRAS = ("measured_ttft_ms", "measured_e2e_ms", "measured_tpot_ms", "measured_cached_tokens",
           "model", "tenant", "request_type")


class GatewayReader(RecordReader):
    """Shared loop; subclasses map one record to a staged row (``_fields``); TPOT is derived here."""

    fields: ClassVar[dict[str, str]] = {}
    tool: ClassVar[str] = ""
    failed_as: ClassVar[str] = ""  # the tool's failure marker, named when a zero output is refused
    notes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        doc = load_json_document(self.path)
        if isinstance(doc, dict):  # {"data": [...]} pages of the tools' APIs
            doc = doc.get("data", [doc]) if isinstance(doc.get("data"), list) else [doc]
        if not isinstance(doc, list):
            raise TraceError(f"expected {self.tool} records as a JSON array or JSON Lines", path=str(self.path))
        self.doc = doc

    def info(self) -> ReaderInfo:
        return ReaderInfo(
            source_format=self.name, time_unit="iso", rebase=True, wallclock=True, hash_block_size=None,
            prefix_identity="absent", hash_ids_required=False, field_names=dict(self.fields),
            notes=[f"{self.tool} export: recorded token counts and times; TPOT = (E2E - TTFT) / (output - 1)",
                   *self.notes],
            extra_columns=_EXTRAS, source_run={"tool": self.tool}, failed_as=self.failed_as,
        )

    def _fields(self, obj: dict) -> dict[str, Any]:
        raise NotImplementedError

    def _row(self, obj: dict) -> dict[str, Any]:
        row = self._fields(obj)
        row["measured_tpot_ms"] = tpot_ms(row.get("measured_e2e_ms"), row.get("measured_ttft_ms"),
                                          row.get("output_tokens"))
        return row

    def items(self) -> Iterator[Item]:
        return self.each((i, None, obj) for i, obj in enumerate(self.doc))


def _sid(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _start_ms(obj: dict, key: str) -> float:
    """The request's start (the arrival) as epoch ms; a row without one cannot be placed in time."""
    start = iso_ms(obj.get(key), key)
    if start is None:
        raise Bad(key, "missing timestamp")
    return start


class LiteLLMReader(GatewayReader):
    name = "litellm"
    tool = "LiteLLM spend logs"
    failed_as = "status 'failure'"
    notes = ("completionStartTime equal to endTime (a response that was not streamed) is no first-token "
             "time: TTFT and TPOT left empty for such requests of more than one output token",)
    fields = {"t_ms": "startTime", "input_tokens": "prompt_tokens", "output_tokens": "completion_tokens",
              "request_id": "request_id", "session_id": "session_id"}

    def _fields(self, obj: dict) -> dict[str, Any]:
        start = _start_ms(obj, "startTime")
        end = iso_ms(obj.get("endTime"), "endTime")
        first_tok = iso_ms(obj.get("completionStartTime"), "completionStartTime")
        failed = str(obj.get("status") or "success").lower() == "failure"
        n_out = 0 if failed else number(obj.get("completion_tokens"), "completion_tokens", integer=True)
        if first_tok is not None and first_tok == end and (n_out or 0) > 1:
            first_tok = None  # not streamed: LiteLLM logs the end time as the completion start
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        cached, where = first(meta, "usage_object.prompt_tokens_details.cached_tokens",
                              "usage_object.cache_read_input_tokens")
        tenant = next((obj[k] for k in ("team_id", "user", "end_user") if obj.get(k)), None)
        return {"request_id": _sid(obj.get("request_id")), "session_id": _sid(obj.get("session_id")),
                "t_ms": round(start),
                "input_tokens": number(obj.get("prompt_tokens"), "prompt_tokens", integer=True),
                "output_tokens": n_out,
                "measured_ttft_ms": duration_ms(start, first_tok, "completionStartTime"),
                "measured_e2e_ms": duration_ms(start, end, "endTime"),
                "measured_cached_tokens": number(cached, f"metadata.{where}", integer=True),
                "model": obj.get("model"), "tenant": _sid(tenant), "request_type": obj.get("call_type")}


class LangfuseReader(GatewayReader):
    name = "langfuse"
    tool = "Langfuse observations"
    failed_as = "level 'ERROR'"
    fields = {"t_ms": "startTime", "input_tokens": "usageDetails.input", "output_tokens": "usageDetails.output",
              "request_id": "id", "session_id": "sessionId"}

    def _fields(self, obj: dict) -> dict[str, Any]:
        start = _start_ms(obj, "startTime")
        n_in, f_in = first(obj, "usageDetails.input", "usage.input", "promptTokens")
        n_out, f_out = first(obj, "usageDetails.output", "usage.output", "completionTokens")
        cached, f_c = first(obj, "usageDetails.input_cached_tokens", "usageDetails.cache_read_input_tokens",
                            "usageDetails.input_cache_read")
        ttft = duration_ms(start, iso_ms(obj.get("completionStartTime"), "completionStartTime"), "completionStartTime")
        if ttft is None and obj.get("timeToFirstToken") is not None:
            ttft = to_ms(obj["timeToFirstToken"], "s", "timeToFirstToken")
        e2e = duration_ms(start, iso_ms(obj.get("endTime"), "endTime"), "endTime")
        if e2e is None and obj.get("latency") is not None:
            e2e = to_ms(obj["latency"], "s", "latency")
        failed = str(obj.get("level") or "").upper() == "ERROR"
        return {"request_id": _sid(obj.get("id")), "session_id": _sid(obj.get("sessionId") or obj.get("traceId")),
                "t_ms": round(start), "input_tokens": number(n_in, f_in, integer=True),
                "output_tokens": 0 if failed else number(n_out, f_out, integer=True),
                "measured_ttft_ms": ttft, "measured_e2e_ms": e2e,
                "measured_cached_tokens": number(cached, f_c, integer=True),
                "model": obj.get("model"), "tenant": _sid(obj.get("userId")), "request_type": obj.get("name")}

    def items(self) -> Iterator[Item]:
        """Generations only: a span or event observation wraps or annotates model calls, it is none."""
        for i, obj in enumerate(self.doc):
            kind = obj.get("type") if isinstance(obj, dict) else None
            if isinstance(kind, str) and kind.upper() != "GENERATION":
                self.skip(f"observations of type {kind.upper()}, not model generations")
                continue
            yield from self.each([(i, None, obj)])


class HeliconeReader(GatewayReader):
    name = "helicone"
    tool = "Helicone requests"
    failed_as = "response_status 400 or more"
    fields = {"t_ms": "request_created_at", "input_tokens": "prompt_tokens", "output_tokens": "completion_tokens",
              "request_id": "request_id"}

    def _fields(self, obj: dict) -> dict[str, Any]:
        start = _start_ms(obj, "request_created_at")
        e2e = to_ms(obj.get("delay_ms"), "ms", "delay_ms")
        if e2e is None:
            e2e = duration_ms(start, iso_ms(obj.get("response_created_at"), "response_created_at"),
                              "response_created_at")
        status = obj.get("response_status")
        failed = isinstance(status, int) and status >= 400
        return {"request_id": _sid(obj.get("request_id")), "t_ms": round(start),
                "input_tokens": number(obj.get("prompt_tokens"), "prompt_tokens", integer=True),
                "output_tokens": 0 if failed else number(obj.get("completion_tokens"), "completion_tokens",
                                                         integer=True),
                "measured_ttft_ms": to_ms(obj.get("time_to_first_token"), "ms", "time_to_first_token"),
                "measured_e2e_ms": e2e,
                "measured_cached_tokens": number(obj.get("prompt_cache_read_tokens"), "prompt_cache_read_tokens",
                                                 integer=True),
                "model": obj.get("model") or obj.get("response_model") or obj.get("request_model"),
                "tenant": _sid(obj.get("request_user_id")), "request_type": obj.get("request_path")}

"""aiperf ``profile_export.jsonl``: one nested record per request (aiperf's ``MetricRecordInfo``).

``metadata``: ``x_request_id`` (request id), ``x_correlation_id`` (the user session, shared by the
turns of a multi-turn conversation), ``turn_index`` (0-based), ``request_start_ns`` (epoch ns, the
arrival; rebased), ``was_cancelled``. ``metrics``: ``{"value", "unit"}`` pairs; used here
``input_sequence_length``, ``output_sequence_length`` (else ``output_token_count``),
``time_to_first_token``, ``request_latency`` (E2E), ``inter_token_latency`` (aiperf's per-request
(E2E - TTFT) / (OSL - 1), i.e. TPOT) and ``inter_chunk_latency`` (every gap). A record with an
``error`` (or cancelled) is a failed request: output length 0, dropped by ``--drop-failed``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import ReaderInfo
from .records import Bad, Item, RecordReader, json_lines, number, to_ms

_EXTRAS = ("measured_ttft_ms", "measured_e2e_ms", "measured_tpot_ms", "measured_itl_ms", "measured_itl_mean_ms")


def metric(metrics: dict, name: str, *, ms: bool = False, integer: bool = False) -> Any:
    """A metric's value (durations converted to ms by their unit), or None when absent."""
    entry = metrics.get(name)
    if entry is None:
        return None
    field = f"metrics.{name}"
    if not isinstance(entry, dict) or "value" not in entry:
        raise Bad(field, "expected {\"value\": ..., \"unit\": ...}")
    value, unit = entry["value"], entry.get("unit") or "ms"
    if isinstance(value, list):
        return [to_ms(v, unit, field) for v in value] if ms else [number(v, field) for v in value]
    return to_ms(value, unit, field) if ms else number(value, field, integer=integer)


class AiperfReader(RecordReader):
    name = "aiperf"

    def info(self) -> ReaderInfo:
        return ReaderInfo(
            source_format=self.name, time_unit="ns", rebase=True, wallclock=True, hash_block_size=None,
            prefix_identity="absent", hash_ids_required=False,
            field_names={"t_ms": "metadata.request_start_ns", "input_tokens": "metrics.input_sequence_length",
                         "output_tokens": "metrics.output_sequence_length", "request_id": "metadata.x_request_id",
                         "session_id": "metadata.x_correlation_id"},
            notes=["aiperf per-request records; arrivals from request_start_ns",
                   "measured_tpot_ms = aiperf inter_token_latency; measured_itl_ms = inter_chunk_latency"],
            extra_columns=_EXTRAS, source_run={"tool": "aiperf"},
            failed_as="the record has an 'error', or metadata.was_cancelled",
        )

    def _row(self, obj: dict) -> dict[str, Any]:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise Bad("metadata", "missing metadata object")
        metrics = obj.get("metrics") or {}
        if not isinstance(metrics, dict):
            raise Bad("metrics", "expected an object")
        start = number(meta.get("request_start_ns"), "metadata.request_start_ns", allow_none=False)
        failed = obj.get("error") is not None or bool(meta.get("was_cancelled"))
        isl = metric(metrics, "input_sequence_length", integer=True)
        if isl is None:
            isl = metric(metrics, "error_isl", integer=True)
        osl = metric(metrics, "output_sequence_length", integer=True)
        if osl is None:
            osl = metric(metrics, "output_token_count", integer=True)
        turn = meta.get("turn_index")
        row: dict[str, Any] = {
            "request_id": meta.get("x_request_id"),
            "session_id": meta.get("x_correlation_id") if meta.get("turn_index") is not None else None,
            "turn": None if turn is None else number(turn, "metadata.turn_index", integer=True) + 1,
            "t_ms": round(start * 1e-6),
            "input_tokens": isl,
            "output_tokens": 0 if failed else osl,
        }
        if failed:
            return row
        gaps = metric(metrics, "inter_chunk_latency", ms=True)
        row.update({
            "measured_ttft_ms": metric(metrics, "time_to_first_token", ms=True),
            "measured_e2e_ms": metric(metrics, "request_latency", ms=True),
            "measured_tpot_ms": metric(metrics, "inter_token_latency", ms=True),
            "measured_itl_ms": gaps,
            "measured_itl_mean_ms": (sum(gaps) / len(gaps)) if gaps else None,
        })
        return row

    def items(self) -> Iterator[Item]:
        return self.each(json_lines(self.path))

"""Serving-benchmark result files: ``vllm bench serve --save-result --save-detailed`` and SGLang
``bench_serving --output-details``.

Both write one object per benchmark run holding per-request arrays (index i is request i):
``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (list of s per request), ``errors``;
vLLM adds ``latencies`` (E2E, s) and ``start_times`` (client send times, ``time.perf_counter``
seconds). Times become ms; arrivals are ``start_times`` rebased to the first request, or absent
(SGLang, older vLLM), in which case every arrival is 0 and the trace must be replayed with a load
mode. The run's settings (backend, model, request rate, max concurrency, spec-decode counters,
which vLLM reads from the server's Prometheus counters for the whole run) are kept as
``source_run``. Failed requests have output length 0: ``--drop-failed`` drops and counts them.
``request_ids`` (written by ``replay export``, not by vLLM) names the requests when present.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from replay.base.errors import TraceError

from .base import ReaderInfo
from .records import Bad, Item, RecordReader, load_json_document, number, tpot_ms

_RUN_KEYS = ("date", "backend", "endpoint_type", "label", "model_id", "tokenizer_id", "num_prompts",
             "request_rate", "burstiness", "max_concurrency", "dataset_name", "duration", "completed",
             "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
             "spec_decode_draft_tokens", "spec_decode_accepted_tokens", "spec_decode_per_position_acceptance_rates")
_EXTRAS = ("measured_ttft_ms", "measured_e2e_ms", "measured_tpot_ms", "measured_itl_ms", "measured_itl_mean_ms",
           "model")


def _finite(value: Any) -> Any:
    """JSON-safe run settings (``inf`` request rates are written as Infinity by Python's json)."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf"
    return value


class BenchResultReader(RecordReader):
    """Common parsing of per-request arrays; subclasses name the tool."""

    tool: ClassVar[str] = ""

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        doc = load_json_document(self.path)
        if isinstance(doc, list):
            if len(doc) != 1:
                raise TraceError(f"{len(doc)} benchmark runs in one file (one per line); keep the run to "
                                 "compare in a file of its own", path=str(self.path))
            doc = doc[0]
        if not isinstance(doc, dict) or not isinstance(doc.get("input_lens"), list):
            raise TraceError(f"not a {self.tool} result with per-request details (no 'input_lens' array; "
                             "run the benchmark with its detailed-output flag)", path=str(self.path))
        self.doc = doc
        n = len(doc["input_lens"])
        for key in ("output_lens", "ttfts", "itls", "latencies", "start_times", "errors", "request_ids"):
            if doc.get(key) is not None and (not isinstance(doc[key], list) or len(doc[key]) != n):
                raise TraceError(f"'{key}' has {len(doc[key]) if isinstance(doc[key], list) else 'no'} entries "
                                 f"but 'input_lens' has {n}", path=str(self.path), field=key)
        self.timed = isinstance(doc.get("start_times"), list)

    def info(self) -> ReaderInfo:
        run = {"tool": self.tool, **{k: _finite(self.doc[k]) for k in _RUN_KEYS if k in self.doc}}
        notes = [f"{self.tool} per-request arrays; times converted from s to ms",
                 "TPOT = (E2E - TTFT) / (output - 1), as the tool computes it"]
        if not self.timed:
            notes.append("no per-request start times: arrivals are 0, replay with load.mode concurrency or poisson")
        return ReaderInfo(
            source_format=self.name, time_unit="s", rebase=True, wallclock=False, hash_block_size=None,
            prefix_identity="absent", hash_ids_required=False, generated_ids="request_ids" not in self.doc,
            field_names={"t_ms": "start_times", "input_tokens": "input_lens", "output_tokens": "output_lens"},
            notes=notes, extra_columns=_EXTRAS, source_run=run, no_timestamps=not self.timed,
        )

    def _row(self, i: int) -> dict[str, Any]:
        d = self.doc
        error = (d.get("errors") or [None] * (i + 1))[i]
        out = number(d["output_lens"][i], f"output_lens[{i}]", integer=True) if d.get("output_lens") else None
        row: dict[str, Any] = {
            "request_id": str(d["request_ids"][i]) if d.get("request_ids") else None,
            "t_ms": 0,
            "input_tokens": number(d["input_lens"][i], f"input_lens[{i}]", integer=True, allow_none=False),
            "output_tokens": 0 if error else out,
            "model": d.get("model_id"),
        }
        if self.timed:
            start = number(d["start_times"][i], f"start_times[{i}]")
            row["t_ms"] = None if start is None else round(start * 1000.0)
        if error:
            return row
        ttft = number(d["ttfts"][i], f"ttfts[{i}]") if d.get("ttfts") else None
        itls = d["itls"][i] if d.get("itls") else None
        if itls is not None and not isinstance(itls, list):
            raise Bad(f"itls[{i}]", "expected a list of inter-token gaps")
        itl_ms = [number(x, f"itls[{i}]", allow_none=False) * 1000.0 for x in itls] if itls is not None else None
        ttft_ms = None if ttft is None else ttft * 1000.0
        lat = number(d["latencies"][i], f"latencies[{i}]") if d.get("latencies") else None
        if lat is not None:
            e2e_ms = lat * 1000.0
        elif ttft_ms is not None and itl_ms is not None:
            e2e_ms = ttft_ms + sum(itl_ms)  # last chunk time - send time, as both tools measure latency
        else:
            e2e_ms = None
        row.update({
            "measured_ttft_ms": ttft_ms, "measured_e2e_ms": e2e_ms,
            "measured_tpot_ms": tpot_ms(e2e_ms, ttft_ms, out),
            "measured_itl_ms": itl_ms,
            "measured_itl_mean_ms": (sum(itl_ms) / len(itl_ms)) if itl_ms else None,
        })
        return row

    def items(self) -> Iterator[Item]:
        for i in range(len(self.doc["input_lens"])):
            try:
                yield Item(i, None, self._row(i))
            except Bad as bad:
                yield self.reject(i, None, bad)


class VllmBenchReader(BenchResultReader):
    name = "vllm-bench"
    tool = "vllm bench serve"


class SglangBenchReader(BenchResultReader):
    name = "sglang-bench"
    tool = "sglang bench_serving"

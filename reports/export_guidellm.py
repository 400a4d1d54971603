"""``replay export --format guidellm``: a replay as a GuideLLM benchmark report (``benchmarks.json``).

The layout is GuideLLM's from 0.4 on (``{"metadata", "args", "benchmarks": [{"config": {"strategy"},
"requests": {"successful", "incomplete", "errored"}}]}``), with each request's ``info.timings``
(epoch seconds: ``request_start``, ``first_token_iteration``, ``last_token_iteration``,
``request_end``) and the computed fields GuideLLM writes beside them (``prompt_tokens``,
``output_tokens``, ``time_to_first_token_ms``, ``inter_token_latency_ms``,
``time_per_output_token_ms``, ``request_latency``, ``cached_tokens``), so scripts that read
GuideLLM's per-request results read a prediction the same way. The benchmark-level ``metrics``
summaries and scheduler state are not written: GuideLLM's own loader may ask for them.

A replay of a trace ingested from a GuideLLM report keeps one benchmark per ``source_run`` (with
that benchmark's strategy from the trace's run settings); any other replay is one benchmark whose
strategy is the replay's load mode (``poisson``, ``concurrent``; ``trace`` for recorded arrivals).
Unfinished requests are ``incomplete``, rejected ones ``errored`` with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

STATUSES = ("successful", "incomplete", "errored")


def _strategy_for_load(info: dict[str, Any]) -> dict[str, Any]:
    load = (info.get("config") or {}).get("load") or {}
    mode = load.get("mode")
    if mode == "poisson":
        return {"type_": "poisson", "rate": float(load.get("rate") or 0.0)}
    if mode == "concurrency":
        return {"type_": "concurrent", "streams": int(load.get("concurrency") or 1)}
    return {"type_": "trace"}


def _strategy_for_label(label: str, runs: list[dict]) -> dict[str, Any]:
    """A benchmark's strategy from the trace's ``source_run`` settings (GuideLLM ingest)."""
    run = next((r for r in runs if r.get("source_run") == label), {})
    kind = run.get("strategy") or label.split("@")[0]
    out: dict[str, Any] = {"type_": kind}
    if run.get("request_rate") is not None:
        out["rate"] = run["request_rate"]
    if kind == "concurrent" and run.get("max_concurrency") is not None:
        out["streams"] = run["max_concurrency"]
    return out


def _labels(trace_path: Path | None) -> dict[str, str]:
    """request_id -> source_run of the run's trace ({} when the trace has no such label)."""
    if trace_path is None or "source_run" not in pq.read_schema(trace_path).names:
        return {}
    table = pq.read_table(trace_path, columns=["request_id", "source_run"])
    return {rid: run for rid, run in zip(table.column("request_id").to_pylist(),
                                         table.column("source_run").to_pylist(), strict=True) if run is not None}


def _record(r: dict[str, Any], base_s: float) -> tuple[str, dict[str, Any]]:
    """(status list, GuideLLM request record) of one replayed request."""
    start = base_s + r["arrival_ms"] / 1000.0
    finished = r["status"] == "finished"
    n_out = int(r["output_tokens"]) if finished else 0
    # Both from the start, by one path: ttft <= e2e then gives first <= last to the last bit (the end
    # taken as base + finish came out one ulp before the first token of a one-token request).
    first = start + r["ttft_ms"] / 1000.0 if finished else None
    last = start + r["e2e_ms"] / 1000.0 if finished else None
    gaps = list(r["itl_ms"] or [])
    timings = {"request_start": start, "first_token_iteration": first, "last_token_iteration": last,
               "request_end": last, "resolve_start": start, "resolve_end": last if finished else start,
               "token_iterations": len(gaps) + 1 if finished else 0,
               "request_iterations": len(gaps) + 1 if finished else 0}
    status = "successful" if finished else ("incomplete" if r["status"] == "unfinished" else "errored")
    rec: dict[str, Any] = {
        "type_": "generative_request_stats", "request_id": r["request_id"], "request_type": "text_completions",
        "request_args": None, "output": None,
        "info": {"request_id": r["request_id"],
                 "status": {"successful": "completed", "incomplete": "cancelled", "errored": "errored"}[status],
                 "timings": timings,
                 "error": None if finished else (r["reject_reason"] or f"{r['status']} in the replay")},
        "input_metrics": {"text_tokens": int(r["input_tokens"]), "total_tokens": int(r["input_tokens"])},
        "output_metrics": {"text_tokens": n_out, "total_tokens": n_out},
        "request_start_time": start, "request_end_time": timings["resolve_end"],
        "request_latency": (last - start) if finished else None,
        "prompt_tokens": int(r["input_tokens"]), "input_tokens": int(r["input_tokens"]), "output_tokens": n_out,
        "total_tokens": int(r["input_tokens"]) + n_out,
        "cached_tokens": int(r["cached_tokens"]) if finished else None,
        "time_to_first_token_ms": r["ttft_ms"] if finished else None,
        "time_per_output_token_ms": 1000.0 * (last - start) / n_out if finished and n_out else None,
        "inter_token_latency_ms": 1000.0 * (last - first) / (n_out - 1) if finished and n_out > 1 else None,
    }
    return status, rec


def write_guidellm(batches: Iterable[pa.RecordBatch], info: dict[str, Any], meta: Any, base_s: float,
                   trace_path: Path | None, out: TextIO, json_list: Callable[[], Any]) -> None:
    """The replay's request batches (``reports.export``'s stream, with ``itl_ms``) as a GuideLLM report
    (one JSON document) written to ``out``; ``json_list`` makes the temp-file lists each status
    of each benchmark is gathered in, so memory holds one batch at a time."""
    labels = _labels(trace_path)
    groups: dict[str, dict[str, Any]] = {}
    bounds: dict[str, list[float]] = {}
    for batch in batches:
        for r in batch.to_pylist():
            label = labels.get(r["request_id"], "")
            status, rec = _record(r, base_s)
            lists = groups.setdefault(label, {s: json_list() for s in STATUSES})
            lists[status].extend([rec])
            lo_hi = bounds.setdefault(label, [rec["request_start_time"], rec["request_end_time"]])
            lo_hi[0] = min(lo_hi[0], rec["request_start_time"])
            lo_hi[1] = max(lo_hi[1], rec["request_end_time"])
    runs = ((meta.source_run if meta is not None else None) or {}).get("benchmarks") or []
    config = info.get("config") or {}
    head = {"metadata": {"version": 1, "guidellm_version": None, "written_by": "replay export"},
            "args": {"model": config.get("model"), "profile": "replay", "backend": "replay"}}
    out.write(json.dumps(head)[:-1] + ', "benchmarks": [')
    for i, label in enumerate(groups):
        strategy = _strategy_for_label(label, runs) if label else _strategy_for_load(info)
        bench = {"type_": "generative_benchmark", "id_": f"replay-{i}",
                 "config": {"run_id": "replay", "run_index": i, "strategy": strategy},
                 "start_time": bounds[label][0], "end_time": bounds[label][1]}
        out.write((", " if i else "") + json.dumps(bench)[:-1] + ', "requests": {')
        for k, status in enumerate(STATUSES):
            out.write((", " if k else "") + json.dumps(status) + ": ")
            groups[label][status].copy_to(out)
        out.write("}}")
    out.write("]}\n")

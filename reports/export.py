"""``replay export``: a replay's per-request results in benchmark tools' own result shapes, so a
prediction can sit beside a real benchmark in the tools users already have.

* ``vllm-bench``: the JSON object of ``vllm bench serve --save-result --save-detailed``
  (per-request ``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``latencies``, ``start_times``
  in seconds, ``errors``; run totals and mean/median/p99 in ms), plus ``request_ids`` (not in
  vLLM's file; our reader uses it to match requests back).
* ``aiperf``: ``profile_export.jsonl`` records (``metadata`` with ns times, ``metrics`` as
  ``{"value", "unit"}``, ``error``).

Requests that did not finish are written as the tools write failures (vLLM: empty output and an
error text; aiperf: an ``error`` object and ``error_isl``).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from replay.atomic import check_output_file, write_text_atomic
from replay.errors import ReplayError
from reports.sqlfiles import sql
from reports.views import open_run

FORMATS = ("vllm-bench", "aiperf")


def _rows(outdir: Path) -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
    run = open_run(outdir)
    try:
        cur = run.con.execute(sql("export_requests"))
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        run.con.close()
    return rows, run.info, run.trace_meta


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "std": 0.0, "p99": 0.0}
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std()),
            "p99": float(np.percentile(a, 99))}


def _load_settings(info: dict[str, Any]) -> tuple[Any, Any]:
    load = (info.get("config") or {}).get("load") or {}
    mode = load.get("mode")
    rate = float(load["rate"]) if mode == "poisson" else float("inf")
    return rate, (load.get("concurrency") if mode == "concurrency" else None)


def vllm_bench(outdir: Path) -> str:
    """The replay as a ``vllm bench serve --save-detailed`` result (one JSON object)."""
    rows, info, _meta = _rows(outdir)
    ok = [r["status"] == "finished" for r in rows]
    done = [r for r, good in zip(rows, ok, strict=True) if good]
    start = min((r["arrival_ms"] for r in rows), default=0.0)
    end = max((r["finish_ms"] for r in done), default=start)
    duration = max((end - start) / 1000.0, 1e-9)
    total_in = sum(r["input_tokens"] for r in done)
    total_out = sum(r["output_tokens"] for r in done)
    rate, conc = _load_settings(info)
    config = info.get("config") or {}
    result: dict[str, Any] = {
        "date": "replay",  # no wall-clock date: same replay, same bytes
        "endpoint_type": "replay", "backend": "replay", "label": Path(outdir).name,
        "model_id": config.get("model"), "tokenizer_id": config.get("model"), "num_prompts": len(rows),
        "request_rate": rate, "burstiness": 1.0, "max_concurrency": conc,
        "duration": duration, "completed": len(done), "failed": len(rows) - len(done),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(done) / duration, "request_goodput": None,
        "output_throughput": total_out / duration, "total_token_throughput": (total_in + total_out) / duration,
        "input_lens": [r["input_tokens"] for r in rows],
        "output_lens": [r["output_tokens"] if good else 0 for r, good in zip(rows, ok, strict=True)],
        "ttfts": [r["ttft_ms"] / 1000.0 if good else 0.0 for r, good in zip(rows, ok, strict=True)],
        "itls": [[g / 1000.0 for g in r["itl_ms"]] if good else [] for r, good in zip(rows, ok, strict=True)],
        "latencies": [r["e2e_ms"] / 1000.0 if good else 0.0 for r, good in zip(rows, ok, strict=True)],
        "start_times": [r["arrival_ms"] / 1000.0 for r in rows],
        "generated_texts": ["" for _ in rows],
        "errors": ["" if good else f"{r['status']}: {r['reject_reason'] or 'did not finish in the replay'}"
                   for r, good in zip(rows, ok, strict=True)],
        "request_ids": [r["request_id"] for r in rows],
    }
    for key, values in (("ttft", [r["ttft_ms"] for r in done]),
                        ("tpot", [r["tpot_ms"] for r in done if r["tpot_ms"] is not None]),
                        ("itl", [g for r in done for g in r["itl_ms"]]),
                        ("e2el", [r["e2e_ms"] for r in done])):
        s = _stats(values)
        result.update({f"mean_{key}_ms": s["mean"], f"median_{key}_ms": s["median"], f"std_{key}_ms": s["std"],
                       f"p99_{key}_ms": s["p99"]})
    return json.dumps(result) + "\n"


def _epoch_ms(meta) -> float:
    """Trace start as epoch ms (aiperf times are epoch ns); 0 when the trace has no wall clock."""
    if meta is None or not meta.start_time:
        return 0.0
    return datetime.fromisoformat(meta.start_time.replace("Z", "+00:00")).timestamp() * 1000.0


def aiperf(outdir: Path) -> str:
    """The replay as aiperf ``profile_export.jsonl`` records (one per request)."""
    rows, _info, meta = _rows(outdir)
    base = _epoch_ms(meta)
    lines = []
    for i, r in enumerate(rows):
        start_ns = round((base + r["arrival_ms"]) * 1e6)
        finished = r["status"] == "finished"
        metadata = {"session_num": i, "x_request_id": r["request_id"],
                    "x_correlation_id": r["session_id"] or r["request_id"],
                    "conversation_id": r["session_id"] or r["request_id"],
                    "turn_index": (r["turn"] - 1) if r["turn"] else 0, "request_start_ns": start_ns,
                    "request_ack_ns": None,
                    "request_end_ns": round((base + r["finish_ms"]) * 1e6) if finished else start_ns,
                    "worker_id": "replay", "record_processor_id": "replay", "benchmark_phase": "profiling",
                    "was_cancelled": False, "cancellation_time_ns": None}
        if finished:
            ms = lambda v: {"value": v, "unit": "ms"}  # noqa: E731
            metrics = {"input_sequence_length": {"value": r["input_tokens"], "unit": "tokens"},
                       "time_to_first_token": ms(r["ttft_ms"]), "request_latency": ms(r["e2e_ms"]),
                       "output_token_count": {"value": r["output_tokens"], "unit": "tokens"},
                       "inter_chunk_latency": ms(list(r["itl_ms"])),
                       "output_sequence_length": {"value": r["output_tokens"], "unit": "tokens"}}
            if r["tpot_ms"] is not None:
                metrics["inter_token_latency"] = ms(r["tpot_ms"])
                if r["tpot_ms"] > 0:
                    metrics["output_token_throughput_per_user"] = {"value": 1000.0 / r["tpot_ms"],
                                                                   "unit": "tokens/sec/user"}
            error = None
        else:
            metrics = {"error_isl": {"value": r["input_tokens"], "unit": "tokens"}}
            error = {"code": 503, "type": f"Replay{r['status'].capitalize()}",
                     "message": r["reject_reason"] or "did not finish in the replay"}
        lines.append(json.dumps({"metadata": metadata, "metrics": metrics, "error": error}))
    return "\n".join(lines) + "\n"


def export(outdir: str | Path, fmt: str, dest: str | Path) -> Path:
    """Write the replay in ``outdir`` as ``fmt`` to ``dest`` (atomically); returns ``dest``."""
    from reports.report import run_files

    outdir, dest = Path(outdir), Path(dest)
    if fmt not in FORMATS:
        raise ReplayError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    run = open_run(outdir)
    run.con.close()
    inputs = run_files(outdir) + [run.trace_path]
    check_output_file(dest, inputs)  # before any work: never onto the replay's own files
    text = vllm_bench(outdir) if fmt == "vllm-bench" else aiperf(outdir)
    write_text_atomic(dest, text, inputs)
    return dest

"""The same metrics, with the same definitions, from each simulator's own output files.

All latency figures are over completed requests; percentiles are ``numpy.percentile`` (linear), so
AISimulate's sketch percentiles are recomputed from its per-request file (its own figures are kept
beside them as ``peer_reported``). ITL comes in the definitions the two tools use:

- ``itl_pooled_chunk_ms``: mean of every gap between consecutive output chunks of a request
  (vLLM ``bench serve``; an MTP step that emits several tokens is one chunk). Ours only; the peer's
  outputs have no chunks, so it is given there only without speculation (then chunk = token).
- ``itl_pooled_token_ms``: sum(last - first token) / sum(output_tokens - 1), i.e. every token gap
  pooled, tokens of one MTP burst sharing a timestamp: AISimulate's ``mean_itl_ms``.
- ``itl_request_mean_ms``: mean over requests of the request's own mean gap. AISimulate's
  ``requests.jsonl`` ``itl_ms`` (= that request's TPOT); ours from chunk gaps.
- ``tpot_mean_ms``: mean over requests of (last - first token) / (output_tokens - 1).

Prefix reuse is tokens reused at first admission (GPU prefix cache plus, with offload, host
cache) over input tokens; AISimulate's headline ``prefix_cache_reused_ratio`` also counts reuse at
re-admission after preemption and is kept as ``reuse_ratio_all_admissions``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from replay.engine.output_schema import REQUESTS_FILE, STATUS_FINISHED
from replay.reports.views import open_run

# One gap per consecutive pair of chunks of a request (the `chunks` view of reports/views.py); the
# per-request mean and the pooled mean.
CHUNK_GAPS_SQL = """
WITH gaps AS (
    SELECT request_id::VARCHAR AS request_id,
           time_ms - lag(time_ms) OVER (PARTITION BY request_id ORDER BY time_ms) AS gap
    FROM chunks
)
SELECT g.request_id, count(g.gap) AS n_gaps, sum(g.gap) AS sum_gap
FROM gaps g
WHERE g.gap IS NOT NULL
GROUP BY g.request_id
"""

METRIC_KEYS = (
    "completed_requests",
    "total_requests",
    "ttft_mean_ms",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_pooled_chunk_ms",
    "itl_pooled_token_ms",
    "itl_request_mean_ms",
    "tpot_mean_ms",
    "e2e_mean_ms",
    "reuse_ratio",
    "reuse_ratio_gpu",
    "reuse_ratio_all_admissions",
    "preemptions",
)


def _latency_block(ttft: np.ndarray, e2e: np.ndarray, first: np.ndarray, last: np.ndarray,
                   out_tokens: np.ndarray) -> dict[str, float | None]:
    multi = out_tokens > 1
    span = last[multi] - first[multi]
    per_req = span / (out_tokens[multi] - 1)
    return {
        "ttft_mean_ms": float(ttft.mean()) if ttft.size else None,
        "ttft_p50_ms": float(np.percentile(ttft, 50)) if ttft.size else None,
        "ttft_p99_ms": float(np.percentile(ttft, 99)) if ttft.size else None,
        "itl_pooled_token_ms": float(span.sum() / (out_tokens[multi] - 1).sum()) if multi.any() else None,
        "tpot_mean_ms": float(per_req.mean()) if multi.any() else None,
        "e2e_mean_ms": float(e2e.mean()) if e2e.size else None,
    }


def ours_metrics(outdir: Path) -> dict[str, Any]:
    """Metrics from our OUTDIR (engine/output_schema.py)."""
    req = pq.read_table(outdir / REQUESTS_FILE).to_pandas()
    done = req[req["status"] == STATUS_FINISHED]
    out = _latency_block(done["ttft_ms"].to_numpy(float), done["e2e_ms"].to_numpy(float),
                         done["first_token_ms"].to_numpy(float), done["finish_ms"].to_numpy(float),
                         done["output_tokens"].to_numpy(np.int64))
    run = open_run(outdir)
    try:
        gaps = run.con.execute(CHUNK_GAPS_SQL).df()
    finally:
        run.con.close()
    gaps = gaps[gaps["request_id"].isin(set(done["request_id"]))]
    n_gaps = gaps["n_gaps"].to_numpy(np.int64)
    sums = gaps["sum_gap"].to_numpy(float)
    out["itl_pooled_chunk_ms"] = float(sums.sum() / n_gaps.sum()) if n_gaps.sum() else None
    out["itl_request_mean_ms"] = float((sums / n_gaps).mean()) if len(n_gaps) else None
    inp = float(done["input_tokens"].sum())
    gpu = float(done["cached_tokens"].sum())
    cpu = float(done["cpu_hit_tokens"].fillna(0).sum())
    out.update(
        completed_requests=int(len(done)),
        total_requests=int(len(req)),
        reuse_ratio=(gpu + cpu) / inp if inp else None,
        reuse_ratio_gpu=gpu / inp if inp else None,
        reuse_ratio_all_admissions=None,  # ours records hits once, at first admission (as vLLM's counters)
        preemptions=int(done["num_preemptions"].sum()),
    )
    return out


def peer_metrics(outdir: Path, *, speculative: bool) -> dict[str, Any]:
    """Metrics from AISimulate's ``prediction.json`` and ``requests.jsonl`` (--capture-per-request)."""
    with (outdir / "prediction.json").open(encoding="utf-8") as fh:
        pred = json.load(fh)
    rows = []
    with (outdir / "requests.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
    done = [r for r in rows if r.get("terminal_status") == "completed"]

    def col(name: str, rows_: list[dict] = done) -> np.ndarray:
        return np.array([r[name] for r in rows_], dtype=float)

    out = _latency_block(col("ttft_ms"), col("e2e_latency_ms"), col("first_token_ms"), col("last_token_ms"),
                         col("output_length").astype(np.int64))
    itl = np.array([r["itl_ms"] for r in done if r.get("itl_ms") is not None], dtype=float)
    out["itl_request_mean_ms"] = float(itl.mean()) if itl.size else None
    # Without drafts every chunk is one token, so the pooled chunk gap is the pooled token gap.
    out["itl_pooled_chunk_ms"] = None if speculative else out["itl_pooled_token_ms"]
    inp = float(sum(r["input_length"] for r in done))
    first = float(sum(r["first_admission_reused_input_tokens"] for r in done))
    out.update(
        completed_requests=len(done),
        total_requests=len(rows),
        reuse_ratio=first / inp if inp else None,
        reuse_ratio_gpu=_peer_gpu_reuse(done, first, inp),
        reuse_ratio_all_admissions=float(sum(r["reused_input_tokens"] for r in done)) / inp if inp else None,
        preemptions=int(sum(r.get("readmission_count", 0) for r in done)),
    )
    out["peer_reported"] = {k: pred.get(k) for k in (
        "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "mean_tpot_ms", "mean_e2e_latency_ms",
        "prefix_cache_reused_ratio", "first_admission_prefix_cache_reused_ratio", "completed_requests",
        "wall_time_ms")}
    return out


def _peer_gpu_reuse(done: list[dict], first: float, inp: float) -> float | None:
    """GPU-only reuse: the G1 split when AISimulate gives it; all reuse is GPU reuse without a host tier."""
    if not inp:
        return None
    g1 = [r.get("first_admission_g1_reused_input_tokens") for r in done]
    if g1 and all(v is not None for v in g1):
        return float(sum(g1)) / inp
    host = [r.get("first_admission_host_reused_input_tokens") for r in done]
    if any(v for v in host):
        return None
    return first / inp

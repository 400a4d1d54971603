"""The rows of requests.parquet, built a row group at a time from the recorder's per-request columns
(engine/recorder.py keeps them; engine/output_schema.py names the file's columns)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa

from replay.engine.output_schema import STATUS_FINISHED, STATUS_REJECTED, STATUS_UNFINISHED
from replay.engine.pd_outputs import PDRequestColumns
from replay.engine.trace_input import TraceArrays, session_array


class RequestColumns(Protocol):
    """What the rows are built from: the recorder's per-request columns, indexed by trace row."""

    trace: TraceArrays
    status: np.ndarray  # 0 finished, 1 rejected, 2 unfinished
    arrival: np.ndarray
    first_scheduled: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    output_tokens: np.ndarray
    cached: np.ndarray
    cpu_hit: np.ndarray
    load_wait: np.ndarray
    preemptions: np.ndarray
    drafts: np.ndarray
    draft_tokens: np.ndarray
    accepted: np.ndarray
    reject_reason: dict[int, str]
    tier_names: list[str]
    tier_hit: np.ndarray  # one row per tier
    replica_column: bool
    replica: np.ndarray
    pd_columns: PDRequestColumns | None


def requests_table(rec: RequestColumns, sel: np.ndarray, request_ids: pa.Array, schema: pa.Schema) -> pa.Table:
    """The rows of requests.parquet for trace rows ``sel``, from ``rec``'s per-request columns
    (``request_ids``: every trace row's id; ``schema``: the file's)."""
    t = rec.trace
    finished = rec.status[sel] == 0
    arrival = rec.arrival[sel]
    first_token = np.where(finished, rec.first_token[sel], np.nan)
    finish = np.where(finished, rec.finish[sel], np.nan)
    first_sched = rec.first_scheduled[sel]
    first_sched = np.where(first_sched >= 0, first_sched, np.nan)
    out_tok = rec.output_tokens[sel]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(finished & (out_tok > 1), (finish - first_token) / (out_tok - 1), np.nan)
    drafts = rec.drafts[sel]
    with np.errstate(invalid="ignore", divide="ignore"):
        mal = np.where(drafts > 0, 1.0 + rec.accepted[sel] / np.maximum(drafts, 1), np.nan)
    status_names = np.array([STATUS_FINISHED, STATUS_REJECTED, STATUS_UNFINISHED], dtype=object)
    turn = t.turn[sel]

    def f64(x: np.ndarray) -> pa.Array:
        return pa.array(x, pa.float64(), from_pandas=True)  # NaN -> null

    cols = {
        "request_id": request_ids.take(pa.array(sel.astype(np.int64))),
        "session_id": session_array(t.session_id, sel),
        "turn": pa.array(np.where(turn >= 0, turn, 0).astype(np.int32), mask=turn < 0),
        "arrival_ms": pa.array(arrival, pa.float64()),
        "first_scheduled_ms": f64(first_sched),
        "first_token_ms": f64(first_token),
        "finish_ms": f64(finish),
        "ttft_ms": f64(first_token - arrival),
        "e2e_ms": f64(finish - arrival),
        "queue_ms": f64(first_sched - arrival),
        "tpot_ms": f64(tpot),
        "input_tokens": pa.array(t.input_tokens[sel].astype(np.int32)),
        "output_tokens": pa.array(out_tok),
        "cached_tokens": pa.array(rec.cached[sel]),
        "cpu_hit_tokens": pa.array(rec.cpu_hit[sel]),
        "load_wait_ms": pa.array(rec.load_wait[sel]),
        "num_preemptions": pa.array(rec.preemptions[sel]),
        "num_drafts": pa.array(drafts),
        "num_draft_tokens": pa.array(rec.draft_tokens[sel]),
        "num_accepted_tokens": pa.array(rec.accepted[sel]),
        "mean_acceptance_length": f64(mal),
        "status": pa.array(status_names[rec.status[sel]].tolist(), pa.string()),
        "reject_reason": pa.array([rec.reject_reason.get(int(i)) for i in sel], pa.string()),
    }
    for k, name in enumerate(rec.tier_names):
        cols[f"{name}_hit_tokens"] = pa.array(rec.tier_hit[k][sel])
    if rec.replica_column:
        cols["replica"] = pa.array(rec.replica[sel], mask=rec.replica[sel] < 0)
    if rec.pd_columns is not None:
        for field, column in zip(rec.pd_columns.fields, rec.pd_columns.columns(sel, rec.replica, rec.load_wait)):
            cols[field.name] = column
    return pa.Table.from_pydict(cols, schema=schema)

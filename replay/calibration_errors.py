"""Per-request errors of a replay against measured latencies, overall and per load level.

``replay calibrate-requests`` scores every candidate with these: the measured values come from the
log (client-side TTFT, TPOT, E2E; server-side prefill and decode times when the log has vLLM's
request spans), the predicted ones from the replay's ``requests.parquet``. A level is the value of a
label column (``source_run``: one benchmark of a GuideLLM sweep), so a fit on one level can be
judged on every other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

# metric -> measured column. prefill: first scheduled -> first token; decode: first -> last token
# (vLLM's gen_ai.latency.time_in_model_prefill / time_in_model_decode), free of client and queue time.
MEASURED = {"ttft": "measured_ttft_ms", "tpot": "measured_tpot_ms", "e2e": "measured_e2e_ms",
            "prefill": "measured_prefill_ms", "decode": "measured_decode_ms"}
# What the search minimises: the mean of these MAPEs, over those the log measured. E2E is left out
# (it is TTFT plus the decode time TPOT already scores); server-side phases pin the step costs
# without queueing or network time, and the prefill phase alone sees the mixed-step term.
OBJECTIVE = ("ttft", "tpot", "prefill", "decode")


@dataclass
class Errors:
    """MAPEs (fractions) and signed errors of the means over one set of requests; None: not measured."""

    ttft_mape: float | None
    tpot_mape: float | None
    requests: int
    max_ape: float | None = None
    e2e_mape: float | None = None
    prefill_mape: float | None = None
    decode_mape: float | None = None
    ttft_mean_error: float | None = None  # (mean predicted - mean measured) / mean measured
    e2e_mean_error: float | None = None

    @property
    def objective(self) -> float:
        vals = [getattr(self, f"{m}_mape") for m in OBJECTIVE]
        vals = [v for v in vals if v is not None]
        return float(np.mean(vals)) if vals else float("inf")


def measured_arrays(ids: list[str], source: pa.Table) -> dict[str, np.ndarray]:
    """Each measured metric in the order of ``ids`` (NaN where absent), matched on request_id."""
    pos = {rid: i for i, rid in enumerate(source.column("request_id").cast(pa.string()).to_pylist())}
    out: dict[str, np.ndarray] = {}
    for metric, column in MEASURED.items():
        if column not in source.column_names:
            out[metric] = np.full(len(ids), np.nan)
            continue
        values = source.column(column).cast(pa.float64()).to_numpy(zero_copy_only=False)
        out[metric] = np.array([values[pos[r]] if r in pos else np.nan for r in ids], dtype=np.float64)
    return out


def predicted_arrays(requests: pa.Table, order: dict[str, int]) -> dict[str, np.ndarray]:
    """The replay's finished requests, in trace order (NaN for unfinished ones)."""
    n = len(order)
    out = {m: np.full(n, np.nan) for m in MEASURED}
    cols = {c: requests.column(c).to_pylist() for c in
            ("request_id", "status", "ttft_ms", "tpot_ms", "e2e_ms", "first_scheduled_ms", "first_token_ms",
             "finish_ms")}
    for j, rid in enumerate(cols["request_id"]):
        if cols["status"][j] != "finished":
            continue
        i = order[rid]
        for metric, column in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("e2e", "e2e_ms")):
            v = cols[column][j]
            out[metric][i] = np.nan if v is None else v
        first, sched, finish = cols["first_token_ms"][j], cols["first_scheduled_ms"][j], cols["finish_ms"][j]
        if first is not None and sched is not None:
            out["prefill"][i] = first - sched
        if first is not None and finish is not None:
            out["decode"][i] = finish - first
    return out


def _ok(pred: np.ndarray, meas: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return mask & np.isfinite(pred) & np.isfinite(meas) & (meas > 0)


def errors(pred: dict[str, np.ndarray], meas: dict[str, np.ndarray], mask: np.ndarray) -> Errors:
    """MAPE per metric and the signed error of the mean TTFT and E2E over ``mask``."""
    mape: dict[str, float | None] = {}
    apes: list[np.ndarray] = []
    for metric in MEASURED:
        ok = _ok(pred[metric], meas[metric], mask)
        if ok.any():
            ape = np.abs(pred[metric][ok] - meas[metric][ok]) / meas[metric][ok]
            mape[metric] = float(ape.mean())
            if metric in ("ttft", "tpot"):
                apes.append(ape)
        else:
            mape[metric] = None

    def mean_error(metric: str) -> float | None:
        ok = _ok(pred[metric], meas[metric], mask)
        if not ok.any():
            return None
        m = float(meas[metric][ok].mean())
        return (float(pred[metric][ok].mean()) - m) / m

    measured_any = mask & np.logical_or.reduce([np.isfinite(meas[m]) for m in ("ttft", "tpot")])
    both = np.concatenate(apes) if apes else np.array([])
    return Errors(ttft_mape=mape["ttft"], tpot_mape=mape["tpot"], requests=int(measured_any.sum()),
                  max_ape=float(both.max()) if both.size else None, e2e_mape=mape["e2e"],
                  prefill_mape=mape["prefill"], decode_mape=mape["decode"],
                  ttft_mean_error=mean_error("ttft"), e2e_mean_error=mean_error("e2e"))


@dataclass
class LevelErrors:
    """One load level's errors under the starting and the fitted parameters."""

    level: str
    role: str  # "fit" (the requests the search saw), "held out" (fit level, hash split) or "other"
    before: Errors
    after: Errors

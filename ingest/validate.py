"""Row rules shared by every format, checked vectorised over a staged batch.

A row is rejected for: a missing required field, lengths that are negative, zero (input) or too
large for int32, zero output tokens, hash ids that break ``len(hash_ids) == ceil(input_tokens /
block_size)``, a negative timestamp, delay or turn, or a measured latency no server can have
(negative, not finite, beyond 2^42 ms, or an end-to-end time below the request's own TTFT: a
`replay validate` against it would compare predictions with nonsense). Each problem names the
source field.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .readers.base import ReaderInfo
from .rejections import Rejection, read_values
from .schema import MEASURED_FIELDS
from .trace_checks import MAX_TIME_MS

_INT32_MAX = 2**31 - 1
_INT32_MIN = -(2**31)
_COMMON_BLOCK_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048)
# Measured times in ms (client-side latencies and server phases) and the per-request gap lists.
_MEASURED_TIMES = tuple(f.name for f in MEASURED_FIELDS if pa.types.is_floating(f.type))
_MEASURED_GAPS = tuple(f.name for f in MEASURED_FIELDS if pa.types.is_list(f.type))
# An E2E below TTFT by less than this is clock rounding (a one-token request has E2E == TTFT).
_E2E_SLACK_MS = 1e-3


def zero_output_reason(failed_as: str) -> str:
    """Why a zero output is refused, in the words of the format's own failure marker."""
    if failed_as:
        return f"zero output tokens: a failed request ({failed_as}); --drop-failed drops and counts failed requests"
    return "zero output tokens (a failed request?); --drop-failed drops and counts failed requests"


def block_size_hint(input_tokens: int, n_ids: int) -> str:
    """Which block sizes would make ``n_ids`` ids fit ``input_tokens`` tokens."""
    if n_ids == 0:
        return "no hash ids for a non-empty prompt"
    lo = math.ceil(input_tokens / n_ids)
    hi = math.ceil(input_tokens / (n_ids - 1)) - 1 if n_ids > 1 else None
    common = [b for b in _COMMON_BLOCK_SIZES if b >= lo and (hi is None or b <= hi)]
    if common:
        return f"block size {common[0]} would fit (--block-size {common[0]})"
    if hi is None:
        return f"any block size >= {lo} would fit"
    if lo > hi:
        return "no block size fits"
    return f"block sizes {lo}..{hi} would fit"




class _Problems:
    """Collects the first problem per row (index in the batch -> field, reason)."""

    def __init__(self) -> None:
        self.first: dict[int, tuple[str, str]] = {}

    def add(self, mask: np.ndarray, field: str, reason_of) -> None:
        for i in np.flatnonzero(mask).tolist():
            if i not in self.first:
                self.first[i] = (field, reason_of(i))


def _np(table: pa.Table, name: str, fill: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
    """(values with nulls filled, validity mask) of an integer column, or None when absent."""
    if name not in table.column_names:
        return None
    col = table.column(name).combine_chunks()
    valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return col.fill_null(fill).to_numpy(), valid


def validate(staged: pa.Table, info: ReaderInfo, drop_failed: bool = False) -> tuple[pa.Table, list[Rejection], int]:
    """Split a staged batch into good rows, rejections and the count of rows dropped as failed."""
    n = staged.num_rows
    names = info.field_names
    probs = _Problems()

    def name(col: str) -> str:
        return names.get(col, col)

    t = _np(staged, "t_ms")
    delay = _np(staged, "delay_ms")
    has_session = (np.asarray(staged.column("session_id").is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                   if "session_id" in staged.column_names else np.zeros(n, dtype=bool))
    if t is None:
        t_valid = np.zeros(n, dtype=bool)
        t_vals = np.zeros(n, dtype=np.int64)
    else:
        t_vals, t_valid = t
    delay_ok = delay[1] if delay is not None else np.zeros(n, dtype=bool)
    probs.add(~t_valid & ~(delay_ok & has_session), name("t_ms"),
              lambda i: "missing timestamp (only a later turn of a session may give just a delay)")
    if not info.rebase:
        probs.add(t_valid & (t_vals < 0), name("t_ms"), lambda i: f"negative timestamp {t_vals[i]}")
    probs.add(t_valid & (np.abs(t_vals) > MAX_TIME_MS), name("t_ms"),
              lambda i: f"timestamp {t_vals[i]:,} ms is beyond 2^42 ms (139 years): a wrong --time-unit or a "
                        "corrupt value (times must stay exact to the microsecond in the engine's float64 clock)")
    if delay is not None:
        probs.add(delay[1] & (np.abs(delay[0]) > MAX_TIME_MS), name("delay_ms"),
                  lambda i: f"delay {delay[0][i]:,} ms is beyond 2^42 ms (139 years)")

    inp = _np(staged, "input_tokens")
    out = _np(staged, "output_tokens")
    if inp is None:
        probs.add(np.ones(n, dtype=bool), name("input_tokens"), lambda i: "missing input length")
        inp_vals = np.zeros(n, dtype=np.int64)
    else:
        inp_vals, inp_valid = inp
        probs.add(~inp_valid, name("input_tokens"), lambda i: "missing input length")
        probs.add(inp_valid & (inp_vals < 0), name("input_tokens"), lambda i: f"negative length {inp_vals[i]}")
        probs.add(inp_valid & (inp_vals == 0), name("input_tokens"), lambda i: "zero input tokens (empty prompt)")
        probs.add(inp_valid & (inp_vals > _INT32_MAX), name("input_tokens"),
                  lambda i: f"length {inp_vals[i]} does not fit int32")
    dropped_mask = np.zeros(n, dtype=bool)
    if out is None:
        probs.add(np.ones(n, dtype=bool), name("output_tokens"), lambda i: "missing output length")
    else:
        out_vals, out_valid = out
        probs.add(~out_valid, name("output_tokens"), lambda i: "missing output length")
        probs.add(out_valid & (out_vals < 0), name("output_tokens"), lambda i: f"negative length {out_vals[i]}")
        zero = out_valid & (out_vals == 0)
        if drop_failed:
            dropped_mask = zero
        else:
            probs.add(zero, name("output_tokens"), lambda i: zero_output_reason(info.failed_as))
        probs.add(out_valid & (out_vals > _INT32_MAX), name("output_tokens"),
                  lambda i: f"length {out_vals[i]} does not fit int32")

    if "hash_ids" in staged.column_names:
        ids = staged.column("hash_ids").combine_chunks()
        ids_valid = np.asarray(ids.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if info.hash_ids_required:
            probs.add(~ids_valid, name("hash_ids"), lambda i: "missing hash ids")
        flat = pc.list_flatten(ids)
        if flat.null_count:  # a null inside the list: that block has no identity
            has_null = np.zeros(n, dtype=bool)
            parents = pc.list_parent_indices(ids).to_numpy()
            has_null[parents[np.asarray(flat.is_null().to_numpy(zero_copy_only=False), dtype=bool)]] = True
            probs.add(ids_valid & has_null, name("hash_ids"), lambda i: "null inside hash_ids (every id must be an integer)")
        bs = info.hash_block_size
        if bs:
            lens = pc.list_value_length(ids).fill_null(0).to_numpy()
            expected = (inp_vals + bs - 1) // bs
            mismatch = ids_valid & (lens != expected) & (inp_vals > 0)
            probs.add(mismatch, name("hash_ids"), lambda i: (
                f"{lens[i]} hash ids but ceil(input_tokens {inp_vals[i]} / block size {bs}) = {expected[i]}; "
                + block_size_hint(int(inp_vals[i]), int(lens[i]))))
    elif info.hash_ids_required:
        probs.add(np.ones(n, dtype=bool), name("hash_ids"), lambda i: "missing hash ids")

    if delay is not None:
        dv, dvalid = delay
        probs.add(dvalid & (dv < 0), name("delay_ms"), lambda i: f"negative delay {dv[i]}")
    turn = _np(staged, "turn")
    if turn is not None:
        tv, tvalid = turn
        probs.add(tvalid & ((tv < 0) | (tv > _INT32_MAX)), name("turn"), lambda i: f"invalid turn {tv[i]}")
    prio = _np(staged, "priority")
    if prio is not None:
        pv, pvalid = prio
        probs.add(pvalid & ((pv < _INT32_MIN) | (pv > _INT32_MAX)), name("priority"),
                  lambda i: f"priority {pv[i]} does not fit int32")

    _check_measured(staged, probs, name)

    rejections: list[Rejection] = []
    bad_idx = sorted(probs.first)
    if bad_idx:
        records = staged.take(pa.array(bad_idx, pa.int64())).to_pylist()
        for i, rec in zip(bad_idx, records, strict=True):
            field, reason = probs.first[i]
            row = rec.pop("_row")
            line = rec.pop("_line", None)
            rejections.append(Rejection(row, field, reason, line, read_values(rec)))
    bad_mask = np.zeros(n, dtype=bool)
    bad_mask[bad_idx] = True
    n_dropped = int((dropped_mask & ~bad_mask).sum())
    keep = ~dropped_mask & ~bad_mask
    good = staged if keep.all() else staged.filter(pa.array(keep))
    return good, rejections, n_dropped


def _float_column(table: pa.Table, col: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(values with nulls as 0, validity mask) of a float column, or None when absent."""
    if col not in table.column_names:
        return None
    arr = table.column(col).combine_chunks().cast(pa.float64())
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return arr.fill_null(0.0).to_numpy(), valid


def _check_measured(staged: pa.Table, probs: _Problems, name) -> None:
    """Measured latencies a server can have: E2E not below TTFT (checked first: a TPOT derived from
    the two is then negative too), finite, >= 0, within 2^42 ms."""
    ttft = _float_column(staged, "measured_ttft_ms")
    e2e = _float_column(staged, "measured_e2e_ms")
    if ttft is not None and e2e is not None:
        (tv, tvalid), (ev, evalid) = ttft, e2e
        with np.errstate(invalid="ignore"):
            below = tvalid & evalid & (ev < tv - _E2E_SLACK_MS)
        probs.add(below, name("measured_e2e_ms"),
                  lambda i: f"measured end-to-end time {ev[i]:g} ms is below the request's TTFT {tv[i]:g} ms")
    for col in _MEASURED_TIMES:
        got = _float_column(staged, col)
        if got is None:
            continue
        vals, valid = got
        with np.errstate(invalid="ignore"):
            probs.add(valid & ~np.isfinite(vals), name(col), lambda i, v=vals: f"measured time {v[i]} is not a finite number")
            probs.add(valid & np.isfinite(vals) & (vals < 0), name(col),
                      lambda i, v=vals: f"negative measured time {v[i]:g} ms")
            probs.add(valid & np.isfinite(vals) & (vals > MAX_TIME_MS), name(col),
                      lambda i, v=vals: f"measured time {v[i]:.4g} ms is beyond 2^42 ms (139 years): a wrong unit "
                                        "or a corrupt value")
    for col in _MEASURED_GAPS:
        if col not in staged.column_names:
            continue
        gaps = staged.column(col).combine_chunks()
        flat = pc.list_flatten(gaps)
        if not len(flat):
            continue
        fv = flat.cast(pa.float64()).fill_null(0.0).to_numpy()
        with np.errstate(invalid="ignore"):
            bad_gap = ~np.isfinite(fv) | (fv < 0) | (fv > MAX_TIME_MS)
        if bad_gap.any():
            rows = np.zeros(staged.num_rows, dtype=bool)
            rows[pc.list_parent_indices(gaps).to_numpy()[bad_gap]] = True
            probs.add(rows, name(col), lambda i: "a measured inter-token gap is negative, not finite or beyond 2^42 ms")

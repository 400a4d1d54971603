"""Fit the roofline's efficiencies and overheads to measured step times.

The roofline is piecewise linear in (1/eta_c, 1/eta_a, 1/eta_m, tau_layer, host overhead): inside a
region where each max() keeps its branch, step time = g . x + const. The fit alternates: find the
region and g at the current x (exact finite differences), solve a least-squares problem on relative
error with non-negativity (active set), repeat until the branches stop changing. numpy only.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from replay.base.errors import ConfigError, TraceError
from replay.engine.hardware import HardwareProfile
from replay.engine.models import ModelSpec
from replay.engine.timing.base import StepShape, shape_from_requests
from replay.engine.timing.roofline import RooflineParams, RooflineTimer

STEP_COLUMNS = ("prefill_tokens", "prefill_cached", "decode_ctx", "draft_tokens", "measured_ms")


@dataclass(frozen=True)
class StepSample:
    shape: StepShape
    measured_ms: float
    row: int  # 1-based data row in the CSV (header is row 0), for messages


@dataclass
class FitResult:
    params: RooflineParams
    mape: float
    max_ape: float
    n: int
    predicted_ms: list[float] = field(default_factory=list)
    start_mape: float = 0.0


def _int_list(text: str, path: str, row: int, column: str) -> list[int]:
    """'2048;1024' -> [2048, 1024]; '64x2048' -> 64 copies; empty -> []."""
    out: list[int] = []
    for item in str(text).replace(" ", "").split(";"):
        if not item:
            continue
        try:
            if "x" in item:
                count, value = item.split("x", 1)
                out.extend([int(value)] * int(count))
            else:
                out.append(int(item))
        except ValueError:
            raise TraceError(f"expected integers separated by ';' (or NxC), got {item!r}",
                             path=path, line=row, field=column) from None
    if any(v < 0 for v in out):
        raise TraceError("values must be >= 0", path=path, line=row, field=column)
    return out


def _data_lines(path: str | Path) -> list[int]:
    """The file line each data row starts on (pandas skips blank lines; a quoted field may span
    lines), so errors name the line a user sees in an editor."""
    import csv

    out: list[int] = []
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        start, header = 1, True
        for fields in reader:
            line, start = start, reader.line_num + 1
            if not fields or not any(f.strip() for f in fields):
                continue
            if header:
                header = False
                continue
            out.append(line)
    return out


def read_steps_csv(path: str | Path) -> list[StepSample]:
    """Read measured steps. Columns: prefill_tokens ('2048;512', new tokens per prefilling request),
    prefill_cached (same length, tokens already in KV; optional), decode_ctx ('64x2048' or
    '1024;4096', context per decode), draft_tokens (k per decode; optional), measured_ms."""
    p = str(path)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise TraceError(f"cannot read steps CSV: {exc}", path=p) from None
    missing = [c for c in ("measured_ms",) if c not in df.columns]
    if missing or not ({"prefill_tokens", "decode_ctx"} & set(df.columns)):
        raise TraceError(f"needs columns measured_ms and prefill_tokens and/or decode_ctx "
                         f"(optional: prefill_cached, draft_tokens); found {list(df.columns)}", path=p)
    unknown = [c for c in df.columns if c not in STEP_COLUMNS]
    if unknown:
        raise TraceError(f"unknown columns {unknown}; known: {list(STEP_COLUMNS)}", path=p)
    samples: list[StepSample] = []
    lines = _data_lines(path)
    for row, rec in enumerate(df.to_dict("records")):
        i = lines[row] if row < len(lines) else row + 2  # the file line, as ingest names lines
        new = _int_list(rec.get("prefill_tokens", ""), p, i, "prefill_tokens")
        cached = _int_list(rec.get("prefill_cached", ""), p, i, "prefill_cached") or [0] * len(new)
        if len(cached) != len(new):
            raise TraceError(f"{len(cached)} cached prefixes for {len(new)} prefill requests",
                             path=p, line=i, field="prefill_cached")
        decodes = _int_list(rec.get("decode_ctx", ""), p, i, "decode_ctx")
        drafts_list = _int_list(rec.get("draft_tokens", ""), p, i, "draft_tokens") or [0]
        try:
            measured = float(rec["measured_ms"])
        except ValueError:
            raise TraceError(f"not a number: {rec['measured_ms']!r}", path=p, line=i, field="measured_ms") from None
        if not measured > 0:
            raise TraceError("must be > 0", path=p, line=i, field="measured_ms")
        try:
            shape = shape_from_requests(list(zip(new, cached, strict=True)), decodes, drafts=drafts_list[0])
        except ValueError as exc:
            raise TraceError(str(exc), path=p, line=i, field="prefill_tokens") from None
        if shape.prefill_tokens + shape.decode_query_tokens == 0:
            raise TraceError("a step needs prefill tokens or decodes", path=p, line=i, field="prefill_tokens")
        samples.append(StepSample(shape, measured, i))
    if not samples:
        raise TraceError("no steps in the file", path=p)
    return samples


def _x(params: RooflineParams, mixed: bool = False) -> np.ndarray:
    x = [1 / params.eta_compute, 1 / params.eta_attention, 1 / params.eta_memory,
         params.tau_layer_us, params.host_overhead_ms]
    return np.array(x + [params.mixed_layer_us] if mixed else x)


def _params(x: np.ndarray, base: RooflineParams) -> RooflineParams:
    changes = dict(eta_compute=1 / x[0], eta_attention=1 / x[1], eta_memory=1 / x[2],
                   tau_layer_us=float(x[3]), host_overhead_ms=float(x[4]))
    if len(x) > 5:
        changes["mixed_layer_us"] = float(x[5])
    return base.replace(**changes)


def _predict(model: ModelSpec, hw: HardwareProfile, params: RooflineParams, shapes: list[tuple], **kw) -> np.ndarray:
    timer = RooflineTimer(model, hw, params, **kw)
    return np.array([timer.step_ms(*s) for s in shapes])


def fit(model: ModelSpec, hw: HardwareProfile, samples: list[StepSample], *, tp: int = 1, dtype: str = "bf16",
        kv_dtype: str = "bf16", drafter: str | None = None, base: RooflineParams | None = None,
        fix_host_overhead_ms: float | None = None, iterations: int = 30, fit_mixed: bool = False) -> FitResult:
    """Least squares on relative error. Fits the three efficiencies and one fixed per-step cost: the host
    overhead, or tau_layer when ``fix_host_overhead_ms`` pins the host term (e.g. 0 for kernel-only data);
    with ``fit_mixed`` also the extra cost of steps with a prefill chunk (``mixed_layer_us``), which
    needs both decode-only steps and steps with prefill among the samples."""
    if len(samples) < 3:
        raise ConfigError(f"calibration needs at least 3 measured steps, got {len(samples)}")
    base = base or RooflineParams.from_hardware(hw)
    if fix_host_overhead_ms is not None:
        base = base.replace(host_overhead_ms=fix_host_overhead_ms)
    kw = dict(tp=tp, dtype=dtype, kv_dtype=kv_dtype, drafter=drafter)
    shapes = [astuple(s.shape) for s in samples]
    y = np.array([s.measured_ms for s in samples])
    # L * tau_layer and the host overhead are both a fixed cost per step for one model, so only one of
    # them is identifiable: fit the host overhead (what real telemetry adds) unless it is pinned, in
    # which case fit tau_layer (kernel-only data, e.g. aiconfigurator's, pinned at 0).
    pinned = fix_host_overhead_ms is not None
    free = [True, True, True, pinned, not pinned]
    lower = np.array([1.0, 1.0, 1.0, 0.0, 0.0])  # efficiencies <= 1, overheads >= 0
    if fit_mixed:
        kinds = {s.shape.prefill_tokens > 0 for s in samples}
        if kinds != {True, False}:
            raise ConfigError("--fit-mixed needs both decode-only steps and steps with a prefill chunk: the "
                              "difference between them is what sizes the mixed-step term")
        free.append(True)
        lower = np.append(lower, 0.0)
    n = len(free)
    x = _x(base, fit_mixed)
    start = np.abs(_predict(model, hw, base, shapes, **kw) - y) / y
    best = (float(np.mean(start)), x.copy())
    for _ in range(iterations):
        t0 = _predict(model, hw, _params(x, base), shapes, **kw)
        grads = []
        for j in range(n):
            step = np.zeros(n)
            step[j] = 1e-6 * max(1.0, abs(x[j]))
            grads.append((_predict(model, hw, _params(x + step, base), shapes, **kw) - t0) / step[j])
        G = np.stack(grads, axis=1)
        const = t0 - G @ x
        active = [j for j in range(n) if free[j] and np.any(G[:, j] != 0)]
        fixed_x = x.copy()
        new = x.copy()
        while active:
            rhs = (y - const - G @ np.where(np.isin(range(n), active), 0.0, fixed_x)) / y
            sol, *_ = np.linalg.lstsq(G[:, active] / y[:, None], rhs, rcond=None)
            low = [a for a, v in zip(active, sol, strict=True) if v < lower[a]]
            new[active] = sol
            if not low:
                break
            for a in low:
                fixed_x[a] = lower[a]
                new[a] = lower[a]
                active.remove(a)
        ape = np.abs(_predict(model, hw, _params(new, base), shapes, **kw) - y) / y
        converged = np.allclose(new, x, rtol=1e-9, atol=1e-12)
        x = new
        if float(np.mean(ape)) < best[0]:
            best = (float(np.mean(ape)), x.copy())
        if converged:
            break
    params = _params(best[1], base)
    pred = _predict(model, hw, params, shapes, **kw)
    ape = np.abs(pred - y) / y
    params = params.replace(**{k: float(v) for k, v in params.as_dict().items()})
    return FitResult(params=params, mape=float(ape.mean()), max_ape=float(ape.max()), n=len(samples),
                     predicted_ms=[float(v) for v in pred], start_mape=float(start.mean()))

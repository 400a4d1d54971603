"""Calibrate the roofline from per-request measurements (TTFT, TPOT, server-side phases), not step telemetry.

A request's TTFT and TPOT depend on queueing and batching as much as on step times, so the fit
replays the whole log for each candidate and compares per request: the objective is the mean MAPE of
TTFT, TPOT and, when the log has vLLM's request spans, the server-side prefill and decode times, over
the *fit* requests. Those are the rows ``fit_where`` selects (``source_run=...``: one load level of a
sweep), else all rows; a deterministic hash of the request id puts ``holdout`` of them aside. Every
other request (other load levels, held-out ones) only reports the error before and after, per level.

Fitted: ``eta_compute``, ``eta_memory``, ``host_overhead_ms`` and, when the log has server-side
prefill times (or ``fit_mixed``), the mixed-step term ``mixed_layer_us`` (docs/timing.md), each
inside stated bounds, by a deterministic Nelder-Mead search in log space (no gradient: replay outputs
jump where scheduling decisions flip). A parameter that ends at a bound is reported as such: the
data did not pin it. Every evaluation is one full replay: cost = evaluations x replay time, printed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replay.base.errors import ConfigError, ReplayError
from replay.calibration_errors import Errors, LevelErrors, errors, measured_arrays, predicted_arrays
from replay.engine.config import EngineConfig
from replay.engine.run import replay_trace
from replay.engine.run_setup import resolve_setup
from replay.engine.timing import RooflineParams, RooflineTimer, resolve_drafter
from replay.ingest.schema import TraceMetadata, read_trace

__all__ = ["BOUNDS", "FITTED", "Errors", "FittedParameter", "LevelErrors", "RequestFit", "calibrate_from_requests",
           "holdout_mask", "save_request_profile"]

# eta_attention is kept at the run's value: per-request latencies cannot tell attention reads from
# weight reads at the batch sizes a log holds (fitting both traded one against the other and raised
# the held-out error on a synthetic log with known constants).
FITTED = ("eta_compute", "eta_memory", "host_overhead_ms")
MIXED = "mixed_layer_us"
# Where the search may go. Efficiencies: a fraction of the datasheet peak (at most all of it, at
# least 5%); host overhead: 1 us to 100 ms a step; mixed-step cost: 0.01 to 1,000 us per layer.
BOUNDS: dict[str, tuple[float, float]] = {
    "eta_compute": (0.05, 1.0),
    "eta_memory": (0.05, 1.0),
    "host_overhead_ms": (1e-3, 100.0),
    MIXED: (0.01, 1000.0),
}
_FIRST_MOVE = {"eta_compute": -1.0, "eta_memory": -1.0, "host_overhead_ms": 1.0, MIXED: 1.0}
MIXED_START_US = 5.0  # where the search starts the mixed-step term when the run had none
START_STEP = math.log(1.5)  # the first simplex moves each parameter by a factor 1.5
MAX_EVALUATIONS = 80
RESTART_EVERY = 40  # replays per Nelder-Mead run before it restarts around its best point
AT_BOUND = 1e-3  # within 0.1% of a bound (log space) counts as stuck there
DEFAULT_LEVEL_COLUMN = "source_run"


@dataclass
class FittedParameter:
    name: str
    start: float
    value: float
    lower: float
    upper: float

    @property
    def at_bound(self) -> str | None:
        """"lower" or "upper" when the search ended on that bound (the data did not pin the value)."""
        if math.log(self.value) - math.log(self.lower) <= AT_BOUND:
            return "lower"
        if math.log(self.upper) - math.log(self.value) <= AT_BOUND:
            return "upper"
        return None


@dataclass
class RequestFit:
    params: RooflineParams
    start: RooflineParams
    fit_before: Errors
    fit_after: Errors
    holdout_before: Errors
    holdout_after: Errors
    evaluations: int
    replay_seconds: float
    history: list[tuple[dict[str, float], float]] = field(default_factory=list, repr=False)
    fitted: list[FittedParameter] = field(default_factory=list)
    levels: list[LevelErrors] = field(default_factory=list)
    level_column: str | None = None
    fit_where: dict[str, list[str]] = field(default_factory=dict)

    @property
    def stuck(self) -> list[FittedParameter]:
        return [p for p in self.fitted if p.at_bound]


def holdout_mask(request_ids: list[str], fraction: float, seed: int) -> np.ndarray:
    """True for held-out requests: a stable hash of (seed, id), so the split never depends on order."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"--holdout must be between 0 and 1 (exclusive), got {fraction}")
    limit = int(fraction * 2**64)
    return np.array([int.from_bytes(hashlib.blake2b(f"{seed}:{rid}".encode(), digest_size=8).digest(), "little")
                     < limit for rid in request_ids])


def _labels(ids: list[str], sources: list[pa.Table], column: str) -> np.ndarray | None:
    """A column's values as strings in trace order, from the first table that has it (None: none has)."""
    for src in sources:
        if column in src.column_names:
            pos = {rid: i for i, rid in enumerate(src.column("request_id").cast(pa.string()).to_pylist())}
            values = src.column(column).cast(pa.string()).to_pylist()
            return np.array([values[pos[r]] if r in pos and values[pos[r]] is not None else "(none)"
                             for r in ids], dtype=object)
    return None


def parse_fit_where(items: list[str], ids: list[str], sources: list[pa.Table]) -> tuple[np.ndarray, dict[str, list[str]]]:
    """``COLUMN=VALUE`` conditions -> a row mask. Values of one column are alternatives (OR); different
    columns must all match (AND). Errors name the column or list the values present."""
    wanted: dict[str, list[str]] = {}
    for item in items:
        column, sep, value = item.partition("=")
        column = column.strip()
        if not sep or not column:
            raise ConfigError(f"--fit-where {item!r}: expected COLUMN=VALUE, e.g. source_run=constant@2.00")
        wanted.setdefault(column, []).append(value.strip())
    mask = np.ones(len(ids), dtype=bool)
    for column, values in wanted.items():
        labels = _labels(ids, sources, column)
        if labels is None:
            present = sorted({c for s in sources for c in s.column_names})
            raise ConfigError(f"--fit-where {column}=...: the log has no column {column!r} "
                              f"(columns: {', '.join(present)})")
        hit = np.isin(labels, values)
        if not hit.any():
            seen = list(dict.fromkeys(labels.tolist()))
            raise ConfigError(f"--fit-where {column}: no request has {' or '.join(map(repr, values))}; values present: "
                              + ", ".join(map(repr, seen[:20])) + (" ..." if len(seen) > 20 else ""))
        mask &= hit
    return mask, wanted


class _Replayer:
    """One config and trace; replays with given roofline parameters and returns per-request predictions."""

    def __init__(self, table: pa.Table, meta: TraceMetadata, config: EngineConfig, workdir: Path) -> None:
        if config.timing.backend != "roofline":
            raise ConfigError("per-request calibration fits the roofline; the run used timing.backend "
                              f"{config.timing.backend!r}")
        from replay.engine.hardware import get_hardware
        from replay.engine.models import get_model

        self.table, self.meta, self.config, self.workdir = table, meta, config, workdir
        self.model, self.hw = get_model(config.model), get_hardware(config.hardware)
        self.setup = resolve_setup(config)
        self.order = {rid: i for i, rid in enumerate(table.column("request_id").to_pylist())}
        self.seconds = 0.0
        self.calls = 0

    def __call__(self, params: RooflineParams) -> dict[str, np.ndarray]:
        timer = RooflineTimer(self.model, self.hw, params, tp=self.config.tensor_parallel_size,
                              dtype=self.config.dtype, kv_dtype=self.config.kv_cache_dtype(),
                              drafter=resolve_drafter(self.config, self.model))
        out = self.workdir / "replay"
        t0 = time.perf_counter()
        replay_trace(self.table, self.meta, self.config, out, on_error="skip", overwrite=True,
                     setup=dataclasses.replace(self.setup, timer=timer))
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        req = pq.read_table(out / "requests.parquet",
                            columns=["request_id", "status", "ttft_ms", "tpot_ms", "e2e_ms", "first_scheduled_ms",
                                     "first_token_ms", "finish_ms"])
        return predicted_arrays(req, self.order)


def nelder_mead(f, x0: np.ndarray, step: float, max_evaluations: int, first_move: np.ndarray,
                tol: float = 1e-4) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (simplex of axis steps of ``step`` in the ``first_move`` directions) with
    the standard reflection (1), expansion (2), contraction (1/2) and shrink (1/2) moves;
    deterministic, no derivatives."""
    n = len(x0)
    simplex = [x0.copy()] + [x0 + step * first_move[i] * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    evaluations = len(simplex)
    while evaluations < max_evaluations:
        order = np.argsort(values, kind="stable")
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] <= tol * max(abs(values[0]), 1e-12):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        evaluations += 1
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expanded)
            evaluations += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            evaluations += 1
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                for i in range(1, n + 1):
                    simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
                    values[i] = f(simplex[i])
                    evaluations += 1
    return simplex[int(np.argmin(values))]


def _start_value(base: RooflineParams, name: str) -> float:
    lo, hi = BOUNDS[name]
    value = getattr(base, name)
    if name == MIXED and value <= 0.0:
        value = MIXED_START_US
    return min(max(value, lo), hi)


def _level_errors(levels: np.ndarray | None, fit: np.ndarray, held: np.ndarray,
                  start: dict[str, np.ndarray], best: dict[str, np.ndarray],
                  meas: dict[str, np.ndarray]) -> list[LevelErrors]:
    """Errors per level value (order of first appearance), split into fit / held-out / other rows."""
    n = len(fit)
    names = ["all"] if levels is None else list(dict.fromkeys(levels.tolist()))
    out: list[LevelErrors] = []
    for name in names:
        rows = np.ones(n, dtype=bool) if levels is None else levels == name
        for role, part in (("fit", rows & fit), ("held out", rows & held), ("other", rows & ~fit & ~held)):
            if part.any():
                before, after = errors(start, meas, part), errors(best, meas, part)
                if before.requests:
                    out.append(LevelErrors(level=str(name), role=role, before=before, after=after))
    return out


def calibrate_from_requests(outdir: str | Path, *, measured: str | Path | None = None,
                            measured_table: pa.Table | None = None, holdout: float | None = None, seed: int = 0,
                            max_evaluations: int = MAX_EVALUATIONS, fit_where: list[str] | tuple[str, ...] = (),
                            by: str | None = None, fit_mixed: bool | None = None,
                            pin: list[str] | tuple[str, ...] = ()) -> RequestFit:
    """Fit the roofline to the measured latencies of the log replayed in ``outdir`` (see module doc).

    ``measured`` (a log file) or ``measured_table`` (already read) holds the measurements, else the
    run's own trace; ``fit_where`` selects the fit rows; ``by`` names the level column reported on
    (default ``source_run`` when present); ``holdout`` defaults to 0.3 without ``fit_where`` and 0 with
    it; ``fit_mixed`` (default: when the fit rows have server-side prefill times) adds the mixed-step term;
    ``pin`` keeps the named parameters at the run's values (e.g. a host overhead known from step telemetry).
    """
    from replay.reports.views import read_run_json

    outdir = Path(outdir)
    info = read_run_json(outdir)
    config = EngineConfig.model_validate(info.get("config") or {})
    trace_path = Path((info.get("trace") or {}).get("path", ""))
    if not trace_path.is_file():
        raise ReplayError(f"{outdir}: the run's trace {trace_path} is not found")
    table, meta = read_trace(trace_path, replayable=True)
    if measured is not None and measured_table is None:
        from replay.ingest import load_trace

        measured_table, _ = load_trace(measured, drop_failed=True)
    src = measured_table if measured_table is not None else table
    if not {"measured_ttft_ms", "measured_tpot_ms"} & set(src.column_names):
        raise ReplayError("no measured_ttft_ms / measured_tpot_ms columns to calibrate against; ingest a log "
                          "with per-request latencies (docs/validate.md) or give --measured FILE")
    ids = table.column("request_id").to_pylist()
    meas = measured_arrays(ids, src)
    sources = [src, table] if measured_table is not None else [table]
    chosen, where = parse_fit_where(list(fit_where), ids, sources)
    fraction = holdout if holdout is not None else (0.0 if fit_where else 0.3)
    if fraction < 0.0 or fraction >= 1.0:
        raise ConfigError(f"--holdout must be in [0, 1), got {fraction}")
    held = holdout_mask(ids, fraction, seed) & chosen if fraction > 0.0 else np.zeros(len(ids), dtype=bool)
    fit_mask = chosen & ~held
    level_column = by if by is not None else (DEFAULT_LEVEL_COLUMN if _labels(ids, sources, DEFAULT_LEVEL_COLUMN)
                                              is not None else (next(iter(where)) if where else None))
    levels = _labels(ids, sources, level_column) if level_column is not None else None
    if level_column is not None and levels is None:
        raise ConfigError(f"--by {level_column}: the log has no such column")
    if fit_mixed is None:
        fit_mixed = bool(np.isfinite(meas["prefill"][fit_mask]).any())
    unknown = [p for p in pin if p not in BOUNDS]
    if unknown:
        raise ConfigError(f"--pin {', '.join(unknown)}: not a fitted parameter; use one of {', '.join(BOUNDS)}")
    names = tuple(k for k in FITTED + ((MIXED,) if fit_mixed else ()) if k not in pin)
    if not names:
        raise ConfigError("--pin leaves no parameter to fit")

    with tempfile.TemporaryDirectory(prefix="replay-calibrate-") as tmp:
        replay = _Replayer(table, meta, config, Path(tmp))
        base = replay.setup.timer.params  # the run's own parameters (defaults, profile or overrides)
        lower = np.log([BOUNDS[k][0] for k in names])
        upper = np.log([BOUNDS[k][1] for k in names])

        def from_x(x: np.ndarray) -> RooflineParams:
            e = np.exp(np.clip(x, lower, upper))
            return base.replace(**{k: float(v) for k, v in zip(names, e, strict=True)})

        history: list[tuple[dict[str, float], float]] = []
        start_pred = replay(base)
        fit_before = errors(start_pred, meas, fit_mask)
        if fit_before.requests < 3:
            raise ReplayError(f"only {fit_before.requests} fit requests with measurements; need at least 3")
        cache: dict[bytes, tuple[float, dict[str, np.ndarray]]] = {}

        def objective(x: np.ndarray) -> float:
            x = np.clip(x, lower, upper)
            key = x.tobytes()
            if key not in cache:
                p = from_x(x)
                pred = replay(p)
                cache[key] = (errors(pred, meas, fit_mask).objective, pred)
                history.append(({k: getattr(p, k) for k in names}, cache[key][0]))
            return cache[key][0]

        x = np.log([_start_value(base, k) for k in names])
        moves = np.array([_FIRST_MOVE[k] for k in names])
        # Restarts: a fresh simplex around the best point every RESTART_EVERY replays. The valley where
        # the host overhead trades against the weight-read efficiency is long and narrow, and a simplex
        # collapses along it (or along a parameter the data do not move); a new one walks on.
        while replay.calls - 1 < max_evaluations:
            budget = min(RESTART_EVERY, max_evaluations - (replay.calls - 1))
            if budget <= len(names):
                break
            calls = replay.calls
            x = np.clip(nelder_mead(objective, x, START_STEP, budget, moves), lower, upper)
            if replay.calls == calls:
                break  # every point of the new simplex was already priced: nothing left to explore
        x = np.clip(x, lower, upper)
        objective(x)
        best_pred = cache[x.tobytes()][1]
        params = from_x(x)
        fitted = [FittedParameter(k, getattr(base, k), getattr(params, k), *BOUNDS[k]) for k in names]
        return RequestFit(params=params, start=base, fit_before=fit_before, fit_after=errors(best_pred, meas, fit_mask),
                          holdout_before=errors(start_pred, meas, held), holdout_after=errors(best_pred, meas, held),
                          evaluations=replay.calls, replay_seconds=replay.seconds, history=history, fitted=fitted,
                          levels=_level_errors(levels, fit_mask, held, start_pred, best_pred, meas),
                          level_column=level_column, fit_where=where)


def save_request_profile(fit: RequestFit, config: dict[str, Any], source: str, path: str | Path) -> None:
    """Write the fit as a timing profile (``timing: {profile: PATH}`` in a config)."""
    from replay.engine.timing.profile import FitStats, ProfileParams, TimingProfile, save_profile

    where = " ".join(f"{k}={'|'.join(v)}" for k, v in fit.fit_where.items())
    profile = TimingProfile(
        hardware=config.get("hardware", "h200_sxm"), model=config.get("model", ""),
        tensor_parallel_size=int(config.get("tensor_parallel_size", 1)), dtype=config.get("dtype", "bf16"),
        params=ProfileParams(**{k: float(v) for k, v in fit.params.as_dict().items()}),
        fit=FitStats(steps_csv=f"per-request TTFT/TPOT of {source}" + (f" where {where}" if where else ""),
                     num_steps=fit.fit_after.requests, mape=fit.fit_after.objective,
                     max_ape=fit.fit_after.max_ape or 0.0, mape_before=fit.fit_before.objective,
                     host_overhead_fixed=False),
    )
    save_profile(profile, path)

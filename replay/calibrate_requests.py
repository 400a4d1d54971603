"""Calibrate the roofline from per-request measurements (TTFT, TPOT), not step telemetry.

A request's TTFT and TPOT depend on queueing and batching as much as on step times, so the fit
replays the whole log for each candidate and compares per request: the objective is the mean of
TTFT MAPE and TPOT MAPE over the *fit* requests (a deterministic hash of the request id puts
``holdout`` of them aside); the held-out requests only report the error before and after. Fitted:
``eta_compute``, ``eta_memory`` (<= 1) and ``host_overhead_ms`` (> 0), by a
deterministic Nelder-Mead search in log space (no gradient: replay outputs jump where scheduling
decisions flip). Every evaluation is one full replay: cost =
evaluations x replay time, printed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replay.base.errors import ConfigError, ReplayError
from replay.engine.config import EngineConfig
from replay.engine.run import replay_trace
from replay.engine.run_setup import resolve_setup
from replay.engine.timing import RooflineParams, RooflineTimer, resolve_drafter
from replay.ingest.schema import TraceMetadata, read_trace

# eta_attention is kept at the run's value: per-request latencies cannot tell attention reads from
# weight reads at the batch sizes a log holds (fitting both traded one against the other and raised
# the held-out error on a synthetic log with known constants).
FITTED = ("eta_compute", "eta_memory", "host_overhead_ms")
_UPPER = np.array([0.0, 0.0, np.inf])  # log space: efficiencies <= 1
_FIRST_MOVE = np.array([-1.0, -1.0, 1.0])  # first simplex: efficiencies down, overhead up
HOST_FLOOR_MS = 1e-3  # log-space search needs a positive host overhead; below this it is reported as is
START_STEP = math.log(1.5)  # the first simplex moves each parameter by a factor 1.5
MAX_EVALUATIONS = 80


@dataclass
class Errors:
    ttft_mape: float | None
    tpot_mape: float | None
    requests: int
    max_ape: float | None = None

    @property
    def objective(self) -> float:
        vals = [v for v in (self.ttft_mape, self.tpot_mape) if v is not None]
        return float(np.mean(vals)) if vals else math.inf


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


def holdout_mask(request_ids: list[str], fraction: float, seed: int) -> np.ndarray:
    """True for held-out requests: a stable hash of (seed, id), so the split never depends on order."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"--holdout must be between 0 and 1 (exclusive), got {fraction}")
    limit = int(fraction * 2**64)
    return np.array([int.from_bytes(hashlib.blake2b(f"{seed}:{rid}".encode(), digest_size=8).digest(), "little")
                     < limit for rid in request_ids])


def _measured(table: pa.Table, measured: pa.Table | None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(measured TTFT, measured TPOT) in trace order (NaN where absent) and the request ids."""
    ids = table.column("request_id").to_pylist()
    src = measured if measured is not None else table
    if not {"measured_ttft_ms", "measured_tpot_ms"} & set(src.column_names):
        raise ReplayError("no measured_ttft_ms / measured_tpot_ms columns to calibrate against; ingest a log "
                          "with per-request latencies (docs/validate.md) or give --measured FILE")
    pos = {rid: i for i, rid in enumerate(src.column("request_id").to_pylist())}

    def col(name: str) -> np.ndarray:
        if name not in src.column_names:
            return np.full(len(ids), np.nan)
        values = src.column(name).cast(pa.float64()).to_numpy(zero_copy_only=False)
        return np.array([values[pos[r]] if r in pos else np.nan for r in ids], dtype=np.float64)

    return col("measured_ttft_ms"), col("measured_tpot_ms"), ids


def _apes(pred: np.ndarray, meas: np.ndarray, mask: np.ndarray) -> np.ndarray:
    ok = mask & np.isfinite(pred) & np.isfinite(meas) & (meas > 0)
    return np.abs(pred[ok] - meas[ok]) / meas[ok]


class _Replayer:
    """One config and trace; replays with given roofline parameters and returns per-request TTFT/TPOT."""

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

    def __call__(self, params: RooflineParams) -> tuple[np.ndarray, np.ndarray]:
        import time

        timer = RooflineTimer(self.model, self.hw, params, tp=self.config.tensor_parallel_size,
                              dtype=self.config.dtype, kv_dtype=self.config.kv_cache_dtype(),
                              drafter=resolve_drafter(self.config, self.model))
        out = self.workdir / "replay"
        t0 = time.perf_counter()
        replay_trace(self.table, self.meta, self.config, out, on_error="skip", overwrite=True,
                     setup=dataclasses.replace(self.setup, timer=timer))
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        req = pq.read_table(out / "requests.parquet", columns=["request_id", "status", "ttft_ms", "tpot_ms"])
        ttft = np.full(len(self.order), np.nan)
        tpot = np.full(len(self.order), np.nan)
        for rid, status, a, b in zip(*(req.column(c).to_pylist() for c in req.column_names), strict=True):
            if status == "finished":
                i = self.order[rid]
                ttft[i] = np.nan if a is None else a
                tpot[i] = np.nan if b is None else b
        return ttft, tpot


def nelder_mead(f, x0: np.ndarray, step: float, max_evaluations: int, tol: float = 1e-4) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (simplex of axis steps of ``step``) with the standard reflection (1),
    expansion (2), contraction (1/2) and shrink (1/2) moves; deterministic, no derivatives."""
    n = len(x0)
    simplex = [x0.copy()] + [x0 + step * _FIRST_MOVE[i] * np.eye(n)[i] for i in range(n)]
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


def _to_x(p: RooflineParams) -> np.ndarray:
    return np.log([p.eta_compute, p.eta_memory, max(p.host_overhead_ms, HOST_FLOOR_MS)])


def _from_x(x: np.ndarray, base: RooflineParams) -> RooflineParams:
    e = np.exp(np.minimum(x, _UPPER))
    return base.replace(eta_compute=float(e[0]), eta_memory=float(e[1]), host_overhead_ms=float(e[2]))


def calibrate_from_requests(outdir: str | Path, *, measured: str | Path | None = None, holdout: float = 0.3,
                            seed: int = 0, max_evaluations: int = MAX_EVALUATIONS) -> RequestFit:
    """Fit the roofline to the measured TTFT/TPOT of the log replayed in ``outdir`` (see module doc)."""
    from replay.reports.views import read_run_json

    outdir = Path(outdir)
    info = read_run_json(outdir)
    config = EngineConfig.model_validate(info.get("config") or {})
    trace_path = Path((info.get("trace") or {}).get("path", ""))
    if not trace_path.is_file():
        raise ReplayError(f"{outdir}: the run's trace {trace_path} is not found")
    table, meta = read_trace(trace_path)
    meas_table = None
    if measured is not None:
        from replay.ingest import load_trace

        meas_table, _ = load_trace(measured, drop_failed=True)
    m_ttft, m_tpot, ids = _measured(table, meas_table)
    held = holdout_mask(ids, holdout, seed)
    fit_mask = ~held
    with tempfile.TemporaryDirectory(prefix="replay-calibrate-") as tmp:
        replay = _Replayer(table, meta, config, Path(tmp))
        base = replay.setup.timer.params  # the run's own parameters (defaults, profile or host override)

        def errors(pred: tuple[np.ndarray, np.ndarray], mask: np.ndarray) -> Errors:
            ok = mask & (np.isfinite(m_ttft) | np.isfinite(m_tpot))
            a, b = _apes(pred[0], m_ttft, mask), _apes(pred[1], m_tpot, mask)
            both = np.concatenate([a, b])
            return Errors(float(a.mean()) if a.size else None, float(b.mean()) if b.size else None, int(ok.sum()),
                          float(both.max()) if both.size else None)

        history: list[tuple[dict[str, float], float]] = []
        start_pred = replay(base)
        fit_before, hold_before = errors(start_pred, fit_mask), errors(start_pred, held)
        if fit_before.requests < 3:
            raise ReplayError(f"only {fit_before.requests} fit requests with measurements; need at least 3")
        cache: dict[bytes, tuple[float, tuple[np.ndarray, np.ndarray]]] = {}

        def objective(x: np.ndarray) -> float:
            x = np.minimum(x, _UPPER)
            key = x.tobytes()
            if key not in cache:
                p = _from_x(x, base)
                pred = replay(p)
                cache[key] = (errors(pred, fit_mask).objective, pred)
                history.append(({k: getattr(p, k) for k in FITTED}, cache[key][0]))
            return cache[key][0]

        x = nelder_mead(objective, _to_x(base), START_STEP, max_evaluations)
        x = np.minimum(x, _UPPER)
        objective(x)
        best_pred = cache[x.tobytes()][1]
        params = _from_x(x, base)
        return RequestFit(params=params, start=base, fit_before=fit_before, fit_after=errors(best_pred, fit_mask),
                          holdout_before=hold_before, holdout_after=errors(best_pred, held),
                          evaluations=replay.calls, replay_seconds=replay.seconds, history=history)


def save_request_profile(fit: RequestFit, config: dict[str, Any], source: str, path: str | Path) -> None:
    """Write the fit as a timing profile (``timing: {profile: PATH}`` in a config)."""
    from replay.engine.timing.profile import FitStats, ProfileParams, TimingProfile, save_profile

    profile = TimingProfile(
        hardware=config.get("hardware", "h200_sxm"), model=config.get("model", ""),
        tensor_parallel_size=int(config.get("tensor_parallel_size", 1)), dtype=config.get("dtype", "bf16"),
        params=ProfileParams(**{k: float(v) for k, v in fit.params.as_dict().items()}),
        fit=FitStats(steps_csv=f"per-request TTFT/TPOT of {source}", num_steps=fit.fit_after.requests,
                     mape=fit.fit_after.objective, max_ape=fit.fit_after.max_ape or 0.0,
                     mape_before=fit.fit_before.objective, host_overhead_fixed=False),
    )
    save_profile(profile, path)

"""When each request reaches the server: trace timestamps, closed-loop turns, concurrency, Poisson.

The plan is fixed before the run except for what depends on completions (later turns of a session,
and concurrency slots), which the simulator releases as requests finish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from replay.base.errors import ConfigError
from replay.engine.config import LoadConfig
from replay.engine.load_window import parse_window
from replay.engine.trace_input import TraceArrays, sessions_of
from replay.ingest.trace_checks import MAX_TIME_MS


@dataclass
class ArrivalPlan:
    # The plan's own arrays (no view of the selection or the trace): a replay that owns its trace
    # hands their pages back as it reads past them (FleetLoop._release_before).
    open_order: np.ndarray  # request indices released at fixed times, sorted by time
    open_times: np.ndarray  # float64 ms, non-decreasing
    dependents: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # prev -> [(idx, delay)]
    concurrency: int = 0  # > 0: closed loop, the next request in trace order starts when one finishes
    concurrency_order: np.ndarray | None = None
    delay_rule: str = ""

    def released_rows(self) -> np.ndarray:
        """Every request index the plan releases outside concurrency mode: its open arrivals, then
        its closed-loop turns (each turn once, in its parent's order)."""
        turns = [child for deps in self.dependents.values() for child, _ in deps]
        return np.concatenate([np.asarray(self.open_order, dtype=np.int64), np.asarray(turns, dtype=np.int64)])


def check_clock(horizon_ms: float, key: str, fix: str) -> None:
    """Refuse a load whose arrivals lie beyond 2^42 ms: past it the engine's float64 millisecond clock no
    longer resolves a microsecond, so step times vanish against it (a TTFT of 0.0), and past 1e308 it
    is infinite. A trace's own timestamps are bounded the same way (ingest/trace_checks.py)."""
    if not np.isfinite(horizon_ms) or horizon_ms > MAX_TIME_MS:
        raise ConfigError(f"{key}: arrivals would reach {horizon_ms:.3g} ms, beyond 2^42 ms (139 years), where the "
                          f"engine's float64 clock cannot resolve a step's time; {fix}")


def plan_arrivals(trace: TraceArrays, load: LoadConfig, seed: int, selected: np.ndarray) -> ArrivalPlan:
    """``selected``: indices (in trace order) of the requests to replay."""
    n = len(selected)
    if load.mode == "concurrency":
        # Slots beyond the number of requests never fill: at most one per request is opened (a
        # concurrency of 2^63 would otherwise open slots for ever).
        return ArrivalPlan(
            open_order=np.empty(0, np.int64), open_times=np.empty(0, np.float64),
            concurrency=int(min(load.concurrency, max(n, 1))), concurrency_order=selected,
            delay_rule=(f"closed loop at concurrency {load.concurrency}: each request starts when a slot "
                        "frees, in trace order; trace timestamps and session delays are ignored"),
        )
    if load.mode == "poisson":
        rng = np.random.default_rng(seed)
        gaps = rng.exponential(1000.0 / float(load.rate), size=n)
        times = np.cumsum(gaps) - gaps[0] if n else gaps
        check_clock(float(times[-1]) if n else 0.0, f"load.rate={load.rate:g}", "raise load.rate")
        return ArrivalPlan(
            open_order=selected.copy(), open_times=times.astype(np.float64),
            delay_rule=(f"open-loop Poisson arrivals at {load.rate} req/s (seed {seed}) in trace order; "
                        "trace timestamps and session delays are ignored"),
        )

    # Trace timestamps. A row whose session has an earlier selected row and which carries delay_ms
    # is closed-loop: ready at the previous turn's completion + delay (both scaled by speedup).
    speedup = float(load.speedup)
    start = parse_window(load.window).start_ms if load.window is not None else 0.0
    # At 10 M rows every whole-selection temporary is 80 MB: the common case (no session turns, rows
    # in arrival order) makes the arrival times once, in place, and the order as one copy.
    arrival = _selected_values(trace.arrival_ms, selected).astype(np.float64)
    if start:  # a window's replay starts at the window's start
        arrival -= start
    with np.errstate(over="ignore"):  # a speedup this small is refused below (check_clock), naming the key
        arrival /= speedup
    dependents: dict[int, list[tuple[int, float]]] = {}
    closed: list[int] = []  # positions of the closed-loop rows
    last_in_session: dict[str, int] = {}
    session_delay: dict[str, float] = {}  # a session's closed-loop delays add up along its turns
    positions, sessions = sessions_of(trace.session_id, selected)
    delays = trace.delay_ms[selected[positions]].tolist() if positions else []
    for pos, sid, d in zip(positions, sessions, delays):  # rows are in arrival order: a session's turns in order
        idx = int(selected[pos])
        prev = last_in_session.get(sid)
        last_in_session[sid] = idx
        if prev is not None and not math.isnan(d):
            dependents.setdefault(prev, []).append((idx, d / speedup))
            session_delay[sid] = session_delay.get(sid, 0.0) + d / speedup
            closed.append(pos)
    num_closed = len(closed)
    if closed:
        is_open = np.ones(n, dtype=bool)
        is_open[closed] = False
        open_idx, open_times = selected[is_open], arrival[is_open]
    else:
        open_idx, open_times = selected.copy(), arrival  # the plan's own arrays (ArrivalPlan)
    horizon = (float(open_times.max()) if len(open_times) else 0.0) + max(session_delay.values(), default=0.0)
    check_clock(horizon, f"load.speedup={speedup:g}", "raise load.speedup")
    if len(open_times) > 1 and not (open_times[1:] >= open_times[:-1]).all():
        sort = np.argsort(open_times, kind="stable")
        open_idx, open_times = open_idx[sort], open_times[sort]
    shifted = f"(minus the window start, {load.window}) " if start else ""
    rule = (f"trace timestamps {shifted}/ speedup {speedup:g}; {num_closed} later session turns with delay_ms are "
            "closed-loop (ready at the previous turn's finish + delay_ms / speedup); rows without delay_ms "
            "keep their timestamps (open loop)")
    return ArrivalPlan(open_order=open_idx, open_times=open_times, dependents=dependents, delay_rule=rule)


def _selected_values(column: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """``column[selected]``, as a view when the selection is a run of consecutive rows (the first
    ``load.max_requests``, a window): no copy of the column beside the one the caller makes."""
    n = len(selected)
    if n and int(selected[-1]) - int(selected[0]) == n - 1:
        lo = int(selected[0])
        return column[lo:lo + n]
    return column[selected]

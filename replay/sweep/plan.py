"""`replay plan`: the smallest value of a monotone key (fleet.replicas, a cache size...) that meets the
SLO, per combination of the other grid values, by bisection over the key's candidate values.

Assumption: along the key, meeting the SLO is monotone (``goal='min'``: fail...fail pass...pass as the
value grows, e.g. more replicas; ``goal='max'``: pass...pass fail...fail, e.g. a higher load.speedup).
Each round runs, per undecided combination, up to ``k`` probes evenly spaced in its open interval
(k = idle workers per combination, so the pool stays busy: plain bisection when there is one worker
per combination). Monotonicity is checked on every run made (``check_monotone``); see docs/sweep.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from replay.sweep.grid import Axis, Point, Value, product
from replay.sweep.runner import PointResult, Progress, SweepSession

Goal = Literal["min", "max"]
METRIC_TOLERANCE = 0.05  # a constrained metric may worsen by 5% between probes before it counts as non-monotone


@dataclass
class Combo:
    """One combination of the other grid values and its bisection state over ``values`` (ordered so
    that passing is expected at the high end)."""

    others: Point
    values: list[Value]
    results: dict[int, PointResult] = field(default_factory=dict)
    lo: int = -1                  # highest index known to fail (-1: none)
    hi: int | None = None         # lowest index known to pass (None: not yet known)
    infeasible: bool = False
    violations: list[str] = field(default_factory=list)
    scanned: bool = False

    @property
    def decided(self) -> bool:
        return self.infeasible or (self.hi is not None and self.hi - self.lo <= 1)


def _spaced(lo: int, hi: int, k: int) -> list[int]:
    """Up to ``k`` distinct indices strictly between ``lo`` and ``hi``, evenly spaced."""
    gap = hi - lo - 1
    if gap <= 0 or k <= 0:
        return []
    if k >= gap:
        return list(range(lo + 1, hi))
    return sorted({lo + round((hi - lo) * j / (k + 1)) for j in range(1, k + 1)} - {lo, hi})


def _probes(c: Combo, k: int) -> list[int]:
    n = len(c.values)
    if c.hi is None:  # first: is the top feasible at all? the rest of this round bisects below it
        return [n - 1, *_spaced(c.lo, n - 1, k - 1)]
    return _spaced(c.lo, c.hi, k)


def _passes(res: PointResult, session: SweepSession) -> bool:
    return bool(res.metrics) and session.slo.met(res.metrics) is True


def _update(c: Combo, session: SweepSession) -> None:
    ok = {i: _passes(r, session) for i, r in c.results.items()}
    passing = [i for i, p in ok.items() if p]
    if c.hi is None and not ok.get(len(c.values) - 1, True):
        c.infeasible = True
        return
    c.hi = min(passing) if passing else c.hi
    if c.hi is not None:
        c.lo = max((i for i, p in ok.items() if not p and i < c.hi), default=-1)


def check_monotone(c: Combo, session: SweepSession) -> list[str]:
    """Every pair of runs of this combination that contradicts monotonicity: a failing run at a value
    beyond a passing one, or a constrained metric that worsens by more than METRIC_TOLERANCE as the
    value moves toward the passing end."""
    found: list[str] = []
    items = sorted(c.results.items())
    first_pass = next((i for i, r in items if _passes(r, session)), None)
    if first_pass is not None:
        for i, r in items:
            if i > first_pass and not _passes(r, session):
                found.append(f"{c.values[i].label} fails although {c.values[first_pass].label} passes")
    runs = [(i, r.metrics) for i, r in items if r.metrics]
    for key in session.slo.constraints:
        for (i, a), (j, b) in zip(runs, runs[1:]):
            va, vb = a.get(key), b.get(key)
            if va is not None and vb is not None and vb > va * (1 + METRIC_TOLERANCE) + 1e-9:
                found.append(f"{key} rises from {va:,.4g} at {c.values[i].label} to {vb:,.4g} at {c.values[j].label}")
    return found


@dataclass
class PlanOutcome:
    vary: Axis
    goal: Goal
    combos: list[Combo]
    results: list[PointResult]     # every run made, combination by combination, in value order

    def answer(self, c: Combo) -> PointResult | None:
        return None if c.infeasible or c.hi is None else c.results[c.hi]

    def deciding_fail_run(self, c: Combo) -> PointResult | None:
        return c.results.get(c.lo) if c.lo >= 0 else None


def plan(session: SweepSession, vary: Axis, others: list[Axis], goal: Goal = "min",
         on_violation: Literal["warn", "scan"] = "warn", progress: Progress | None = None) -> PlanOutcome:
    values = list(vary.values) if goal == "min" else list(reversed(vary.values))
    combos = [Combo(others=p, values=values) for p in product(others)]
    workers = session.parallelism()
    while True:
        active = [c for c in combos if not c.decided]
        if not active:
            break
        k = max(1, workers // len(active))
        batch: list[tuple[Combo, int]] = [(c, i) for c in active for i in _probes(c, k) if i not in c.results]
        if not batch:  # nothing new to learn (cannot happen with a consistent state): stop rather than loop
            break
        got = session.run_points([(*c.others, (vary.key, c.values[i])) for c, i in batch], progress)
        for (c, i), res in zip(batch, got):
            c.results[i] = res
        for c in active:
            _update(c, session)
    for c in combos:
        c.violations = check_monotone(c, session)
        if c.violations and on_violation == "scan" and not c.infeasible:
            upto = c.hi if c.hi is not None else len(values) - 1
            missing = [i for i in range(upto) if i not in c.results]
            got = session.run_points([(*c.others, (vary.key, c.values[i])) for i in missing], progress)
            c.results.update(zip(missing, got))
            c.scanned = True
            first = next((i for i in sorted(c.results) if _passes(c.results[i], session)), None)
            c.hi, c.infeasible = first, first is None
            c.lo = first - 1 if first else -1
            c.violations = check_monotone(c, session)
    ordered = [r for c in combos for _, r in sorted(c.results.items(), key=lambda kv: _natural(kv[0], goal, values))]
    return PlanOutcome(vary, goal, combos, ordered)


def _natural(i: int, goal: Goal, values: list[Value]) -> int:
    """Index in ascending key order (the search list is reversed for goal='max')."""
    return i if goal == "min" else len(values) - 1 - i


def answer_rows(outcome: PlanOutcome, session: SweepSession) -> list[dict[str, Any]]:
    """One row per combination: the answer, its GPUs, and the runs that decided it."""
    rows = []
    for c in outcome.combos:
        ans, fail = outcome.answer(c), outcome.deciding_fail_run(c)
        row: dict[str, Any] = {k: v.label for k, v in c.others}
        row[outcome.vary.key] = None if ans is None else c.values[c.hi].label
        row["gpus"] = None if ans is None else ans.metrics["gpus"]
        row["feasible"] = ans is not None
        row["monotone"] = not c.violations
        row["scanned"] = c.scanned
        row["runs"] = len(c.results)
        row["deciding_pass"] = None if ans is None else session.where(ans)
        row["deciding_fail"] = None if fail is None else session.where(fail)
        row["deciding_fail_value"] = None if fail is None else c.values[c.lo].label
        for key in session.slo.constraints:
            row[f"{key}_at_answer"] = None if ans is None else ans.metrics.get(key)
            row[f"{key}_at_fail"] = None if fail is None or not fail.metrics else fail.metrics.get(key)
        row["violations"] = "; ".join(c.violations) or None
        rows.append(row)
    return rows

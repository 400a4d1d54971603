"""`replay plan`: the fewest GPUs that meet the SLO, per combination of the other grid values.

The varied keys (``--vary``, one or more) span a grid of candidates, each with a GPU count known
before it runs (``SweepSession.point_gpus``). Per combination of the ``--grid`` keys (a *group*, one
answer each) the answer is the candidate with the fewest GPUs that passes (ties: the earlier
candidate in grid order). Two searches find it:

- **bisection** along the last varied key, once per *line* (a combination of the other varied keys):
  right when passing is monotone along that key (fail...fail pass...pass as the value grows), with a
  logarithmic number of runs. Each round runs, per undecided line, up to ``k`` probes evenly spaced
  in its open interval (k = idle workers per line, so the pool stays busy). The group's answer is the
  cheapest line answer: every line is searched, so nothing is assumed along the other keys.
- **scan**: every candidate in order of GPUs, ``workers`` at a time, until one passes; everything
  cheaper than the answer ran and failed, so it is right on any curve.

``search='auto'`` (the default) bisects, also runs each line's cheapest candidate in the first round
(a pass there ends the line at once), then checks every run it made against monotonicity
(``check_monotone``); a group whose runs contradict it is scanned below its bisection answer (all of
it when no line passed). ``'bisect'`` trusts the bisection and only flags contradictions;
``'scan'`` scans from the start. Each answer row says which search decided it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from replay.sweep.grid import Axis, Point, Value, product
from replay.sweep.runner import PointResult, Progress, SweepSession

Goal = Literal["min", "max"]
Search = Literal["auto", "bisect", "scan"]
SEARCHES = ("auto", "bisect", "scan")
METRIC_TOLERANCE = 0.05  # a constrained metric may worsen by 5% between probes before it counts as non-monotone


@dataclass
class Line:
    """The candidates along the last varied key for fixed values of the grid keys and of the other
    varied keys (``others``), ordered so that passing is expected at the high end; the bisection
    state over them."""

    others: Point
    values: list[Value]
    gpus: list[float]             # GPUs of each candidate (inf: its config does not validate)
    results: dict[int, PointResult] = field(default_factory=dict)
    lo: int = -1                  # highest index known to fail (-1: none)
    hi: int | None = None         # lowest index known to pass (None: not yet known)
    infeasible: bool = False
    violations: list[str] = field(default_factory=list)

    @property
    def decided(self) -> bool:
        return self.infeasible or (self.hi is not None and self.hi - self.lo <= 1)

    def point(self, key: str, i: int) -> Point:
        return (*self.others, (key, self.values[i]))


@dataclass
class Group:
    """One combination of the ``--grid`` keys: its lines, one answer, and how it was found."""

    grid: Point
    lines: list[Line]
    search: str = "bisection"     # what decided the answer: bisection, scan, or bisection, then scan
    answer: tuple[int, int] | None = None        # (line, index)
    deciding_fail: tuple[int, int] | None = None

    def order(self) -> list[tuple[int, int]]:
        """Every candidate, cheapest first (ties: line order, then value order)."""
        cands = [(li, i) for li, line in enumerate(self.lines) for i in range(len(line.values))]
        return sorted(cands, key=lambda c: (self.lines[c[0]].gpus[c[1]], c[0], c[1]))

    def cost(self, c: tuple[int, int]) -> tuple[float, int, int]:
        return self.lines[c[0]].gpus[c[1]], c[0], c[1]

    @property
    def scanned(self) -> bool:
        return "scan" in self.search


def _spaced(lo: int, hi: int, k: int) -> list[int]:
    """Up to ``k`` distinct indices strictly between ``lo`` and ``hi``, evenly spaced."""
    gap = hi - lo - 1
    if gap <= 0 or k <= 0:
        return []
    if k >= gap:
        return list(range(lo + 1, hi))
    return sorted({lo + round((hi - lo) * j / (k + 1)) for j in range(1, k + 1)} - {lo, hi})


def _probes(line: Line, k: int, with_cheapest: bool) -> list[int]:
    n = len(line.values)
    if line.hi is None and not line.results:  # first: is the top feasible at all? (and the cheapest)
        first = [n - 1, 0] if with_cheapest and n > 1 else [n - 1]
        return first + [i for i in _spaced(line.lo, n - 1, k - len(first)) if i not in first]
    if line.hi is None:
        return []  # the top failed: nothing to bisect
    return _spaced(line.lo, line.hi, k)


def _passes(res: PointResult, session: SweepSession) -> bool:
    return bool(res.metrics) and session.slo.met(res.metrics) is True


def _update(line: Line, session: SweepSession) -> None:
    ok = {i: _passes(r, session) for i, r in line.results.items()}
    passing = [i for i, p in ok.items() if p]
    if passing:
        line.hi = min(passing)
        line.lo = max((i for i, p in ok.items() if not p and i < line.hi), default=-1)
    elif not ok.get(len(line.values) - 1, True):
        line.infeasible = True


def check_monotone(line: Line, session: SweepSession) -> list[str]:
    """Every pair of runs of this line that contradicts monotonicity: a failing run at a value
    beyond a passing one, or a constrained metric that worsens by more than METRIC_TOLERANCE as the
    value moves toward the passing end."""
    found: list[str] = []
    items = sorted(line.results.items())
    first_pass = next((i for i, r in items if _passes(r, session)), None)
    if first_pass is not None:
        for i, r in items:
            if i > first_pass and not _passes(r, session):
                found.append(f"{line.values[i].label} fails although {line.values[first_pass].label} passes")
    runs = [(i, r.metrics) for i, r in items if r.metrics]
    for key in session.slo.constraints:
        for (i, a), (j, b) in zip(runs, runs[1:]):
            va, vb = a.get(key), b.get(key)
            if va is not None and vb is not None and vb > va * (1 + METRIC_TOLERANCE) + 1e-9:
                found.append(f"{key} rises from {va:,.4g} at {line.values[i].label} to {vb:,.4g} "
                             f"at {line.values[j].label}")
    return found


@dataclass
class PlanOutcome:
    vary: list[Axis]
    goal: Goal
    groups: list[Group]
    results: list[PointResult]     # every run made, group by group, line by line, in value order

    def result(self, g: Group, c: tuple[int, int] | None) -> PointResult | None:
        return None if c is None else g.lines[c[0]].results.get(c[1])


def _point_gpus(session: SweepSession, point: Point) -> float:
    gpus = getattr(session, "point_gpus", None)
    got = gpus(point) if gpus is not None else None
    return math.inf if got is None else float(got)


def _groups(session: SweepSession, vary: list[Axis], others: list[Axis], goal: Goal) -> list[Group]:
    last = vary[-1]
    # Bisection walks the candidates in order: ascending, whatever order --vary listed them in.
    ascending = sorted(last.values, key=lambda v: v.label)
    values = ascending if goal == "min" else list(reversed(ascending))
    groups = []
    for grid in product(others):
        lines = []
        for lead in product(vary[:-1]):
            others_point = (*grid, *lead)
            gpus = [_point_gpus(session, (*others_point, (last.key, v))) for v in values]
            # A candidate whose config does not validate (fleet.replicas=3 with fleet.clusters=2) is
            # not on the curve: bisecting over it would read it as a failing run.
            valid = [i for i, g in enumerate(gpus) if g != math.inf] or list(range(len(values)))
            lines.append(Line(others=others_point, values=[values[i] for i in valid], gpus=[gpus[i] for i in valid]))
        groups.append(Group(grid=grid, lines=lines))
    return groups


def _bisect(session: SweepSession, key: str, lines: list[Line], with_cheapest: bool,
            progress: Progress | None) -> None:
    workers = session.parallelism()
    while True:
        active = [line for line in lines if not line.decided]
        if not active:
            return
        k = max(1, workers // len(active))
        batch = [(line, i) for line in active for i in _probes(line, k, with_cheapest) if i not in line.results]
        if not batch:  # nothing new to learn (cannot happen with a consistent state): stop rather than loop
            return
        got = session.run_points([line.point(key, i) for line, i in batch], progress, all_invalid_is_an_error=False)
        for (line, i), res in zip(batch, got):
            line.results[i] = res
        for line in active:
            _update(line, session)


def _first_pass(g: Group, session: SweepSession) -> tuple[int, int] | None:
    """The cheapest passing candidate among the runs made."""
    passing = [(li, i) for li, line in enumerate(g.lines) for i, r in line.results.items() if _passes(r, session)]
    return min(passing, key=g.cost) if passing else None


def _scan(session: SweepSession, key: str, groups: list[Group], progress: Progress | None) -> None:
    """Run every candidate cheaper than each group's best pass, cheapest first, until one passes."""
    workers = session.parallelism()
    todo = {id(g): g for g in groups}
    while todo:
        k = max(1, workers // len(todo))
        batch: list[tuple[Group, int, int]] = []
        for g in list(todo.values()):
            best = _first_pass(g, session)
            cheaper = [c for c in g.order() if best is None or g.cost(c) < g.cost(best)]
            untried = [c for c in cheaper if c[1] not in g.lines[c[0]].results]
            if not untried:
                del todo[id(g)]
                continue
            batch += [(g, li, i) for li, i in untried[:k]]
        if not batch:
            return
        got = session.run_points([g.lines[li].point(key, i) for g, li, i in batch], progress,
                                 all_invalid_is_an_error=False)
        for (g, li, i), res in zip(batch, got):
            g.lines[li].results[i] = res


def _decide(g: Group, session: SweepSession) -> None:
    """The group's answer and the failing run beside it."""
    if g.scanned:
        g.answer = _first_pass(g, session)
        tried = [c for c in g.order() if c[1] in g.lines[c[0]].results]
        below = [c for c in tried if g.answer is None or g.cost(c) < g.cost(g.answer)]
        g.deciding_fail = below[-1] if below else None
        return
    answers = [(li, line.hi) for li, line in enumerate(g.lines) if not line.infeasible and line.hi is not None]
    g.answer = min(answers, key=g.cost) if answers else None
    if g.answer is not None:
        lo = g.lines[g.answer[0]].lo
        g.deciding_fail = (g.answer[0], lo) if lo >= 0 else None


def plan(session: SweepSession, vary: Axis | list[Axis], others: list[Axis], goal: Goal = "min",
         search: Search = "auto", progress: Progress | None = None) -> PlanOutcome:
    vary = [vary] if isinstance(vary, Axis) else list(vary)
    key = vary[-1].key
    groups = _groups(session, vary, others, goal)
    lines = [line for g in groups for line in g.lines]
    if search != "scan":
        _bisect(session, key, lines, search == "auto", progress)
    for line in lines:
        line.violations = check_monotone(line, session)
    if search == "scan":
        for g in groups:
            g.search = "scan"
    elif search == "auto":
        for g in groups:
            if any(line.violations for line in g.lines):
                g.search = "bisection, then scan"
    _scan(session, key, [g for g in groups if g.scanned], progress)
    for g in groups:
        for line in g.lines:
            line.violations = check_monotone(line, session)
        _decide(g, session)
    ordered = [r for g in groups for line in g.lines
               for _, r in sorted(line.results.items(), key=lambda kv: _natural(kv[0], goal, line.values))]
    return PlanOutcome(vary, goal, groups, ordered)


def _natural(i: int, goal: Goal, values: list[Value]) -> int:
    """Index in ascending key order (the search list is reversed for goal='max')."""
    return i if goal == "min" else len(values) - 1 - i


def _labels(line: Line, i: int, vary: list[Axis]) -> dict[str, Any]:
    keys = {a.key for a in vary}
    out = {k: v.label for k, v in line.others if k in keys}
    out[vary[-1].key] = line.values[i].label
    return out


def answer_rows(outcome: PlanOutcome, session: SweepSession) -> list[dict[str, Any]]:
    """One row per group: the answer (a value per varied key), its GPUs, how it was found, and the runs
    that decided it."""
    rows = []
    vary = outcome.vary
    for g in outcome.groups:
        ans, fail = outcome.result(g, g.answer), outcome.result(g, g.deciding_fail)
        row: dict[str, Any] = {k: v.label for k, v in g.grid}
        at = _labels(g.lines[g.answer[0]], g.answer[1], vary) if g.answer else {}
        for axis in vary:
            row[axis.key] = at.get(axis.key)
        row["gpus"] = None if ans is None else ans.metrics["gpus"]
        row["feasible"] = ans is not None
        row["monotone"] = not any(line.violations for line in g.lines)
        row["scanned"] = g.scanned
        row["search"] = g.search
        row["runs"] = sum(len(line.results) for line in g.lines)
        row["deciding_pass"] = None if ans is None else session.where(ans)
        row["deciding_fail"] = None if fail is None else session.where(fail)
        if g.deciding_fail is None:
            row["deciding_fail_value"] = None
        else:
            failed = _labels(g.lines[g.deciding_fail[0]], g.deciding_fail[1], vary)
            row["deciding_fail_value"] = (failed[vary[0].key] if len(vary) == 1
                                          else ", ".join(f"{k}={v}" for k, v in failed.items()))
        for metric in session.slo.constraints:
            row[f"{metric}_at_answer"] = None if ans is None else ans.metrics.get(metric)
            row[f"{metric}_at_fail"] = None if fail is None or not fail.metrics else fail.metrics.get(metric)
        notes = []
        for line in g.lines:
            where = ", ".join(f"{k}={v.label}" for k, v in line.others if k in {a.key for a in vary})
            notes += [f"{where}: {v}" if where else v for v in line.violations]
        row["violations"] = "; ".join(notes) or None
        rows.append(row)
    return rows

"""The per-step and per-request tables both drivers record, their compact encoding and the diff.

Per step: tokens scheduled per request (drafts included), preempted requests, free blocks after
``schedule()`` and after ``update_from_output()``, and each admission from the waiting queue with
its ``num_computed_tokens`` (the prefix hit, or a resumed request's hit). Per request: the step of
its first token and of its finish. Steps are numbered from 0; a step that schedules nothing is
still a step (a preemption-only step), as in vLLM's engine loop.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = 2  # 2: free counts stored as changes


@dataclass
class Step:
    sched: dict[int, int]  # request -> tokens scheduled (vLLM's num_scheduled_tokens)
    preempted: list[int]
    admitted: list[tuple[int, int]]  # (request, num_computed_tokens at admission)
    free_after_schedule: int
    free_after_update: int


@dataclass
class Tables:
    steps: list[Step] = field(default_factory=list)
    first_token: dict[int, int] = field(default_factory=dict)  # request -> step
    finish: dict[int, int] = field(default_factory=dict)  # request -> step


class StepRecorder:
    """Turns the running set before and after each step into admissions and preemptions."""

    def __init__(self) -> None:
        self.tables = Tables()
        self._running: list[int] = []

    def scheduled(self, sched: dict[int, int], computed_after: dict[int, int], running_after: list[int],
                  free: int) -> None:
        """``computed_after``: num_computed_tokens of each scheduled request after schedule()."""
        before = set(self._running)
        after = set(running_after)
        admitted = [(r, computed_after[r] - sched[r]) for r in running_after if r not in before]
        preempted = [r for r in self._running if r not in after]
        self.tables.steps.append(Step(dict(sched), preempted, admitted, free, -1))
        self._running = list(running_after)

    def updated(self, step: int, emitted: list[int], finished: list[int], running_after: list[int],
                free: int) -> None:
        t = self.tables
        for r in emitted:
            t.first_token.setdefault(r, step)
        for r in finished:
            t.finish[r] = step
        t.steps[-1].free_after_update = free
        self._running = list(running_after)


# ------------------------------------------------------------------ compact encoding
def encode(t: Tables) -> dict:
    """Steps as deltas against the previous step (a decode step is mostly unchanged)."""
    steps = []
    prev: dict[int, int] = {}
    free = 0
    for s in t.steps:
        changed = [[r, n] for r, n in s.sched.items() if prev.get(r) != n]
        gone = [r for r in prev if r not in s.sched]
        # Free counts as changes: against the previous step's end, then across the update.
        row: dict = {"f": [s.free_after_schedule - free, s.free_after_update - s.free_after_schedule]}
        free = s.free_after_update
        if changed:
            row["c"] = changed
        if gone:
            row["g"] = gone
        if s.preempted:
            row["p"] = s.preempted
        if s.admitted:
            row["a"] = [list(x) for x in s.admitted]
        steps.append(row)
        prev = s.sched
    return {"steps": steps, "first_token": sorted(t.first_token.items()), "finish": sorted(t.finish.items())}


def decode(d: dict) -> Tables:
    t = Tables()
    prev: dict[int, int] = {}
    free = 0
    for row in d["steps"]:
        sched = {r: n for r, n in prev.items() if r not in set(row.get("g", ()))}
        for r, n in row.get("c", ()):
            sched[r] = n
        after_schedule = free + row["f"][0]
        free = after_schedule + row["f"][1]
        t.steps.append(Step(sched, list(row.get("p", ())), [tuple(x) for x in row.get("a", ())],
                            after_schedule, free))
        prev = sched
    t.first_token = {int(r): s for r, s in d["first_token"]}
    t.finish = {int(r): s for r, s in d["finish"]}
    return t


def write_fixture(path: Path, workload: dict, tables: Tables, meta: dict) -> None:
    """gzip'd JSON, written to a temporary name and renamed (never a half file)."""
    body = json.dumps({"format": FORMAT, "workload": workload, "meta": meta, "tables": encode(tables)},
                      separators=(",", ":"), sort_keys=True).encode()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(gzip.compress(body, mtime=0))
    tmp.replace(path)


def read_fixture(path: Path) -> tuple[dict, dict, Tables]:
    d = json.loads(gzip.decompress(path.read_bytes()))
    if d.get("format") != FORMAT:
        raise ValueError(f"{path}: fixture format {d.get('format')}, expected {FORMAT}: regenerate it")
    return d["workload"], d["meta"], decode(d["tables"])


# ------------------------------------------------------------------ comparison
def _step_diff(a: Step, b: Step) -> list[str]:
    out = []
    if a.sched != b.sched:
        keys = sorted(set(a.sched) | set(b.sched))
        diffs = [f"req {r}: vllm {a.sched.get(r)} replay {b.sched.get(r)}" for r in keys
                 if a.sched.get(r) != b.sched.get(r)]
        out.append(f"scheduled tokens differ ({len(diffs)} requests): " + "; ".join(diffs[:6]))
    if a.preempted != b.preempted:
        out.append(f"preempted: vllm {a.preempted} replay {b.preempted}")
    if a.admitted != b.admitted:
        out.append(f"admitted (req, num_computed_tokens): vllm {a.admitted[:8]} replay {b.admitted[:8]}")
    if a.free_after_schedule != b.free_after_schedule:
        out.append(f"free blocks after schedule: vllm {a.free_after_schedule} replay {b.free_after_schedule}")
    if a.free_after_update != b.free_after_update:
        out.append(f"free blocks after update: vllm {a.free_after_update} replay {b.free_after_update}")
    return out


@dataclass
class Comparison:
    steps_vllm: int
    steps_replay: int
    identical_steps: int
    first_difference: str | None  # None: identical in every step and every request
    request_differences: int

    @property
    def identical(self) -> bool:
        return self.first_difference is None


def compare(vllm: Tables, replay: Tables) -> Comparison:
    """Step by step; the first differing step is described in full."""
    first = None
    same = 0
    for i, (a, b) in enumerate(zip(vllm.steps, replay.steps)):
        d = _step_diff(a, b)
        if d:
            if first is None:
                first = f"step {i}: " + " | ".join(d)
        else:
            same += 1
    if first is None and len(vllm.steps) != len(replay.steps):
        first = f"step counts differ: vllm {len(vllm.steps)} replay {len(replay.steps)}"
    req_diff = 0
    for name, x, y in (("first token", vllm.first_token, replay.first_token),
                       ("finish", vllm.finish, replay.finish)):
        bad = sorted(r for r in set(x) | set(y) if x.get(r) != y.get(r))
        req_diff += len(bad)
        if bad and first is None:
            r = bad[0]
            first = f"{name} step of req {r}: vllm {x.get(r)} replay {y.get(r)} ({len(bad)} requests differ)"
    return Comparison(len(vllm.steps), len(replay.steps), same, first, req_diff)

"""Step and chunk rows buffered as runs of equal values, expanded into columns by numpy.

A decode window's steps differ only in their index, start and duration (and, at the steps that
allocate, in the free block count); its chunks are the running requests' ids again at every step
end, each one token. Buffering rows as runs, (value, count) per column, costs the simulation a few
list appends per window instead of building typed arrays row by row (perf: building them was 11%
of the main thread of reuse-30k-4rps, about 30 us per window). The runs are expanded into exactly
the columns that row-by-row buffering gives, on the writer thread, when a row group is due
(``ColumnCutter``): the recorder hands a full buffer over and starts a new one.

A column of the steps file is one of three kinds: the step index (runs of consecutive indices),
start and duration (one value per row), and everything else (runs of one value). Columns that
change together share one list of run lengths.
"""

from __future__ import annotations

from array import array
from typing import Final

import numpy as np

from replay.engine.output_schema import STEPS_SCHEMA

# Column positions in STEPS_SCHEMA (engine/output_schema.py), the replica column last when present.
# Final literals: compiled code inlines them instead of reading a module global at every row.
STEP: Final = 0
START: Final = 1
DURATION: Final = 2
RUNNING: Final = 7
KV_USAGE: Final = 10
KV_BLOCKS_USED: Final = 11
BYTES_STORED: Final = 14
CPU_BLOCKS_USED: Final = 16
CPU_USAGE: Final = 17
# Columns constant over a whole window (a row of record_step is a run of one): scheduled, prefill
# tokens and requests, decode requests, waiting, preemptions, drafts, accepted, bytes loaded.
_PER_SEGMENT: Final = (3, 4, 5, 6, 8, 9, 12, 13, 15)
_ZERO_IN_WINDOW: Final = (4, 5, 9, 12, 13, 15)
NUM_STEP_COLUMNS: Final = 18
assert STEPS_SCHEMA.names == [
    "step", "start_ms", "duration_ms", "scheduled_tokens", "prefill_tokens", "prefill_requests", "decode_requests",
    "running", "waiting", "preemptions", "kv_usage", "kv_blocks_used", "draft_tokens", "accepted_tokens",
    "bytes_stored", "bytes_loaded", "cpu_blocks_used", "cpu_usage"], "row_runs' column positions are STEPS_SCHEMA's"


class StepRuns:
    """Pending rows of steps.parquet as runs; the recorder hands a full one to the writer thread
    and starts a new one."""

    __slots__ = ("replica_column", "num_rows", "step_first", "step_count", "starts", "durations", "values",
                 "seg_counts", "running_counts", "free_counts", "stored_counts", "cpu_counts")

    def __init__(self, replica_column: bool) -> None:
        self.replica_column = replica_column
        self.num_rows = 0
        self.step_first: list[int] = []  # runs of consecutive step indices: first index, length
        self.step_count: list[int] = []
        self.starts: list[float] = []
        self.durations: list[float] = []
        # One value list per column (empty for the step, start and duration columns).
        self.values: list[list] = [[] for _ in range(NUM_STEP_COLUMNS + 1)]
        self.seg_counts: list[int] = []  # run lengths of the _PER_SEGMENT columns and the replica
        self.running_counts: list[int] = []
        self.free_counts: list[int] = []  # kv_usage and kv_blocks_used
        self.stored_counts: list[int] = []
        self.cpu_counts: list[int] = []  # cpu_blocks_used and cpu_usage

    def _steps(self, first: int, n: int) -> None:
        firsts = self.step_first
        counts = self.step_count
        if firsts and firsts[-1] + counts[-1] == first:
            counts[-1] += n
        else:
            firsts.append(first)
            counts.append(n)

    def add_row(self, row: tuple, replica: int) -> None:
        """One step as record_step gives it, in STEPS_SCHEMA column order."""
        self._steps(row[STEP], 1)
        self.starts.append(row[START])
        self.durations.append(row[DURATION])
        values = self.values
        for j in _PER_SEGMENT:
            values[j].append(row[j])
        values[RUNNING].append(row[RUNNING])
        values[KV_USAGE].append(row[KV_USAGE])
        values[KV_BLOCKS_USED].append(row[KV_BLOCKS_USED])
        values[BYTES_STORED].append(row[BYTES_STORED])
        values[CPU_BLOCKS_USED].append(row[CPU_BLOCKS_USED])
        values[CPU_USAGE].append(row[CPU_USAGE])
        if self.replica_column:
            values[NUM_STEP_COLUMNS].append(replica)
        self.seg_counts.append(1)
        self.running_counts.append(1)
        self.free_counts.append(1)
        self.stored_counts.append(1)
        self.cpu_counts.append(1)
        self.num_rows += 1

    def add_window(self, first_step: int, starts: list[float], durations: list[float], num_running: int,
                   num_waiting: int, free_runs: list[tuple[int, int]], usable: int,
                   stored_runs: list[tuple[int, int]], cpu_runs: list[tuple[int, int]] | None,
                   num_cpu_blocks: int, replica: int, last_running: int | None) -> None:
        """A decode window's rows (Recorder.record_decode_window); ``free_runs``, ``stored_runs`` and
        ``cpu_runs`` are (value, number of steps) covering its ``len(starts)`` steps."""
        n = len(starts)
        self._steps(first_step, n)
        self.starts.extend(starts)
        self.durations.extend(durations)
        values = self.values
        for j in _ZERO_IN_WINDOW:
            values[j].append(0)
        values[3].append(num_running)  # scheduled tokens: one per running request
        values[6].append(num_running)  # decode requests
        values[8].append(num_waiting)
        if self.replica_column:
            values[NUM_STEP_COLUMNS].append(replica)
        self.seg_counts.append(n)
        # Running: the last row counts the requests still running after its step (it may finish some).
        running = values[RUNNING]
        last = num_running if last_running is None else last_running
        if last == num_running or n == 1:
            running.append(last)
            self.running_counts.append(n)
        else:
            running.append(num_running)
            running.append(last)
            self.running_counts.append(n - 1)
            self.running_counts.append(1)
        # KV usage is the same double as record_step's (1.0 - free / usable), rounded to the column's type.
        usage = values[KV_USAGE]
        used = values[KV_BLOCKS_USED]
        counts = self.free_counts
        for free, k in free_runs:
            usage.append(1.0 - free / usable)
            used.append(usable - free)
            counts.append(k)
        stored = values[BYTES_STORED]
        for value, k in stored_runs:
            stored.append(value)
            self.stored_counts.append(k)
        cpu_used = values[CPU_BLOCKS_USED]
        cpu_usage = values[CPU_USAGE]
        if cpu_runs is None:
            cpu_used.append(0)
            cpu_usage.append(0.0)
            self.cpu_counts.append(n)
        else:  # as record_step: CPU blocks used and their share of the CPU pool
            for value, k in cpu_runs:
                cpu_used.append(value)
                cpu_usage.append(value / num_cpu_blocks)
                self.cpu_counts.append(k)
        self.num_rows += n

    def columns(self, dtypes: list[np.dtype]) -> list[np.ndarray]:
        """The rows as one array per column (on the writer thread)."""
        counts_of = {RUNNING: self.running_counts, KV_USAGE: self.free_counts, KV_BLOCKS_USED: self.free_counts,
                     BYTES_STORED: self.stored_counts, CPU_BLOCKS_USED: self.cpu_counts,
                     CPU_USAGE: self.cpu_counts}
        out: list[np.ndarray] = []
        for j, dt in enumerate(dtypes):
            if j == STEP:
                out.append(_consecutive_runs(self.step_first, self.step_count, dt))
            elif j == START:
                out.append(np.fromiter(self.starts, dt, len(self.starts)))
            elif j == DURATION:
                out.append(np.fromiter(self.durations, dt, len(self.durations)))
            else:
                out.append(_repeat(self.values[j], counts_of.get(j, self.seg_counts), dt))
        return out


def _repeat(values: list, counts: list[int], dt: np.dtype) -> np.ndarray:
    """Each value ``count`` times; a float is rounded to ``dt`` from the double, as a typed array's
    append rounds it."""
    return np.repeat(np.fromiter(values, dt, len(values)), _ints(counts))


def _consecutive_runs(firsts: list[int], counts: list[int], dt: np.dtype) -> np.ndarray:
    """first, first + 1, ..., first + count - 1 for each run, concatenated."""
    c = _ints(counts)
    total = int(c.sum())
    shift = _ints(firsts) - (np.cumsum(c) - c)  # value - row position, per run
    return (np.arange(total, dtype=np.int64) + np.repeat(shift, c)).astype(dt, copy=False)


class ChunkRuns:
    """Pending rows of chunks.parquet: each emission is a list of requests at one or more times.

    A step's chunks are its requests at one time; a decode window's are its running requests at
    each step end, in running order, one token each. The request column is built as it comes (a
    typed array repeated in C costs less than expanding it later: the expansion's temporaries
    are fresh memory, page faults on this kind of machine); times and tokens are runs.
    """

    __slots__ = ("num_rows", "reqs", "lengths", "repeats", "times", "tokens", "token_counts")

    def __init__(self) -> None:
        self.num_rows = 0
        self.reqs = array("i")  # the request column
        self.lengths: list[int] = []  # requests per emission
        self.repeats: list[int] = []  # times per emission
        self.times: list[float] = []  # each emission's times (each for all of its requests)
        self.tokens: list[int] = []  # token counts as runs
        self.token_counts: list[int] = []

    def add_step(self, reqs: list[int], time_ms: float, tokens: list[int]) -> None:
        """Chunks of one step, all at ``time_ms``; ``tokens`` empty: one token each."""
        n = len(reqs)
        self.reqs.extend(reqs)
        self.lengths.append(n)
        self.repeats.append(1)
        self.times.append(time_ms)
        if tokens:
            self.tokens.extend(tokens)
            self.token_counts.extend([1] * n)
        else:
            self.tokens.append(1)
            self.token_counts.append(n)
        self.num_rows += n

    def add_window(self, reqs: list[int], ends: list[float]) -> None:
        """One token for each of ``reqs`` at each step end of ``ends``."""
        n = len(reqs)
        k = len(ends)
        self.reqs.extend(array("i", reqs) * k)
        self.lengths.append(n)
        self.repeats.append(k)
        self.times.extend(ends)
        self.tokens.append(1)
        self.token_counts.append(n * k)
        self.num_rows += n * k

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(request index int32, time float64, tokens int32), one entry per chunk."""
        req = np.frombuffer(self.reqs, dtype=np.int32)
        per_time = np.repeat(_ints(self.lengths), _ints(self.repeats))  # requests at each time
        time_ms = np.repeat(np.fromiter(self.times, np.float64, len(self.times)), per_time)
        tokens = np.repeat(np.fromiter(self.tokens, np.int32, len(self.tokens)), _ints(self.token_counts))
        return req, time_ms, tokens


def _ints(values: list[int]) -> np.ndarray:
    return np.fromiter(values, np.int64, len(values))


class ColumnCutter:
    """Cuts a stream of column batches into row groups of exactly ``rows`` rows (the rest waits for
    the next batch, or for the final one), so a file's layout never depends on how rows arrived.
    Used on the writer thread only."""

    __slots__ = ("rows", "carry")

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.carry: list[np.ndarray] | None = None

    def cut(self, cols: list[np.ndarray], final: bool) -> list[np.ndarray] | None:
        """The whole row groups now due (None: none), as one array per column."""
        if self.carry is not None:
            cols = [np.concatenate((c0, c1)) for c0, c1 in zip(self.carry, cols)]
            self.carry = None
        n = len(cols[0])
        cut = n if final else n - n % self.rows
        if cut < n:
            self.carry = [c[cut:] for c in cols]
        if not cut:
            return None
        return [c[:cut] for c in cols] if cut < n else cols


def change_runs(changes: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """(value, number of steps) of each run of ``n`` steps given as (first step, value) change points;
    a change point at or past step n, or followed by another at the same step, covers no step."""
    out: list[tuple[int, int]] = []
    last = len(changes) - 1
    for i, (step, value) in enumerate(changes):
        end = changes[i + 1][0] if i < last else n
        if end > n:
            end = n
        if end > step:
            out.append((value, end - step))
    return out


def sparse_runs(points: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """(value, number of steps) covering steps 0..n-1 that are 0 except at ``points`` (step, value),
    in step order and each below n."""
    out: list[tuple[int, int]] = []
    at = 0
    for step, value in points:
        if step < at:  # a second value for the same step: the later one stands
            out[-1] = (value, 1)
            continue
        if step > at:
            out.append((0, step - at))
        out.append((value, 1))
        at = step + 1
    if n > at:
        out.append((0, n - at))
    return out

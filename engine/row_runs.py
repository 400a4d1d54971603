"""Step rows buffered as runs of equal values, expanded into columns by numpy; chunk runs buffered
as they close.

A decode window's steps differ only in their index, start and duration (and, at the steps that
allocate, in the free block count). Buffering rows as runs, (value, count) per column, costs the simulation a few
list appends per window instead of building typed arrays row by row (perf: building them was 11%
of the main thread of reuse-30k-4rps, about 30 us per window). The runs are expanded into exactly
the columns that row-by-row buffering gives, on the writer thread, when a row group is due
(``ColumnCutter``): the recorder hands a full buffer over and starts a new one.

A column of the steps file is one of three kinds: the step index (runs of consecutive indices),
start and duration (one value per row), and everything else (runs of one value). Columns that
change together share one list of run lengths.

chunks.parquet is not expanded at all: it stores each request's output chunks as runs over
consecutive steps of one replica (engine/output_schema.py), which is what a decode window emits.
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
SCHEDULED_TOKENS: Final = 3
PREFILL_TOKENS: Final = 4
PREFILL_REQUESTS: Final = 5
DECODE_REQUESTS: Final = 6
RUNNING: Final = 7
WAITING: Final = 8
PREEMPTIONS: Final = 9
KV_USAGE: Final = 10
KV_BLOCKS_USED: Final = 11
DRAFT_TOKENS: Final = 12
ACCEPTED_TOKENS: Final = 13
BYTES_STORED: Final = 14
BYTES_LOADED: Final = 15
CPU_BLOCKS_USED: Final = 16
CPU_USAGE: Final = 17
# Columns that are 0 in every step of a decode window: prefill tokens and requests, preemptions,
# drafts, accepted, bytes loaded. With scheduled tokens, decode requests and waiting, they are
# constant over a whole window (a row of record_step is a run of one).
_ZERO_IN_WINDOW: Final = (PREFILL_TOKENS, PREFILL_REQUESTS, PREEMPTIONS, DRAFT_TOKENS, ACCEPTED_TOKENS, BYTES_LOADED)
NUM_STEP_COLUMNS: Final = 18
assert STEPS_SCHEMA.names == [
    "step", "start_ms", "duration_ms", "scheduled_tokens", "prefill_tokens", "prefill_requests", "decode_requests",
    "running", "waiting", "preemptions", "kv_usage", "kv_blocks_used", "draft_tokens", "accepted_tokens",
    "bytes_stored", "bytes_loaded", "cpu_blocks_used", "cpu_usage"], "row_runs' column positions are STEPS_SCHEMA's"


class StepRow:
    """One row of steps.parquet, a step the scheduler built; its fields are STEPS_SCHEMA's columns.

    A named record rather than a tuple, so a column cannot silently shift (compiled: a native
    class, its numbers unboxed, as cheap to build per step as the tuple was)."""

    __slots__ = ("step", "start_ms", "duration_ms", "scheduled_tokens", "prefill_tokens", "prefill_requests",
                 "decode_requests", "running", "waiting", "preemptions", "kv_usage", "kv_blocks_used",
                 "draft_tokens", "accepted_tokens", "bytes_stored", "bytes_loaded", "cpu_blocks_used", "cpu_usage")

    def __init__(self, step: int, start_ms: float, duration_ms: float, scheduled_tokens: int, prefill_tokens: int,
                 prefill_requests: int, decode_requests: int, running: int, waiting: int, preemptions: int,
                 kv_usage: float, kv_blocks_used: int, draft_tokens: int, accepted_tokens: int, bytes_stored: int,
                 bytes_loaded: int, cpu_blocks_used: int, cpu_usage: float) -> None:
        self.step = step
        self.start_ms = start_ms
        self.duration_ms = duration_ms
        self.scheduled_tokens = scheduled_tokens
        self.prefill_tokens = prefill_tokens
        self.prefill_requests = prefill_requests
        self.decode_requests = decode_requests
        self.running = running  # requests running after the step
        self.waiting = waiting
        self.preemptions = preemptions
        self.kv_usage = kv_usage  # 1.0 - free / usable GPU blocks
        self.kv_blocks_used = kv_blocks_used
        self.draft_tokens = draft_tokens
        self.accepted_tokens = accepted_tokens
        self.bytes_stored = bytes_stored  # G2 (CPU) tier traffic started by the step
        self.bytes_loaded = bytes_loaded
        self.cpu_blocks_used = cpu_blocks_used
        self.cpu_usage = cpu_usage


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
        self.seg_counts: list[int] = []  # run lengths of the columns constant over a window, and the replica
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

    def add_row(self, row: StepRow, replica: int) -> None:
        """One step the scheduler built (Recorder.record_step): a run of one in every column."""
        self._steps(row.step, 1)
        self.starts.append(row.start_ms)
        self.durations.append(row.duration_ms)
        values = self.values
        values[SCHEDULED_TOKENS].append(row.scheduled_tokens)
        values[PREFILL_TOKENS].append(row.prefill_tokens)
        values[PREFILL_REQUESTS].append(row.prefill_requests)
        values[DECODE_REQUESTS].append(row.decode_requests)
        values[RUNNING].append(row.running)
        values[WAITING].append(row.waiting)
        values[PREEMPTIONS].append(row.preemptions)
        values[KV_USAGE].append(row.kv_usage)
        values[KV_BLOCKS_USED].append(row.kv_blocks_used)
        values[DRAFT_TOKENS].append(row.draft_tokens)
        values[ACCEPTED_TOKENS].append(row.accepted_tokens)
        values[BYTES_STORED].append(row.bytes_stored)
        values[BYTES_LOADED].append(row.bytes_loaded)
        values[CPU_BLOCKS_USED].append(row.cpu_blocks_used)
        values[CPU_USAGE].append(row.cpu_usage)
        if self.replica_column:
            values[NUM_STEP_COLUMNS].append(replica)
        self.seg_counts.append(1)
        self.running_counts.append(1)
        self.free_counts.append(1)
        self.stored_counts.append(1)
        self.cpu_counts.append(1)
        self.num_rows += 1

    def add_window(self, rows: WindowRows) -> None:
        """A decode window's rows (Recorder.record_decode_window)."""
        n = len(rows.starts)
        self._steps(rows.first_step, n)
        self.starts.extend(rows.starts)
        self.durations.extend(rows.durations)
        values = self.values
        for j in _ZERO_IN_WINDOW:
            values[j].append(0)
        num_running = rows.num_running
        values[SCHEDULED_TOKENS].append(num_running)  # one per running request
        values[DECODE_REQUESTS].append(num_running)
        values[WAITING].append(rows.num_waiting)
        if self.replica_column:
            values[NUM_STEP_COLUMNS].append(rows.replica)
        self.seg_counts.append(n)
        # Running: the last row counts the requests still running after its step (it may finish some).
        running = values[RUNNING]
        last = rows.running_after
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
        usable = rows.usable
        free_runs = rows.free_blocks.held_runs(n)
        for free in free_runs.values:
            usage.append(1.0 - free / usable)
            used.append(usable - free)
        self.free_counts.extend(free_runs.counts)
        stored_runs = rows.bytes_stored.sparse_runs(n)
        values[BYTES_STORED].extend(stored_runs.values)
        self.stored_counts.extend(stored_runs.counts)
        cpu_used = values[CPU_BLOCKS_USED]
        cpu_usage = values[CPU_USAGE]
        cpu_changes = rows.cpu_blocks_used
        if cpu_changes is None:
            cpu_used.append(0)
            cpu_usage.append(0.0)
            self.cpu_counts.append(n)
        else:  # as record_step: CPU blocks used and their share of the CPU pool
            cpu_runs = cpu_changes.held_runs(n)
            num_cpu_blocks = rows.num_cpu_blocks
            for value in cpu_runs.values:
                cpu_used.append(value)
                cpu_usage.append(value / num_cpu_blocks if num_cpu_blocks else 0.0)  # 0: no G2 store
            self.cpu_counts.extend(cpu_runs.counts)
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


class ChunkRunRows:
    """Pending rows of chunks.parquet: closed runs of one request's output chunks (the recorder
    keeps each request's open run on the request and closes it here when it cannot grow)."""

    __slots__ = ("num_rows", "request", "replica", "first_step", "num_steps", "tokens")

    def __init__(self) -> None:
        self.num_rows = 0
        self.request = array("i")     # the request's row in requests.parquet (its trace row)
        self.replica = array("i")
        self.first_step = array("q")
        self.num_steps = array("i")
        self.tokens = array("i")      # tokens in each chunk of the run

    def add(self, request: int, replica: int, first_step: int, num_steps: int, tokens: int) -> None:
        self.request.append(request)
        self.replica.append(replica)
        self.first_step.append(first_step)
        self.num_steps.append(num_steps)
        self.tokens.append(tokens)
        self.num_rows += 1

    def columns(self) -> list[np.ndarray]:
        """One array per column of CHUNKS_SCHEMA (on the writer thread)."""
        return [np.frombuffer(self.request, dtype=np.int32), np.frombuffer(self.replica, dtype=np.int32),
                np.frombuffer(self.first_step, dtype=np.int64), np.frombuffer(self.num_steps, dtype=np.int32),
                np.frombuffer(self.tokens, dtype=np.int32)]


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


class Runs:
    """A column's values over a window's steps as runs: ``values[i]`` repeated ``counts[i]`` times."""

    __slots__ = ("values", "counts")

    def __init__(self) -> None:
        self.values: list[int] = []
        self.counts: list[int] = []

    def add(self, value: int, count: int) -> None:
        self.values.append(value)
        self.counts.append(count)


class ChangePoints:
    """A window's integer column given where it changes: ``values[i]`` from step ``steps[i]`` on
    (steps increasing). Set step by step as the window's events happen; expanded per window."""

    __slots__ = ("steps", "values")

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.values: list[int] = []

    def set(self, step: int, value: int) -> None:
        """The value from ``step`` on (a later value for the same step replaces the earlier one)."""
        steps = self.steps
        if steps and steps[-1] == step:
            self.values[-1] = value
        else:
            steps.append(step)
            self.values.append(value)

    def held_runs(self, n: int) -> Runs:
        """Steps 0..n-1, each value held until the next change point; a change point at or past
        step n covers no step."""
        out = Runs()
        steps = self.steps
        values = self.values
        last = len(steps) - 1
        for i in range(len(steps)):
            step = steps[i]
            end = steps[i + 1] if i < last else n
            if end > n:
                end = n
            if end > step:
                out.add(values[i], end - step)
        return out

    def sparse_runs(self, n: int) -> Runs:
        """Steps 0..n-1, 0 except at the change points themselves (each below n)."""
        out = Runs()
        steps = self.steps
        values = self.values
        at = 0
        for i in range(len(steps)):
            step = steps[i]
            if step > at:
                out.add(0, step - at)
            out.add(values[i], 1)
            at = step + 1
        if n > at:
            out.add(0, n - at)
        return out


class WindowRows:
    """A decode window's step rows as the window knows them (Recorder.record_decode_window): the
    columns that differ between its steps are its start and duration lists and change points."""

    __slots__ = ("first_step", "starts", "durations", "num_running", "num_waiting", "usable", "free_blocks",
                 "bytes_stored", "cpu_blocks_used", "num_cpu_blocks", "replica", "running_after")

    def __init__(self, first_step: int, starts: list[float], durations: list[float], num_running: int,
                 num_waiting: int, usable: int, free_blocks: ChangePoints, bytes_stored: ChangePoints,
                 cpu_blocks_used: ChangePoints | None, num_cpu_blocks: int, replica: int,
                 running_after: int) -> None:
        self.first_step = first_step  # step index of the first row
        self.starts = starts
        self.durations = durations
        self.num_running = num_running  # decoding in every step
        self.num_waiting = num_waiting
        self.usable = usable  # usable GPU blocks (KV usage is 1 - free / usable)
        self.free_blocks = free_blocks  # free GPU blocks after each step's allocations
        self.bytes_stored = bytes_stored  # bytes the step started storing to the G2 tier (0 elsewhere)
        self.cpu_blocks_used = cpu_blocks_used  # None: no G2 tier
        self.num_cpu_blocks = num_cpu_blocks
        self.replica = replica
        self.running_after = running_after  # still running after the last step (it may finish some)

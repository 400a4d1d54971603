"""Collects what each request and step experienced, and writes the output Parquet files.

Per-request results live in preallocated numpy columns (a request object is dropped once it
finishes); steps are buffered as runs (engine/row_runs.py) and stream into Parquet row groups,
expanded and written on a second thread, so memory stays bounded. Output chunks are written as runs
(engine/output_schema.py, CHUNKS_SCHEMA): each request carries its open run, which a chunk at the
next step of the same replica with the same token count extends (a decode window extends every
running request's run by the window's length at once); anything else closes it into the buffer, as
does the request's end. The file grows with runs (about one per request without preemption), not
with tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replay.engine.background_writer import BackgroundWriter
from replay.engine.output_schema import (
    CHUNKS_FILE,
    CHUNKS_SCHEMA,
    REQUESTS_FILE,
    REQUESTS_ROW_GROUP,
    REQUESTS_SCHEMA,
    STEPS_FILE,
    STEPS_SCHEMA,
    parquet_write_options,
)
from replay.engine.page_release import ConsumedPrefix
from replay.engine.pd_outputs import POOL_FIELD, PDRequestColumns, pool_step_columns
from replay.engine.request import Request
from replay.engine.request_rows import requests_table
from replay.engine.row_runs import ChunkRunRows, ColumnCutter, StepRow, StepRuns, WindowRows
from replay.engine.shared_outputs import SharedOutputs
from replay.engine.trace_input import TraceArrays, string_array

_ROW_GROUP = 1 << 20
_CHUNK_RUNS_BUFFERED = 1 << 18  # closed chunk runs buffered before they go to the writer thread
_STEP_ROWS_BUFFERED = 1 << 16  # step rows buffered before a row group is written
_PART_REQUESTS_ROW_GROUP = 1 << 14  # a cluster's own requests file (merged, then deleted)

class Recorder:
    def __init__(self, trace: TraceArrays, outdir: Path, *, replica_column: bool = False,
                 pd_columns: PDRequestColumns | None = None, num_prefill: int = 0,
                 tier_names: list[str] | None = None, cluster_part: bool = False,
                 request_rows: np.ndarray | None = None, shared: SharedOutputs | None = None,
                 replica_offset: int = 0) -> None:
        """``replica_column``: a fleet of more than one replica adds a ``replica`` column to
        requests.parquet and steps.parquet (a fleet of one writes exactly the single-engine files).
        ``pd_columns``: a disaggregated fleet (``num_prefill`` prefill replicas numbered first) adds
        its request columns and a ``pool`` column on steps (engine/pd_outputs.py).
        ``tier_names``: the KV tier chain (G2 first when present) adds one ``<name>_hit_tokens``
        column per tier to requests.parquet (none without ``kv_cache.tiers``).
        ``shared``: a part of a fleet replayed part by part in this process writes its chunk runs
        and steps into the output's files (engine/shared_outputs.py), its replicas numbered from
        ``replica_offset``; its requests file stays its own (``outdir``), merged later."""
        # ``cluster_part``: one cluster of a fleet (engine/cluster_run.py). Its chunk runs name trace
        # rows, which are rows of the merged requests file (engine/cluster_merge.py checks), not of
        # the cluster's own.
        self.cluster_part = cluster_part
        # The trace rows requests.parquet will hold, ascending (the replay's selected rows, e.g. a
        # load.window slice): a chunk run's request is its position there. None: the first rows.
        self.request_rows = request_rows
        n = len(trace)
        self.trace = trace
        self.outdir = outdir
        self.replayed = np.zeros(n, dtype=bool)
        # Zeros, not NaN: a row's values are read only once it is replayed (``replayed``), and every
        # way of ending a request writes the four (NaN where it has none), so their pages are
        # touched only as requests end (10 M requests: 320 MB not held from the start).
        self.arrival = np.zeros(n)
        self.first_scheduled = np.zeros(n)
        self.first_token = np.zeros(n)
        self.finish = np.zeros(n)
        self.output_tokens = np.zeros(n, dtype=np.int32)
        self.cached = np.zeros(n, dtype=np.int32)
        self.cpu_hit = np.zeros(n, dtype=np.int32)
        self.load_wait = np.zeros(n, dtype=np.float64)
        self.preemptions = np.zeros(n, dtype=np.int32)
        self.drafts = np.zeros(n, dtype=np.int32)
        self.draft_tokens = np.zeros(n, dtype=np.int32)
        self.accepted = np.zeros(n, dtype=np.int32)
        self.status = np.full(n, 2, dtype=np.int8)  # 0 finished, 1 rejected, 2 unfinished
        self.reject_reason: dict[int, str] = {}
        self.replica = np.full(n, -1, dtype=np.int32)  # which replica served the request (-1: none)
        self.replica_column = replica_column
        self._steps_schema = STEPS_SCHEMA.append(pa.field("replica", pa.int32())) if replica_column else STEPS_SCHEMA
        self.tier_names = list(tier_names or [])
        self.tier_hit = np.zeros((len(self.tier_names), n), dtype=np.int32)
        schema = REQUESTS_SCHEMA
        for name in self.tier_names:
            schema = schema.append(pa.field(f"{name}_hit_tokens", pa.int32()))
        self._requests_schema = schema.append(pa.field("replica", pa.int32())) if replica_column else schema
        self._step_dtypes = [np.dtype(f.type.to_pandas_dtype()) for f in self._steps_schema]
        self.pd_columns = pd_columns
        self.num_prefill = num_prefill
        if pd_columns is not None:
            self._steps_schema = self._steps_schema.append(POOL_FIELD)
            for field in pd_columns.fields:
                self._requests_schema = self._requests_schema.append(field)
        # Pending rows as runs, handed whole to the writer thread (which cuts exact row groups).
        self._chunk_runs = ChunkRunRows()
        self._open_runs = 0  # requests with an open chunk run (all closed by the end of the replay)
        self._step_runs = StepRuns(replica_column)
        self._chunk_cutter = ColumnCutter(_ROW_GROUP)
        self._step_cutter = ColumnCutter(_STEP_ROWS_BUFFERED)
        self._request_ids = string_array(trace.request_id)
        self.shared = shared
        self.replica_offset = replica_offset
        if shared is not None:
            self._chunk_writer, self._step_writer = shared.writers(self._steps_schema)
            self._writes = shared.writes
        else:
            self._chunk_writer = pq.ParquetWriter(outdir / CHUNKS_FILE, CHUNKS_SCHEMA,
                                                  **parquet_write_options(CHUNKS_SCHEMA))
            self._step_writer = pq.ParquetWriter(outdir / STEPS_FILE, self._steps_schema,
                                                 **parquet_write_options(self._steps_schema))
            self._writes = BackgroundWriter()  # row groups are encoded and written on a second thread
        self.num_chunks = 0
        self.num_steps = 0
        # requests.parquet: its first row groups may be written while the replay runs
        # (write_settled_requests), whose rows' columns are then handed back.
        self._requests_writer: pq.ParquetWriter | None = None
        self._requests_written = 0  # rows of requests.parquet written
        self._part_scan = 0  # a part in step: the trace rows before this are written or not its own
        self._part_held = -1  # and the first row it took that had not ended at the last write (-1: none)
        self._settled_columns: list[ConsumedPrefix] | None = None

    # -- hot path ------------------------------------------------------------------------------
    def emit_chunks(self, reqs: list[Request], step: int, replica: int, tokens: list[int]) -> None:
        """Chunks of step ``step`` of ``replica`` (all emitted at the step's end); ``tokens`` empty:
        one token each."""
        if tokens:
            for j in range(len(reqs)):
                self._chunk(reqs[j], step, replica, tokens[j])
        else:
            for r in reqs:
                self._chunk(r, step, replica, 1)
        self.num_chunks += len(reqs)

    def _chunk(self, r: Request, step: int, replica: int, tokens: int) -> None:
        if (r.run_steps and r.run_first_step + r.run_steps == step and r.run_replica == replica
                and r.run_tokens == tokens):
            r.run_steps += 1
            return
        if r.run_steps:
            self._close_run(r)
        self._open_runs += 1
        r.run_replica = replica
        r.run_first_step = step
        r.run_steps = 1
        r.run_tokens = tokens

    def emit_decode_chunks(self, reqs: list[Request], first_step: int, num_steps: int, replica: int) -> None:
        """A decode window's chunks: one token for each of ``reqs`` at the end of each of its steps
        ``first_step`` .. ``first_step + num_steps - 1`` on ``replica``."""
        for r in reqs:
            if r.run_steps and r.run_first_step + r.run_steps == first_step and r.run_replica == replica \
                    and r.run_tokens == 1:
                r.run_steps += num_steps
                continue
            if r.run_steps:
                self._close_run(r)
            self._open_runs += 1
            r.run_replica = replica
            r.run_first_step = first_step
            r.run_steps = num_steps
            r.run_tokens = 1
        self.num_chunks += len(reqs) * num_steps

    def _close_run(self, r: Request) -> None:
        runs = self._chunk_runs
        replica = r.run_replica
        if self.pd_columns is not None:  # numbered within the decode pool, as steps.parquet numbers it
            replica -= self.num_prefill
            if replica < 0:
                raise RuntimeError(f"request {r.request_id}: a prefill replica emitted output chunks")
        runs.add(r.idx, replica, r.run_first_step, r.run_steps, r.run_tokens)
        r.run_steps = 0
        self._open_runs -= 1
        if runs.num_rows >= _CHUNK_RUNS_BUFFERED:
            self._flush_chunks()

    def record_step(self, row: StepRow, replica: int = 0) -> None:
        """One row of steps.parquet: a step the scheduler built, on replica ``replica``."""
        runs = self._step_runs
        runs.add_row(row, replica)
        self.num_steps += 1
        if runs.num_rows >= _STEP_ROWS_BUFFERED:
            self._flush_steps()

    def record_decode_window(self, rows: WindowRows) -> None:
        """Rows for a run of decode-only steps (engine/decode_window.py)."""
        runs = self._step_runs
        runs.add_window(rows)
        self.num_steps += len(rows.starts)
        if runs.num_rows >= _STEP_ROWS_BUFFERED:
            self._flush_steps()

    def request_finished(self, r: Request) -> None:
        if r.run_steps:
            self._close_run(r)
        i = r.idx
        self.replayed[i] = True
        self.arrival[i] = r.arrival_ms
        self.first_scheduled[i] = r.first_scheduled_ms
        self.first_token[i] = r.first_token_ms
        self.finish[i] = r.finish_ms
        self.output_tokens[i] = r.num_output_tokens
        self.cached[i] = max(r.num_cached_tokens, 0)
        # Columns that stay zero without host offload, preemption or drafts are written only when
        # not: their pages are then never touched, and cost no memory (10 M requests: 280 MB).
        if r.num_cpu_hit_tokens > 0:
            self.cpu_hit[i] = r.num_cpu_hit_tokens
        if r.load_wait_ms:
            self.load_wait[i] = r.load_wait_ms
        if r.num_preemptions:
            self.preemptions[i] = r.num_preemptions
        if r.num_drafts:
            self.drafts[i] = r.num_drafts
        if r.num_draft_tokens_total:
            self.draft_tokens[i] = r.num_draft_tokens_total
        if r.num_accepted_tokens:
            self.accepted[i] = r.num_accepted_tokens
        if r.tier_hit_tokens is not None:
            self.tier_hit[:, i] = r.tier_hit_tokens
        self.status[i] = 0

    def request_unfinished(self, r: Request) -> None:
        self.request_finished(r)
        self.status[r.idx] = 2
        self.finish[r.idx] = np.nan

    def request_rejected(self, idx: int, arrival_ms: float, reason: str) -> None:
        self.replayed[idx] = True
        self.arrival[idx] = arrival_ms
        self.first_scheduled[idx] = self.first_token[idx] = self.finish[idx] = np.nan
        self.status[idx] = 1
        self.reject_reason[idx] = reason
        self.output_tokens[idx] = self.trace.output_tokens[idx]  # what was asked for: nothing was generated

    # -- output --------------------------------------------------------------------------------
    def _flush_chunks(self, final: bool = False) -> None:
        """Hand the closed chunk runs to the writer thread, which writes the whole row groups of
        exactly _ROW_GROUP rows among what it holds (the rest waits, unless final), so the file's
        layout never depends on how the rows were batched on their way in."""
        runs = self._chunk_runs
        self._chunk_runs = ChunkRunRows()  # the writer thread owns the old buffer now
        self._writes.submit(self._write_chunks, runs, final)

    def _flush_steps(self, final: bool = False) -> None:
        """Like _flush_chunks: whole row groups of _STEP_ROWS_BUFFERED rows until the final flush."""
        runs = self._step_runs
        self._step_runs = StepRuns(self.replica_column)
        self._writes.submit(self._write_steps, runs, final)

    def _write_chunks(self, runs: ChunkRunRows, final: bool) -> None:
        """On the writer thread."""
        due = self._chunk_cutter.cut(runs.columns(), final)
        if due is None:
            return
        if self.request_rows is not None:
            due[0] = np.searchsorted(self.request_rows, due[0]).astype(np.int32)
        if self.replica_offset:
            due[1] = (due[1] + self.replica_offset).astype(np.int32)
        table = pa.Table.from_arrays([pa.array(v) for v in due], schema=CHUNKS_SCHEMA)
        self._chunk_writer.write_table(table, row_group_size=_ROW_GROUP)

    def _write_steps(self, runs: StepRuns, final: bool) -> None:
        """On the writer thread."""
        due = self._step_cutter.cut(runs.columns(self._step_dtypes), final)
        if due is None:
            return
        if self.replica_offset:  # the replica column is the last one (a part is never disaggregated)
            due[-1] = (due[-1] + self.replica_offset).astype(np.int32)
        arrays = [pa.array(v) for v in due]
        if self.pd_columns is not None:  # replica numbers count within each pool
            pool, local = pool_step_columns(np.asarray(due[-1]), self.num_prefill)
            arrays[-1] = local
            arrays.append(pool)
        table = pa.Table.from_arrays(arrays, schema=self._steps_schema)
        self._step_writer.write_table(table, row_group_size=_STEP_ROWS_BUFFERED)

    def close(self) -> None:
        if self._open_runs:
            raise RuntimeError(f"{self._open_runs} requests still have an open chunk run at the end of the replay "
                               "(every request must end through request_finished or request_unfinished)")
        if not self.cluster_part:
            self._check_request_rows()
        self._flush_chunks(final=True)
        self._flush_steps(final=True)
        if self.shared is None:
            self._writes.finish()
            self._chunk_writer.close()
            self._step_writer.close()
        self._write_requests()

    def abort(self) -> None:
        if self.shared is not None:
            self.shared.abort()
            return
        try:
            self._writes.finish()
        except BaseException:  # noqa: BLE001 - best effort on the failure path
            pass
        for w in (self._chunk_writer, self._step_writer, self._requests_writer):
            if w is None:
                continue
            try:
                w.close()
            except Exception:  # pragma: no cover - best effort on the failure path
                pass

    def _check_request_rows(self) -> None:
        """A chunk run names its request by trace row, which is its row in requests.parquet only
        while the replayed rows are the trace's first ones (the first ``load.max_requests``)."""
        if self.request_rows is not None:
            if not np.array_equal(np.flatnonzero(self.replayed), self.request_rows):
                raise RuntimeError("the replayed requests are not the selected rows: chunk runs' request rows "
                                   "would not match requests.parquet")
            return
        n = int(self.replayed.sum())
        if not self.replayed[:n].all():
            raise RuntimeError("the replayed requests are not the trace's first rows: chunk runs' request "
                               "rows would not match requests.parquet")

    def _open_requests_writer(self) -> pq.ParquetWriter:
        if self._requests_writer is None:
            self._requests_writer = pq.ParquetWriter(self.outdir / REQUESTS_FILE, self._requests_schema,
                                                     **parquet_write_options(self._requests_schema))
        return self._requests_writer

    def write_settled_requests(self, arrived_before: int) -> None:
        """Every trace row before ``arrived_before`` that the replay selects has arrived: write each
        whole row group of requests.parquet whose requests have all ended (finished or rejected),
        and hand back the memory of those rows' per-request columns (engine/page_release.py), so a
        long replay holds only the requests not yet written. The groups are the ones the final write
        would make, so the file's bytes are the same. Kept whole: what the run's summary reads after
        the replay (status, output tokens, arrival and finish times, replica) and what a disaggregated fleet's
        columns read (no early writes there). A part of a fleet in step writes its own rows
        (``_write_settled_part_rows``)."""
        if self.pd_columns is not None:
            return
        if self.cluster_part:
            self._write_settled_part_rows(arrived_before)
            return
        rows = self.request_rows
        while True:
            lo = self._requests_written
            hi = lo + REQUESTS_ROW_GROUP
            if rows is None:  # the trace's first rows
                if hi > arrived_before or not self.replayed[lo:hi].all():
                    return
                sel = np.arange(lo, hi)
            else:
                if hi > len(rows) or rows[hi - 1] >= arrived_before:
                    return
                sel = rows[lo:hi]
                if not self.replayed[sel].all():
                    return
            writer = self._open_requests_writer()
            writer.write_table(self._requests_table(sel), row_group_size=REQUESTS_ROW_GROUP)
            self._requests_written = hi
            self._release_written_rows(int(sel[-1]) + 1)

    def _write_settled_part_rows(self, arrived_before: int) -> None:
        """write_settled_requests for a part of a fleet in step (engine/lockstep.py), which meets
        every arrival but records only those its replicas take (their ``replica`` set at routing):
        its file's next whole row groups once every row it took before them has ended. The rows
        are those the final write would take next, so the file, and the merge of the parts' files,
        are the same."""
        group = _PART_REQUESTS_ROW_GROUP
        scan = self._part_scan
        held = self._part_held
        if arrived_before <= scan or (held >= 0 and not self.replayed[held]):
            return  # (a row it took that has not ended holds back every row after it, as last time)
        taken = self.replica[scan:arrived_before] >= 0
        open_ = np.flatnonzero(taken & ~self.replayed[scan:arrived_before])
        if len(open_):
            bound = self._part_held = scan + int(open_[0])
        else:
            bound, self._part_held = arrived_before, -1
        ended = np.flatnonzero(self.replayed[scan:bound]) + scan  # the rows this part took, all ended
        whole = len(ended) - len(ended) % group
        if not whole:
            return
        writer = self._open_requests_writer()
        for lo in range(0, whole, group):
            writer.write_table(self._requests_table(ended[lo:lo + group]), row_group_size=group)
        end = int(ended[whole - 1]) + 1
        self._requests_written += whole
        self._part_scan = end
        self._release_written_rows(end)

    def release_unused_memory(self) -> None:
        """Hand back the pages Arrow's allocator keeps for reuse, on both threads (its heaps are per
        thread): building and encoding row groups leaves them behind, and a long replay would carry
        them to its end."""
        pool = pa.default_memory_pool()
        self._writes.submit(pool.release_unused)
        pool.release_unused()

    def _release_written_rows(self, end: int) -> None:
        """Hand back the per-request columns of trace rows before ``end`` (written, never read again)."""
        if self._settled_columns is None:
            columns: list[np.ndarray] = [self.first_scheduled, self.first_token, self.cached, self.cpu_hit,
                                         self.load_wait, self.preemptions, self.drafts, self.draft_tokens,
                                         self.accepted]
            for k in range(len(self.tier_names)):
                columns.append(self.tier_hit[k])
            self._settled_columns = [ConsumedPrefix(c) for c in columns]
        for column in self._settled_columns:
            column.release_before(end)
        for i in [i for i in self.reject_reason if i < end]:
            del self.reject_reason[i]

    def _write_requests(self) -> None:
        """requests.parquet, one row group at a time: the whole table at once would hold every
        column of every request beside the recorder's own (about 1.5 GB at 10 M requests). The same
        bytes as one write of the whole table (row groups of REQUESTS_ROW_GROUP rows either way),
        whether or not write_settled_requests wrote the first groups during the replay."""
        sel = np.flatnonzero(self.replayed)
        writer = self._open_requests_writer()
        first = self._requests_written
        end = len(sel) if first else max(len(sel), 1)  # an empty replay writes its one empty group
        # A cluster's file is read back by the merge a few row groups at a time, from every cluster
        # at once: small groups keep that to a sliver of the table (engine/cluster_merge.py).
        group = _PART_REQUESTS_ROW_GROUP if self.cluster_part else REQUESTS_ROW_GROUP
        for lo in range(first, end, group):
            writer.write_table(self._requests_table(sel[lo:lo + group]), row_group_size=group)
        writer.close()

    def _requests_table(self, sel: np.ndarray) -> pa.Table:
        """The rows of requests.parquet for trace rows ``sel`` (engine/request_rows.py)."""
        return requests_table(self, sel, self._request_ids, self._requests_schema)

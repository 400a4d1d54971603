"""Tiny traces and a fixed step timer, so scheduler scenarios can be checked by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replay.engine.config import EngineConfig
from replay.engine.run import replay_trace
from replay.engine.run_setup import EngineSetup
from replay.engine.timing.base import StepBreakdown, StepShape
from replay.ingest.schema import TRACE_SCHEMA, TraceMetadata


class FixedTimer:
    """Every step takes ``ms`` (plus ``per_token_ms`` per scheduled token, plus ``per_ctx_ms`` per
    token of attention context): easy to check by hand.

    ``per_ctx_ms`` makes the time depend on the step's context (prefill context + decode context),
    as real attention does; equivalence tests need it, or a fast path that times a step with the
    wrong context (say, one step early) would produce the same bytes and pass.
    """

    host_overhead_ms = 0.0
    uncalibrated: list[str] = []

    def __init__(self, ms: float = 10.0, per_token_ms: float = 0.0, per_ctx_ms: float = 0.0) -> None:
        self.ms = ms
        self.per_token_ms = per_token_ms
        self.per_ctx_ms = per_ctx_ms
        self.calls: list[tuple] = []

    def step_ms(self, *args) -> float:
        self.calls.append(args)
        tokens = args[1] + args[5]
        context = args[2] + args[6]
        return self.ms + self.per_token_ms * tokens + self.per_ctx_ms * context

    def breakdown(self, shape: StepShape) -> StepBreakdown:
        return StepBreakdown(step_ms=self.ms, host_overhead_ms=0.0)


def make_trace(rows: list[dict], hash_block_size: int | None = 16) -> tuple[pa.Table, TraceMetadata]:
    full = []
    for i, r in enumerate(rows):
        row = {"request_id": f"r{i}", "arrival_ms": 0, "hash_ids": None, "session_id": None,
               "parent_id": None, "turn": None, "delay_ms": None, "priority": None}
        row.update(r)
        full.append(row)
    table = pa.Table.from_pylist(full, schema=TRACE_SCHEMA)
    meta = TraceMetadata(source_format="test", source_file="test", time_unit="ms",
                         hash_block_size=hash_block_size,
                         prefix_identity="real" if hash_block_size else "absent")
    return table, meta


def setup_for(num_gpu_blocks: int, timer=None, max_model_len: int = 1 << 20,
              kv_bytes_per_token: int = 131072) -> EngineSetup:
    return EngineSetup(num_gpu_blocks=num_gpu_blocks, capacity_source="num_gpu_blocks",
                       max_model_len=max_model_len, timer=timer or FixedTimer(),
                       kv_bytes_per_token=kv_bytes_per_token)


def run_small(rows: list[dict], tmp_path: Path, *, num_gpu_blocks: int, config: dict | None = None,
              timer=None, hash_block_size: int | None = 16, check_invariants: bool = True, **kw):
    """Replay ``rows`` and return (requests, chunks, steps) DataFrames plus run info."""
    import pandas as pd

    from replay.reports.views import read_chunks

    table, meta = make_trace(rows, hash_block_size)
    cfg = EngineConfig.model_validate(config or {})
    out = tmp_path / "out"
    summary = replay_trace(table, meta, cfg, out, setup=setup_for(num_gpu_blocks, timer),
                           check_invariants=check_invariants, **kw)
    reqs = pd.read_parquet(out / "requests.parquet")
    chunks = read_chunks(out).to_pandas()
    steps = pd.read_parquet(out / "steps.parquet")
    return reqs, chunks, steps, summary.run_info


def assert_decode_run_is_step_ms(windowed, stepped, nrun: int, ctx0: int, count: int, start: float = 12.5) -> None:
    """``windowed.decode_run(nrun)`` must time ``count`` decode-only steps from summed context ``ctx0``
    exactly as ``stepped.step_ms`` does one by one (a single differing bit changes a replay's
    outputs), and give each end time as the running sum of the durations from ``start``."""
    durations: list[float] = []
    times = [start]
    windowed.decode_run(nrun).extend(ctx0, count, durations, times)
    scalar = [stepped.step_ms(0, 0, 0, 0, nrun, nrun, ctx0 + i * nrun, 0) for i in range(count)]
    assert durations == scalar
    t = start
    for i, d in enumerate(scalar):
        t += d
        assert times[i + 1] == t


def open_loop_trace(n: int = 40, seed: int = 0, gap_ms: float = 30.0) -> tuple[pa.Table, TraceMetadata]:
    """Open-loop rows with shared heads (four system prompts), varied tails and outputs, arriving
    ``gap_ms`` apart on average."""
    rng = np.random.default_rng(seed)
    rows, t = [], 0
    for i in range(n):
        t += int(rng.exponential(gap_ms))
        head = int(rng.integers(0, 4))
        inp = int(rng.integers(40, 300))
        n_ids = -(-inp // 16)
        ids = [head * 1000 + j for j in range(min(3, n_ids - 1))]
        ids += [10**6 + i * 100 + j for j in range(n_ids - len(ids))]
        rows.append(dict(arrival_ms=t, input_tokens=inp, output_tokens=int(rng.integers(2, 60)), hash_ids=ids))
    return make_trace(rows)


def sessions_trace(sessions: int = 3) -> tuple[pa.Table, TraceMetadata]:
    """Sessions of three turns each; later turns are closed-loop (released by the previous finish)."""
    rows = []
    for s in range(sessions):
        for turn in range(3):
            rows.append(dict(arrival_ms=s * 5 + turn * 1000, input_tokens=64 + 32 * turn, output_tokens=5,
                             hash_ids=[s * 100 + j for j in range(4 + 2 * turn)], session_id=f"s{s}",
                             turn=turn, delay_ms=None if turn == 0 else 50))
    rows.sort(key=lambda r: r["arrival_ms"])
    return make_trace(rows)


def sorted_table(path: Path) -> pa.Table:
    """A Parquet file's rows, sorted by every column (to compare files whose row order differs)."""
    table = pq.read_table(path)
    return table.sort_by([(c, "ascending") for c in table.column_names])


def same_results(a: Path, b: Path) -> None:
    """Two replays' outputs hold the same requests (byte for byte) and the same step and chunk rows
    (in any order)."""
    assert (a / "requests.parquet").read_bytes() == (b / "requests.parquet").read_bytes()
    for name in ("steps.parquet", "chunks.parquet"):
        if (a / name).exists() or (b / name).exists():
            assert sorted_table(a / name).equals(sorted_table(b / name)), name

"""Synthetic replay outputs for the report, SQL and diff tests and the 1M-request benchmark.

The reports must be testable without the engine, so this module writes a complete OUTDIR
(``requests``/``chunks``/``steps`` Parquet, ``run.json``) plus a canonical ``trace.parquet`` from
numpy with a seed. The data is shaped like a Mooncake-style replay: multi-turn sessions whose later
turns extend the earlier prompt (chained 512-token hash ids, the last partial block gets its own id),
shared system prompts, a load burst in the middle of the run (queueing, preemptions), optional MTP
chunks of several tokens, optional G2 (CPU) hits, a few rejected requests and requests still in
flight at the end. Values are plausible, not physical: the reports only need the shapes right.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replay.engine.config import EngineConfig
from replay.engine.output_schema import (
    CHUNKS_FILE,
    CHUNKS_SCHEMA,
    REQUESTS_FILE,
    REQUESTS_SCHEMA,
    RUN_FILE,
    STATUS_FINISHED,
    STATUS_REJECTED,
    STATUS_UNFINISHED,
    STEPS_FILE,
    STEPS_SCHEMA,
)
from replay.ingest.schema import TRACE_SCHEMA, TraceMetadata

GPU_BLOCK = 16


@dataclass(frozen=True)
class TraceSpec:
    n_requests: int = 2000
    seed: int = 0
    block: int = 512          # tokens per hash id (Mooncake)
    rate_rps: float = 5.0     # mean request arrival rate
    mean_output: float = 40.0
    session_frac: float = 0.8  # fraction of requests that belong to a multi-turn session


def _ids_to_str(prefix: str, values: np.ndarray) -> list[str]:
    return [f"{prefix}{v:07d}" for v in values.tolist()]


def make_trace(spec: TraceSpec) -> pa.Table:
    """A canonical trace table (TRACE_SCHEMA, with TraceMetadata) sorted by arrival."""
    rng = np.random.default_rng(spec.seed)
    n = spec.n_requests
    # Sessions: geometric number of turns (mean 2.5); some one-turn requests carry no session.
    turns_per = rng.geometric(0.4, size=n)
    ends = np.cumsum(turns_per)
    n_sess = int(np.searchsorted(ends, n) + 1)
    turns_per = turns_per[:n_sess]
    turns_per[-1] -= ends[n_sess - 1] - n
    sess = np.repeat(np.arange(n_sess), turns_per)
    start_of = np.cumsum(turns_per) - turns_per
    turn = (np.arange(n) - start_of[sess]).astype(np.int32)
    has_session = (turns_per > 1) | (rng.random(n_sess) < spec.session_frac)
    # Arrivals: sessions start as a Poisson process; turns follow after think times.
    span_s = n / spec.rate_rps
    sess_start = np.sort(rng.uniform(0, span_s * 1000.0, n_sess))
    think = rng.exponential(20_000.0, n)
    think[start_of] = 0.0
    csum = np.cumsum(think)
    arrival = sess_start[sess] + csum - csum[start_of[sess]]
    arrival_ms = np.floor(arrival).astype(np.int64)
    # Token counts: a shared system prompt (whole blocks), user text per turn, growing context.
    sys_choice = rng.integers(0, 4, n_sess)
    sys_blocks = np.array([1, 2, 3, 5])[sys_choice]
    user = np.maximum(1, rng.lognormal(np.log(600), 1.0, n)).astype(np.int64)
    output = np.clip(rng.lognormal(np.log(spec.mean_output), 0.8, n), 1, 2000).astype(np.int64)
    output[rng.random(n) < 0.05] = 1
    contrib = user.copy()
    contrib[1:] += np.where(turn[1:] > 0, output[:-1], 0)  # previous turn's answer joins the context
    ccum = np.cumsum(contrib)
    ctx = ccum - ccum[start_of[sess]] + contrib[start_of[sess]]
    input_tokens = sys_blocks[sess] * spec.block + ctx
    # Hash ids: system prompt ids shared globally, session ids for full blocks, the partial last
    # block gets an id of its own (it changes when a later turn extends the prompt).
    n_ids = -(-input_tokens // spec.block)
    full = input_tokens // spec.block
    row = np.repeat(np.arange(n), n_ids)
    pos = np.arange(n_ids.sum()) - np.repeat(np.cumsum(n_ids) - n_ids, n_ids)
    sb = sys_blocks[sess][row]
    ids = np.where(
        pos < sb,
        sys_choice[sess][row] * 100 + pos,
        np.where(pos < full[row], (sess[row].astype(np.int64) + 1) * (1 << 24) + pos, (1 << 50) + row),
    ).astype(np.uint64)
    # Sort by arrival; request ids follow arrival order.
    order = np.argsort(arrival_ms, kind="stable")
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)
    offsets = np.concatenate([[0], np.cumsum(n_ids[order])]).astype(np.int64)
    starts = np.cumsum(n_ids) - n_ids
    flat_order = np.repeat(starts[order], n_ids[order]) + (
        np.arange(n_ids.sum()) - np.repeat(offsets[:-1], n_ids[order]))
    hash_ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(ids[flat_order]))
    req_ids = _ids_to_str("req-", np.arange(n))
    sess_sorted = sess[order]
    sess_ok = has_session[sess_sorted]
    session_id = pa.array(
        [f"s{s:07d}" if ok else None for s, ok in zip(sess_sorted.tolist(), sess_ok.tolist(), strict=True)],
        pa.string())
    turn_sorted = turn[order]
    parent_idx = np.where(turn > 0, inv[np.maximum(np.arange(n) - 1, 0)], -1)[order]
    parent_id = pa.array(
        [req_ids[p] if p >= 0 and ok else None for p, ok in zip(parent_idx.tolist(), sess_ok.tolist(), strict=True)],
        pa.string())
    table = pa.table(
        {
            "request_id": pa.array(req_ids, pa.string()),
            "arrival_ms": arrival_ms[order],
            "input_tokens": input_tokens[order].astype(np.int32),
            "output_tokens": output[order].astype(np.int32),
            "hash_ids": hash_ids.cast(pa.list_(pa.uint64())),
            "session_id": session_id,
            "parent_id": parent_id,
            "turn": pa.array(np.where(sess_ok, turn_sorted, 0), pa.int32(), mask=~sess_ok),
            "delay_ms": pa.nulls(n, pa.int64()),
            "priority": pa.nulls(n, pa.int32()),
        }
    ).cast(TRACE_SCHEMA)
    meta = TraceMetadata(
        source_format="synthetic-fixture", source_file=f"reports_fixtures(seed={spec.seed})",
        time_unit="ms", hash_block_size=spec.block, prefix_identity="synthesized",
    )
    return table.replace_schema_metadata(meta.to_parquet_metadata())


def write_trace(path: Path, spec: TraceSpec) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(make_trace(spec), path)
    return path


def _ideal_hit_blocks(table: pa.Table) -> np.ndarray:
    """Leading run of hash ids seen in earlier rows (vectorized; rows are in arrival order)."""
    lists = table.column("hash_ids").combine_chunks()
    offsets = lists.offsets.to_numpy()
    flat = lists.values.to_numpy()
    n = len(table)
    row = np.repeat(np.arange(n), np.diff(offsets))
    _, first_idx, inverse = np.unique(flat, return_index=True, return_inverse=True)
    miss = row[first_idx][inverse] == row  # this row is the first to use the id
    pos = np.arange(len(flat)) - offsets[row]
    first_miss = np.full(n, -1, dtype=np.int64)
    miss_rows = row[miss][::-1]
    first_miss[miss_rows] = pos[miss][::-1]  # reversed so the smallest position wins
    return np.where(first_miss < 0, np.diff(offsets), first_miss)


@dataclass(frozen=True)
class RunSpec:
    seed: int = 1
    latency_scale: float = 1.0   # multiplies queueing, prefill and decode times (config B != A)
    mtp_k: int = 0               # 0: no speculative decoding; k: chunks of 1..k+1 tokens
    offload: bool = False        # G2 CPU hits and cpu usage
    reject_frac: float = 0.01
    unfinished_frac: float = 0.01
    config_overrides: tuple[tuple[str, object], ...] = ()
    step_ms: float = 20.0


def _config_dump(spec: RunSpec) -> dict:
    data: dict = {}
    if spec.mtp_k:
        data["speculative"] = {"num_speculative_tokens": spec.mtp_k, "acceptance_rates": [0.8, 0.5, 0.3][: spec.mtp_k]}
    if spec.offload:
        data["host_offload"] = {"num_cpu_blocks": 20000, "block_size": 256}
    for key, value in spec.config_overrides:
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return EngineConfig.model_validate(data).model_dump(mode="json")


def _trace_fingerprint(path: Path) -> str:
    """What `replay run` records: the content fingerprint of the canonical table (replay.ingest.fingerprint)."""
    from replay.ingest.fingerprint import file_fingerprint

    return file_fingerprint(path)


def write_run(outdir: Path, trace_path: Path, spec: RunSpec = RunSpec()) -> Path:
    """Write a replay OUTDIR for the trace at ``trace_path`` (which the run.json points to)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    trace_path = Path(trace_path).resolve()
    table = pq.read_table(trace_path)
    meta = TraceMetadata.from_parquet_metadata(table.schema.metadata, trace_path)
    rng = np.random.default_rng(spec.seed)
    n = len(table)
    arrival = table.column("arrival_ms").to_numpy().astype(np.float64)
    inp = table.column("input_tokens").to_numpy().astype(np.int64)
    out = table.column("output_tokens").to_numpy().astype(np.int64)
    scale = spec.latency_scale

    status = np.full(n, STATUS_FINISHED, dtype=object)
    rejected = rng.random(n) < spec.reject_frac
    n_unfinished = int(round(n * spec.unfinished_frac))
    unfinished = np.zeros(n, dtype=bool)
    if n_unfinished:
        unfinished[n - n_unfinished:] = True
    unfinished &= ~rejected
    status[rejected] = STATUS_REJECTED
    status[unfinished] = STATUS_UNFINISHED

    # Prefix reuse: a share of the ideal (infinite-cache) hit, in whole GPU blocks, at most input - 1.
    ideal = np.minimum(_ideal_hit_blocks(table) * meta.hash_block_size, inp)
    share = np.where(rng.random(n) < 0.7, 1.0, rng.random(n))
    cached = np.minimum((ideal * share).astype(np.int64) // GPU_BLOCK * GPU_BLOCK, np.maximum(inp - 1, 0))
    cpu_hit = np.zeros(n, dtype=np.int64)
    if spec.offload:
        rest = np.maximum(ideal - cached, 0)
        cpu_hit = np.where(rng.random(n) < 0.5, rest // GPU_BLOCK * GPU_BLOCK, 0)
        cpu_hit = np.minimum(cpu_hit, np.maximum(inp - 1 - cached, 0))
    load_wait = np.where(cpu_hit > 0, 1.0 + cpu_hit * 0.0025, 0.0)

    # A load burst in the middle of the run: queueing grows, then drains.
    t_end = max(arrival.max(), 1.0)
    phase = np.clip((arrival / t_end - 0.35) / 0.3, 0.0, 1.0)
    burst = np.sin(np.pi * phase) ** 2
    queue = (rng.lognormal(np.log(4.0), 0.7, n) + 3000.0 * burst * rng.random(n)) * scale
    prefill = (8.0 + 0.04 * (inp - cached - cpu_hit)) * scale
    first_sched = arrival + queue
    preempt = rng.poisson(0.01 + 0.6 * burst).astype(np.int64)

    # Chunks: one per step that emitted tokens; MTP steps emit 1..k+1 tokens.
    if spec.mtp_k:
        acc_len = rng.uniform(1.2, spec.mtp_k + 1.0, n)
        n_chunks = 1 + np.ceil((out - 1) / acc_len).astype(np.int64)
    else:
        n_chunks = out.copy()
    emitted = ~rejected
    keep_chunks = np.where(unfinished, np.maximum(1, n_chunks // 2), n_chunks)
    keep_chunks[rejected] = 0
    total = int(keep_chunks.sum())
    crow = np.repeat(np.arange(n), keep_chunks)
    cpos = np.arange(total) - np.repeat(np.cumsum(keep_chunks) - keep_chunks, keep_chunks)
    # Chunk times are step ends, as the engine emits them: each request decodes at consecutive steps
    # from the step in which its prefill ends, except after a stall (1% of chunks: a preemption, it
    # resumes 3-12 steps later), which starts a new run.
    stall = np.where(cpos > 0, (rng.random(total) < 0.01) * rng.integers(3, 13, total), 0)
    skip = np.cumsum(1 + stall) - 1
    first_of = np.cumsum(keep_chunks) - keep_chunks
    has = keep_chunks > 0
    offset = skip - np.repeat(skip[first_of[has]], keep_chunks[has])  # steps after the request's first chunk
    timeline = _StepTimeline(rng, spec, arrival, first_sched + prefill + load_wait, int(offset.max(initial=0)) + 2)
    first_step = timeline.step_at(first_sched + prefill + load_wait)
    cstep = np.repeat(first_step, keep_chunks) + offset
    ctime = timeline.end[cstep]
    # Tokens per chunk: first chunk 1 token, the rest split the remaining output evenly.
    if spec.mtp_k:
        rest_chunks = np.maximum(n_chunks - 1, 1)
        base = (out - 1) // rest_chunks
        extra = (out - 1) - base * rest_chunks
        ctok = np.where(cpos == 0, 1, base[crow] + (cpos - 1 < extra[crow]))
    else:
        ctok = np.ones(total, dtype=np.int64)
    first_tok = np.where(has, timeline.end[np.minimum(first_step, len(timeline.end) - 1)], first_sched + prefill)
    last_idx = np.cumsum(keep_chunks) - 1
    finish = np.where(emitted & ~unfinished, ctime[np.maximum(last_idx, 0)] if total else 0.0, np.nan)

    def col(values: np.ndarray, valid: np.ndarray, typ: pa.DataType) -> pa.Array:
        return pa.array(np.where(valid, values, 0), typ, mask=~valid)

    started = emitted
    done = emitted & ~unfinished
    tpot_ok = done & (out > 1)
    drafts = np.where(spec.mtp_k > 0, n_chunks - 1, 0)
    drafts_emitted = np.where(done, drafts, np.where(unfinished, np.maximum(keep_chunks - 1, 0), 0))
    drafts_emitted = drafts_emitted if spec.mtp_k else np.zeros(n, dtype=np.int64)
    accepted = np.where(done, out - n_chunks, 0) if spec.mtp_k else np.zeros(n, dtype=np.int64)
    if spec.mtp_k:
        accepted = np.where(unfinished, ctok_sum_unfinished(ctok, crow, n) - keep_chunks, accepted)
        accepted = np.where(rejected, 0, accepted)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = (finish - first_tok) / (out - 1)
        mal = 1.0 + accepted / drafts_emitted
    reasons = np.where(rejected, "prompt does not fit in the KV cache", None)
    requests = pa.table(
        {
            "request_id": table.column("request_id"),
            "session_id": table.column("session_id"),
            "turn": table.column("turn"),
            "arrival_ms": arrival,
            "first_scheduled_ms": col(first_sched, started, pa.float64()),
            "first_token_ms": col(first_tok, started, pa.float64()),
            "finish_ms": col(finish, done, pa.float64()),
            "ttft_ms": col(first_tok - arrival, started, pa.float64()),
            "e2e_ms": col(finish - arrival, done, pa.float64()),
            "queue_ms": col(first_sched - arrival, started, pa.float64()),
            "tpot_ms": col(tpot, tpot_ok, pa.float64()),
            "input_tokens": inp.astype(np.int32),
            "output_tokens": out.astype(np.int32),
            "cached_tokens": col(cached, started, pa.int32()),
            "cpu_hit_tokens": col(cpu_hit, started, pa.int32()),
            "load_wait_ms": col(load_wait, started, pa.float64()),
            "num_preemptions": col(preempt, started, pa.int32()),
            "num_drafts": pa.array(drafts_emitted, pa.int32()),
            "num_draft_tokens": pa.array(drafts_emitted * spec.mtp_k, pa.int32()),
            "num_accepted_tokens": pa.array(accepted, pa.int32()),
            "mean_acceptance_length": col(mal, drafts_emitted > 0, pa.float64()),
            "status": pa.array(status.tolist(), pa.string()),
            "reject_reason": pa.array(reasons.tolist(), pa.string()),
        },
        schema=REQUESTS_SCHEMA,
    )
    chunks = chunk_runs(crow, cstep, ctok)
    steps = _make_steps(rng, spec, timeline, arrival, first_sched, finish, started, done, preempt, cstep, ctok)
    pq.write_table(requests, outdir / REQUESTS_FILE)
    pq.write_table(chunks, outdir / CHUNKS_FILE)
    pq.write_table(steps, outdir / STEPS_FILE)
    run = {
        "tool_version": "0.1.0",
        "config": _config_dump(spec),
        "trace": {
            "path": str(trace_path),
            "fingerprint": _trace_fingerprint(trace_path),
            "rows": n,
            "metadata": meta.model_dump(mode="json"),
        },
        "seed": spec.seed,
        "simulated_span_ms": float(np.nanmax(np.concatenate([finish, ctime, [0.0]]))),
        "wall_time_s": 1.5,
        "num_gpu_blocks": 55000,
        "totals": {
            "requests": n,
            "finished": int(done.sum()),
            "rejected": int(rejected.sum()),
            "unfinished": int(unfinished.sum()),
            "chunks": total,
            "steps": len(steps),
        },
        "warnings": [f"{int(rejected.sum())} requests rejected: prompt does not fit in the KV cache"]
        if rejected.any() else [],
        "timing": {"backend": "roofline", "uncalibrated": ["host_overhead_ms", "attention_efficiency"]},
        "session_delay_rule": "trace timestamps (open loop)",
    }
    (outdir / RUN_FILE).write_text(json.dumps(run, indent=2, sort_keys=True))
    return outdir


def ctok_sum_unfinished(ctok: np.ndarray, crow: np.ndarray, n: int) -> np.ndarray:
    """Tokens emitted so far per request (for the MTP counters of unfinished requests)."""
    return np.bincount(crow, weights=ctok, minlength=n).astype(np.int64)


class _StepTimeline:
    """Engine steps back to back from t = 0 until every request's chunks have a step: durations
    around spec.step_ms, longer in the load burst."""

    def __init__(self, rng, spec: RunSpec, arrival: np.ndarray, ready: np.ndarray, tail_steps: int) -> None:
        horizon = float(np.nanmax(np.concatenate([ready, [1.0]])))
        t_end = max(float(arrival.max()), 1.0)
        parts, total = [], 0.0
        while total <= horizon:  # steps until the last request is ready, then tail_steps more
            n = int((horizon - total) / spec.step_ms) + 16
            nominal = total + np.arange(n) * spec.step_ms
            phase = np.clip((nominal / t_end - 0.35) / 0.3, 0.0, 1.0)
            burst = np.sin(np.pi * phase) ** 2
            dur = rng.gamma(4.0, spec.step_ms / 4.0, n) * spec.latency_scale * (1.0 + 0.5 * burst)
            dur[rng.random(n) < 0.01] += 150.0 * spec.latency_scale  # a long prefill joined the batch
            parts.append(dur)
            total += float(dur.sum())
        tail = rng.gamma(4.0, spec.step_ms / 4.0, tail_steps + 16) * spec.latency_scale
        dur = np.concatenate([*parts, tail])
        self.start = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
        self.duration = dur
        self.end = self.start + self.duration  # the doubles the views compute

    def step_at(self, t: np.ndarray) -> np.ndarray:
        """The step running at each time (its end is the first chunk after it)."""
        return np.clip(np.searchsorted(self.start, t, side="right") - 1, 0, len(self.start) - 1)


def chunk_runs(crow: np.ndarray, cstep: np.ndarray, ctok: np.ndarray) -> pa.Table:
    """Chunks (request row, step, tokens), each request's in step order, as chunks.parquet runs."""
    if not len(crow):
        return CHUNKS_SCHEMA.empty_table()
    new = np.ones(len(crow), dtype=bool)
    new[1:] = (crow[1:] != crow[:-1]) | (cstep[1:] != cstep[:-1] + 1) | (ctok[1:] != ctok[:-1])
    starts = np.flatnonzero(new)
    lengths = np.diff(np.append(starts, len(crow)))
    return pa.table({"request": crow[starts].astype(np.int32), "replica": np.zeros(len(starts), np.int32),
                     "first_step": cstep[starts].astype(np.int64), "num_steps": lengths.astype(np.int32),
                     "tokens": ctok[starts].astype(np.int32)}, schema=CHUNKS_SCHEMA)


def _make_steps(rng, spec, timeline: _StepTimeline, arrival, first_sched, finish, started, done, preempt,
                cstep, ctok) -> pa.Table:
    """The steps of the timeline, with queue depth from the request timeline and the chunks they emitted."""
    start = timeline.start
    n_steps = len(start)
    arr_sorted = np.sort(arrival[started])  # rejected requests never wait in the queue
    sched_sorted = np.sort(first_sched[started])
    fin_sorted = np.sort(finish[done])
    arrived = np.searchsorted(arr_sorted, start, side="right")
    scheduled = np.searchsorted(sched_sorted, start, side="right")
    finished = np.searchsorted(fin_sorted, start, side="right")
    running = np.minimum(scheduled - finished, 1024)
    waiting = np.maximum(arrived - scheduled, 0)
    kv = np.clip(running / 400.0 + rng.normal(0, 0.02, n_steps), 0.0, 1.0).astype(np.float32)
    pre = np.bincount(timeline.step_at(first_sched[started]), weights=preempt[started],
                      minlength=n_steps).astype(np.int32)
    tok = np.bincount(cstep, weights=ctok, minlength=n_steps).astype(np.int64)
    nchunk = np.bincount(cstep, minlength=n_steps).astype(np.int64)
    drafts = (nchunk * spec.mtp_k) if spec.mtp_k else np.zeros(n_steps, dtype=np.int64)
    accepted = np.maximum(tok - nchunk, 0) if spec.mtp_k else np.zeros(n_steps, dtype=np.int64)
    prefill_req = np.bincount(timeline.step_at(first_sched[started]), minlength=n_steps).astype(np.int32)
    prefill_tok = prefill_req * 900
    if spec.offload:
        cpu_used = np.minimum(np.arange(n_steps, dtype=np.int64) * 3, 20000)
        stored = rng.integers(0, 3, n_steps) * 256 * 131072
        loaded = rng.integers(0, 2, n_steps) * 256 * 131072
    else:
        cpu_used = stored = loaded = np.zeros(n_steps, dtype=np.int64)
    return pa.table(
        {
            "step": np.arange(n_steps, dtype=np.int64),
            "start_ms": start,
            "duration_ms": timeline.duration,
            "scheduled_tokens": (prefill_tok + nchunk + drafts).astype(np.int32),
            "prefill_tokens": prefill_tok.astype(np.int32),
            "prefill_requests": prefill_req,
            "decode_requests": nchunk.astype(np.int32),
            "running": running.astype(np.int32),
            "waiting": waiting.astype(np.int32),
            "preemptions": pre,
            "kv_usage": kv,
            "kv_blocks_used": (kv * 54999).astype(np.int32),
            "draft_tokens": drafts.astype(np.int32),
            "accepted_tokens": accepted.astype(np.int32),
            "bytes_stored": stored.astype(np.int64),
            "bytes_loaded": loaded.astype(np.int64),
            "cpu_blocks_used": cpu_used.astype(np.int64),
            "cpu_usage": (cpu_used / 20000.0).astype(np.float32),
        },
        schema=STEPS_SCHEMA,
    )


def make_pair(root: Path, n_requests: int = 2000, seed: int = 0, **run_b) -> tuple[Path, Path]:
    """Two runs of one trace: A with defaults, B with ``run_b`` RunSpec fields (a slower config by default)."""
    root = Path(root)
    trace = write_trace(root / "trace.parquet", TraceSpec(n_requests=n_requests, seed=seed))
    a = write_run(root / "a", trace, RunSpec(seed=seed + 1))
    b_spec = {"seed": seed + 2, "latency_scale": 1.3, "config_overrides": (("scheduler.max_num_seqs", 256),)}
    b_spec.update(run_b)
    b = write_run(root / "b", trace, RunSpec(**b_spec))
    return a, b

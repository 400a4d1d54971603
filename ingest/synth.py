"""Synthetic traffic with real prefix structure, deterministic from a seed (``replay synth``).

Model (every number is a parameter; defaults are guesses aimed at a realistic chat workload on one
H200 serving Llama-3.1-8B, not calibrated to a production trace):

* ``system_prompts`` shared system prompts, picked with Zipf(``zipf``) popularity; their full
  blocks have the same hash ids in every request that uses them (shared prefixes).
* Sessions of a geometric number of turns (mean ``turns_mean``). Turn k's prompt is the previous
  prompt + the previous answer + a new user message, so it extends the previous prompt: its leading
  full blocks repeat the previous ids, the block that was partial and every new block get fresh
  ids (chained-hash semantics, as in Mooncake traces).
* Lengths: ``fixed``, ``lognormal`` (sigma ``length_sigma``) or ``exponential`` around the given means.
* Arrivals: session starts ``poisson`` or ``gamma`` (inter-arrival CV ``cv``) at a rate giving
  ``rate`` requests/s overall; or ``closed``: ``concurrency`` users, each sending its next request
  a think time after the previous one (every request after a user's first carries ``delay_ms``).
  Later turns carry ``delay_ms`` (exponential think time, mean ``think_s``) and, for open-loop
  replay, a timestamp = previous timestamp + an estimated service time + the delay. The service
  estimate (prefill at 10k tokens/s + 15 ms per output token) is a rough single-H200 8B guess.
* A day's shape (open loop): with ``peak_to_trough`` > 1, session starts follow a rate that varies
  as a cosine over 24 hours, highest at ``peak_hour`` and ``peak_to_trough`` times lower twelve
  hours away, averaging ``rate`` over a day; ``bursts`` adds that many seeded bursts per day, each
  ``burst_minutes`` long at ``burst_factor`` times the rate of the moment. The trace starts at
  ``start_hour`` (midnight by default), so its clock reads as the time of day. The starts are the
  same homogeneous draws mapped through the inverse of the cumulative rate (time rescaling), so a
  flat day (the default) gives exactly the trace it always gave.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from replay.base.atomic import atomic_path
from replay.base.duckdb_conn import connect

from .schema import TRACE_SCHEMA, TraceMetadata
from .writer import ROW_GROUP_ROWS, rows_in_batches, write_trace_batches

# Generated rows by arrival, ties in generation order (what a stable sort of arrival_ms gives).
_SORTED_SQL = "SELECT * EXCLUDE (g) FROM gen ORDER BY arrival_ms, g"

PREFILL_TOKENS_PER_S = 10_000.0  # guess: Llama-3.1-8B prefill on one H200 under load (order of magnitude)
DECODE_S_PER_TOKEN = 0.015  # guess: ~15 ms ITL at moderate batch (AISimulate reports 16.3 ms on its reference workload)
AZURE_START = datetime(2023, 11, 16, 18, 0, 0)  # the Azure 2023 trace's day, for a familiar look


class SynthConfig(BaseModel):
    """Parameters of a synthetic trace (all have defaults; see the module doc)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    requests: int = Field(2000, ge=1)
    seed: int = 0
    arrival: Literal["poisson", "gamma", "closed"] = "poisson"
    rate: float = Field(3.0, gt=0)
    cv: float = Field(2.0, gt=0)
    concurrency: int = Field(16, ge=1)
    block_size: int = Field(512, ge=1)
    length_dist: Literal["fixed", "lognormal", "exponential"] = "lognormal"
    system_prompts: int = Field(40, ge=1)
    system_tokens: int = Field(1500, ge=1)
    user_tokens: int = Field(600, ge=1)
    output_tokens: int = Field(220, ge=1)
    length_sigma: float = Field(0.8, ge=0)
    max_input: int = Field(32_768, ge=1)
    max_output: int = Field(4096, ge=1)
    zipf: float = Field(1.1, ge=0)
    turns_mean: float = Field(3.0, ge=1)
    think_s: float = Field(20.0, ge=0)
    peak_to_trough: float = Field(1.0, ge=1)  # 1: a flat day
    peak_hour: float = Field(14.0, ge=0, lt=24)
    start_hour: float = Field(0.0, ge=0, lt=24)
    bursts: int = Field(0, ge=0)  # per day
    burst_factor: float = Field(3.0, ge=1)
    burst_minutes: float = Field(10.0, gt=0)

    @property
    def has_daily_shape(self) -> bool:
        return self.peak_to_trough > 1.0 or self.bursts > 0


_DAY_S = 86_400.0


def daily_rate_shape(cfg: SynthConfig, t_s: np.ndarray) -> np.ndarray:
    """Relative arrival rate at ``t_s`` seconds from the trace start (mean 1 over a day without
    bursts): the cosine of the day, times ``burst_factor`` inside the bursts."""
    r = cfg.peak_to_trough
    hour = (cfg.start_hour + t_s / 3600.0) % 24.0
    wave = (1.0 + np.cos(2.0 * np.pi * (hour - cfg.peak_hour) / 24.0)) / 2.0  # 1 at the peak, 0 at the trough
    shape = (1.0 + (r - 1.0) * wave) * 2.0 / (1.0 + r)  # max/min = r, daily mean 1
    if cfg.bursts:
        burst_rng = np.random.default_rng([cfg.seed, 0xB0257])  # its own stream: the rest is unchanged
        days = int(t_s.max() // _DAY_S) + 1 if len(t_s) else 1
        starts = np.sort((np.arange(days)[:, None] * _DAY_S
                          + burst_rng.uniform(0.0, _DAY_S, (days, cfg.bursts))).ravel())
        k = np.searchsorted(starts, t_s, side="right") - 1
        inside = (k >= 0) & (t_s < starts[np.maximum(k, 0)] + cfg.burst_minutes * 60.0)
        shape = np.where(inside, shape * cfg.burst_factor, shape)
    return shape


def rescale_to_daily(cfg: SynthConfig, flat_s: np.ndarray) -> np.ndarray:
    """Map starts of a homogeneous process (``flat_s``, seconds) to the day's varying rate: the
    start at flat time s goes to the t where the cumulative relative rate reaches s."""
    if not len(flat_s):
        return flat_s
    step = 1.0  # seconds per grid point of the cumulative rate
    horizon = max(float(flat_s.max()), 1.0)
    while True:
        grid = np.arange(0.0, horizon * 1.5 + _DAY_S, step)
        cumulative = np.concatenate([[0.0], np.cumsum(daily_rate_shape(cfg, grid[:-1]) * step)])
        if cumulative[-1] >= flat_s.max():
            return np.interp(flat_s, cumulative, grid)
        horizon *= 2.0


def _lengths(rng: np.random.Generator, cfg: SynthConfig, mean: float, n: int, cap: int) -> np.ndarray:
    if cfg.length_dist == "fixed":
        vals = np.full(n, mean)
    elif cfg.length_dist == "exponential":
        vals = rng.exponential(mean, n)
    else:  # lognormal with the requested mean: mu = ln(mean) - sigma^2 / 2
        s = cfg.length_sigma
        vals = rng.lognormal(np.log(mean) - s * s / 2, s, n)
    return np.clip(np.rint(vals), 1, cap).astype(np.int64)


def _gaps(rng: np.random.Generator, cfg: SynthConfig, mean_s: float, n: int) -> np.ndarray:
    if cfg.arrival == "gamma":
        shape = 1.0 / (cfg.cv * cfg.cv)
        return rng.gamma(shape, mean_s / shape, n)
    return rng.exponential(mean_s, n)


# Rows per generated batch (generation order) and per arrival-ordered batch: Python lists exist for
# one batch at a time, so `replay synth -n 10000000` stays under 2 GB (holding all of it took 11.6 GB).
BATCH_ROWS = ROW_GROUP_ROWS
# DuckDB's budget for holding and sorting the generated rows (it spills past it): half the default,
# as the pre-drawn lengths and think times of 15 M generated rows take another ~0.4 GB.
SORT_MEMORY_MB = 512


def _generation_batches(cfg: SynthConfig) -> Iterator[pa.Table]:
    """The generated requests in generation order (session after session), ``BATCH_ROWS`` at a time,
    with ``g``, the generation index that breaks arrival ties (as the stable sort of a whole table)."""
    rng = np.random.default_rng(cfg.seed)
    next_id = 0

    def fresh(k: int) -> list[int]:
        nonlocal next_id
        out = list(range(next_id, next_id + k))
        next_id += k
        return out

    sys_len = _lengths(rng, cfg, cfg.system_tokens, cfg.system_prompts, cfg.max_input)
    sys_blocks = [fresh(int(n) // cfg.block_size) for n in sys_len]
    ranks = np.arange(1, cfg.system_prompts + 1, dtype=np.float64)
    popularity = ranks ** -cfg.zipf
    popularity /= popularity.sum()

    n = cfg.requests
    closed = cfg.arrival == "closed"
    # Session plan: turn counts (geometric, mean turns_mean). Sessions are generated for 1.5x the
    # requests and the first n by arrival kept, so the trace is a window of steady traffic (no tail
    # of lone late turns) and sessions running at the window's end are cut, as in a real capture.
    # A session whose context reaches max_input ends there (a later turn could not grow it), leaving
    # requests of the plan unmade: a further round plans sessions for them, starting after the last
    # one, until the requests exist (without such ends there is one round).
    p_end = 1.0 / cfg.turns_mean
    n_gen = n + max(n // 2, 10)
    names = ("request_id", "t", "input_tokens", "output_tokens", "hash_ids", "session_id", "parent_id", "turn",
             "delay_ms")
    cols: dict[str, list] = {k: [] for k in names}
    user_clock: dict[int, tuple[float, str, int, int, int]] = {}  # user -> (t, id, turns, input, output)
    g0 = 0
    made = 0  # requests generated
    c0 = 0  # sessions planned by earlier rounds
    flat_end = 0.0  # open loop: the last planned session's start on the homogeneous clock
    while made < n_gen:
        want = n_gen - made
        turn_counts: list[int] = []
        total = 0
        while total < want:
            k = min(int(rng.geometric(p_end)), want - total)
            turn_counts.append(k)
            total += k
        n_conv = len(turn_counts)
        conv_sys = rng.choice(cfg.system_prompts, size=n_conv, p=popularity)
        user = _lengths(rng, cfg, cfg.user_tokens, want, cfg.max_input)
        out_len = _lengths(rng, cfg, cfg.output_tokens, want, cfg.max_output)
        think_ms = np.rint(rng.exponential(cfg.think_s * 1000.0, want)).astype(np.int64)
        starts = np.zeros(n_conv)
        if not closed:
            # Seconds between session starts, so requests/s ~= rate: over the requests the sessions
            # make (fewer than planned when contexts reach max_input).
            made_here = _turns_made(cfg, turn_counts, conv_sys, sys_len, user, out_len)
            mean_gap = made_here / n_conv / cfg.rate
            flat = np.cumsum(_gaps(rng, cfg, mean_gap, n_conv))
            if c0 == 0:
                flat -= flat[0]
            else:
                flat += flat_end
            flat_end = float(flat[-1])
            starts = rescale_to_daily(cfg, flat) if cfg.has_daily_shape else flat
        i = 0
        for cl, turns in enumerate(turn_counts):
            c = c0 + cl
            s = int(conv_sys[cl])
            ctx_len = int(sys_len[s])
            ctx_full = list(sys_blocks[s])  # ids of the full blocks of the current context
            prev_t, prev_id, prev_in, prev_out = 0.0, None, 0, 0
            for k in range(turns):
                if k > 0:
                    ctx_len = prev_in + prev_out
                new_len = min(ctx_len + int(user[i]), cfg.max_input)
                full_now = new_len // cfg.block_size
                keep = min(len(ctx_full), full_now, ctx_len // cfg.block_size)
                ctx_full = ctx_full[:keep] + fresh(full_now - keep)
                ids = ctx_full + (fresh(1) if new_len % cfg.block_size else [])
                rid = f"c{c:06d}-{k + 1}"
                if closed:
                    u = c % cfg.concurrency
                    last = user_clock.get(u)
                    if last is None:
                        t, delay, parent, turn_no, sess = 0.0, None, None, 1, f"u{u:04d}"
                    else:
                        lt, lid, lturns, lin, lout = last
                        delay = int(think_ms[i])
                        t = lt + _service_s(lin, lout) + delay / 1000.0
                        parent, turn_no, sess = lid, lturns + 1, f"u{u:04d}"
                    user_clock[u] = (t, rid, turn_no, new_len, int(out_len[i]))
                else:
                    sess = f"c{c:06d}"
                    if k == 0:
                        t, delay, parent = float(starts[cl]), None, None
                    else:
                        delay = int(think_ms[i])
                        t = prev_t + _service_s(prev_in, prev_out) + delay / 1000.0
                        parent = prev_id
                    turn_no = k + 1
                cols["request_id"].append(rid)
                cols["t"].append(t)
                cols["input_tokens"].append(new_len)
                cols["output_tokens"].append(int(out_len[i]))
                cols["hash_ids"].append(ids)
                cols["session_id"].append(sess)
                cols["parent_id"].append(parent)
                cols["turn"].append(turn_no)
                cols["delay_ms"].append(delay)
                prev_t, prev_id, prev_in, prev_out = t, rid, new_len, int(out_len[i])
                i += 1
                made += 1
                if len(cols["t"]) == BATCH_ROWS:
                    yield _batch(cols, g0)
                    g0 += BATCH_ROWS
                    cols = {k: [] for k in names}
                if new_len >= cfg.max_input:
                    break
        c0 += n_conv
    if cols["t"]:
        yield _batch(cols, g0)


def _turns_made(cfg: SynthConfig, turn_counts: list[int], conv_sys: np.ndarray, sys_len: np.ndarray,
                user: np.ndarray, out_len: np.ndarray) -> int:
    """How many requests the planned sessions make: a session ends at the turn whose context
    reaches max_input (the context lengths of _generation_batches, without the ids)."""
    made = i = 0
    cap = cfg.max_input
    for c, turns in enumerate(turn_counts):
        ctx_len = int(sys_len[int(conv_sys[c])])
        prev_in = prev_out = 0
        for k in range(turns):
            if k > 0:
                ctx_len = prev_in + prev_out
            new_len = min(ctx_len + int(user[i]), cap)
            prev_in, prev_out = new_len, int(out_len[i])
            i += 1
            made += 1
            if new_len >= cap:
                break
    return made


def _batch(cols: dict[str, list], g0: int) -> pa.Table:
    t_ms = np.rint(np.asarray(cols["t"]) * 1000.0).astype(np.int64)
    table = pa.table({
        "request_id": pa.array(cols["request_id"], pa.string()),
        "arrival_ms": pa.array(t_ms, pa.int64()),
        "input_tokens": pa.array(cols["input_tokens"], pa.int32()),
        "output_tokens": pa.array(cols["output_tokens"], pa.int32()),
        "hash_ids": pa.array(cols["hash_ids"], pa.list_(pa.uint64())),
        "session_id": pa.array(cols["session_id"], pa.string()),
        "parent_id": pa.array(cols["parent_id"], pa.string()),
        "turn": pa.array(cols["turn"], pa.int32()),
        "delay_ms": pa.array(cols["delay_ms"], pa.int64()),
        "priority": pa.nulls(len(t_ms), pa.int32()),
    }, schema=TRACE_SCHEMA)
    return table.append_column("g", pa.array(np.arange(g0, g0 + len(t_ms), dtype=np.int64)))


def arrival_batches(cfg: SynthConfig, batch_rows: int = BATCH_ROWS) -> Iterator[pa.Table]:
    """The trace (the first ``cfg.requests`` generated requests by arrival, ties in generation order)
    as canonical tables of ``batch_rows`` rows (the last may be shorter).

    The generated batches go into a DuckDB table with a memory budget and come back sorted: past the
    budget DuckDB spills to its private temp directory, so memory stays bounded at any size."""
    con = connect(SORT_MEMORY_MB)
    try:
        for k, batch in enumerate(_generation_batches(cfg)):
            con.register("batch", batch)
            con.execute(("INSERT INTO gen " if k else "CREATE TABLE gen AS ") + "SELECT * FROM batch")
            con.unregister("batch")
        reader = con.sql(_SORTED_SQL).to_arrow_reader(batch_rows)
        yield from rows_in_batches((pa.Table.from_batches([rb]) for rb in reader), batch_rows, cfg.requests,
                                   TRACE_SCHEMA)
    finally:
        con.close()


def generate(cfg: SynthConfig) -> pa.Table:
    """A canonical trace table (arrival order) following ``cfg`` (in memory: small traces, tests)."""
    return pa.concat_tables(arrival_batches(cfg))


def _service_s(input_tokens: int, output_tokens: int) -> float:
    return input_tokens / PREFILL_TOKENS_PER_S + output_tokens * DECODE_S_PER_TOKEN


def metadata(cfg: SynthConfig, with_ids: bool = True) -> TraceMetadata:
    return TraceMetadata(
        source_format="synth", source_file="(replay synth)", time_unit="ms",
        hash_block_size=cfg.block_size if with_ids else None,
        prefix_identity="synthesized" if with_ids else "absent",
        notes="synth config " + json.dumps(cfg.model_dump(), sort_keys=True),
    )


def write_mooncake_jsonl(batches: pa.Table | Iterable[pa.Table], path: str | Path) -> None:
    """Mooncake extended JSONL: later turns carry ``delay_ms`` (think time) besides a timestamp."""
    names = ("request_id", "session_id", "arrival_ms", "delay_ms", "input_tokens", "output_tokens", "hash_ids")
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        for table in ([batches] if isinstance(batches, pa.Table) else batches):
            cols = {name: table.column(name).to_pylist() for name in names}  # one batch of rows at a time
            lines = []
            for i in range(table.num_rows):
                row = {"request_id": cols["request_id"][i], "session_id": cols["session_id"][i],
                       "timestamp": cols["arrival_ms"][i]}
                if cols["delay_ms"][i] is not None:
                    row["delay_ms"] = cols["delay_ms"][i]
                row.update(input_length=cols["input_tokens"][i], output_length=cols["output_tokens"][i],
                           hash_ids=cols["hash_ids"][i])
                lines.append(json.dumps(row, separators=(", ", ": ")) + "\n")
            fh.write("".join(lines))


def write_parquet(batches: pa.Table | Iterable[pa.Table], cfg: SynthConfig, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        write_trace_batches(tmp, [batches] if isinstance(batches, pa.Table) else batches, metadata(cfg))


def write_azure_csv(cfg: SynthConfig, path: str | Path, chunk: int = 1_000_000) -> int:
    """Azure-2023-style CSV (CRLF, 7-digit fractions, no final newline), single-turn, vectorised.

    Input lengths have mean ``system_tokens + user_tokens`` (one prompt), outputs mean
    ``output_tokens``; arrivals follow ``arrival`` (closed-loop is not expressible in this format,
    so it falls back to Poisson). Generated in chunks so tens of millions of rows fit in memory.
    """
    rng = np.random.default_rng(cfg.seed)
    n = cfg.requests
    t0 = 0.0
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(b"TIMESTAMP,ContextTokens,GeneratedTokens")
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            gaps = _gaps(rng, cfg.model_copy(update={"arrival": "gamma" if cfg.arrival == "gamma" else "poisson"}),
                         1.0 / cfg.rate, m)
            if start == 0:
                gaps[0] = 0.0
            t = t0 + np.cumsum(gaps)
            t0 = float(t[-1])
            if cfg.has_daily_shape:  # the map depends on the absolute time only: chunks compose
                t = rescale_to_daily(cfg, t)
            inp = _lengths(rng, cfg, cfg.system_tokens + cfg.user_tokens, m, cfg.max_input)
            out = _lengths(rng, cfg, cfg.output_tokens, m, cfg.max_output)
            stamps = np.datetime64(AZURE_START, "us") + np.rint(t * 1e6).astype("timedelta64[us]")
            text = pa.array(np.datetime_as_string(stamps, unit="us"))
            text = pc.binary_join_element_wise(pc.replace_substring(text, "T", " "), "0", "")
            lines = pc.binary_join_element_wise(text, pa.array(inp).cast(pa.string()),
                                                pa.array(out).cast(pa.string()), ",")
            fh.write(b"\r\n" + "\r\n".join(lines.to_pylist()).encode())
    return n


"""Reuse-heavy, high-rate traffic: the shape on which replay's speed against AISimulate is closest.

Every request is whole 512-token blocks, so prefix identity is exact at the hash-block level:

* 40 shared system prompts (``system_prompts``) of 2 to 16 blocks each, picked with Zipf(1.1)
  popularity;
* 35% of requests (``followup``) are follow-up turns: they repeat a recent request's whole prompt
  (uniform over the last ``followup_window`` requests) and append 1 to 3 fresh blocks; a follow-up
  that would pass ``max_blocks`` starts over from its system prompt instead;
* the rest are a system prompt plus 1 to 6 fresh blocks;
* outputs lognormal with median ``output_median`` (sigma ``output_sigma``), clipped to 16..2,048;
* Poisson arrivals at ``rate`` requests/s.

Deterministic from the seed. Benchmark traffic only: the numbers are a chosen stress shape, not a calibration.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from bench.compare.traces import write_canonical
from replay.ingest.schema import TRACE_SCHEMA, TraceMetadata

BLOCK_TOKENS = 512


class ReuseTrafficConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: int = Field(100_000, ge=1)
    rate: float = Field(8.0, gt=0)
    seed: int = 0
    system_prompts: int = Field(40, ge=1)
    zipf: float = Field(1.1, ge=0)
    system_blocks: tuple[int, int] = (2, 16)
    followup: float = Field(0.35, ge=0, le=1)
    followup_blocks: tuple[int, int] = (1, 3)
    fresh_blocks: tuple[int, int] = (1, 6)
    followup_window: int = Field(64, ge=1)
    max_blocks: int = Field(64, ge=2)  # 32k tokens: Llama-3.1-8B serves far more, the cap bounds chains
    output_median: float = Field(200.0, gt=0)
    output_sigma: float = Field(0.8, ge=0)
    output_min: int = Field(16, ge=1)
    output_max: int = Field(2048, ge=1)


def generate(cfg: ReuseTrafficConfig) -> tuple[pa.Table, TraceMetadata]:
    rng = np.random.default_rng(cfg.seed)
    next_id = 0

    def fresh(k: int) -> list[int]:
        nonlocal next_id
        out = list(range(next_id, next_id + k))
        next_id += k
        return out

    lo, hi = cfg.system_blocks
    system = [fresh(int(k)) for k in rng.integers(lo, hi + 1, cfg.system_prompts)]
    ranks = np.arange(1, cfg.system_prompts + 1, dtype=np.float64)
    popularity = ranks ** -cfg.zipf
    popularity /= popularity.sum()

    n = cfg.requests
    arrivals_ms = np.rint(np.cumsum(rng.exponential(1000.0 / cfg.rate, n))).astype(np.int64)
    arrivals_ms -= arrivals_ms[0]
    sys_pick = rng.choice(cfg.system_prompts, size=n, p=popularity)
    is_followup = rng.random(n) < cfg.followup
    back = rng.integers(1, cfg.followup_window + 1, n)
    f_lo, f_hi = cfg.followup_blocks
    followup_add = rng.integers(f_lo, f_hi + 1, n)
    u_lo, u_hi = cfg.fresh_blocks
    fresh_add = rng.integers(u_lo, u_hi + 1, n)
    outputs = np.clip(np.rint(rng.lognormal(np.log(cfg.output_median), cfg.output_sigma, n)),
                      cfg.output_min, cfg.output_max).astype(np.int32)

    prompts: list[list[int]] = []
    for i in range(n):
        ids: list[int] | None = None
        if is_followup[i] and i > 0:
            parent = prompts[max(0, i - int(back[i]))]
            if len(parent) + int(followup_add[i]) <= cfg.max_blocks:
                ids = parent + fresh(int(followup_add[i]))
        if ids is None:
            ids = system[int(sys_pick[i])] + fresh(int(fresh_add[i]))
        prompts.append(ids)

    table = pa.table({
        "request_id": pa.array([f"r{i:07d}" for i in range(n)], pa.string()),
        "arrival_ms": pa.array(arrivals_ms, pa.int64()),
        "input_tokens": pa.array([len(p) * BLOCK_TOKENS for p in prompts], pa.int32()),
        "output_tokens": pa.array(outputs, pa.int32()),
        "hash_ids": pa.array(prompts, pa.list_(pa.uint64())),
        "session_id": pa.nulls(n, pa.string()),
        "parent_id": pa.nulls(n, pa.string()),
        "turn": pa.nulls(n, pa.int32()),
        "delay_ms": pa.nulls(n, pa.int64()),
        "priority": pa.nulls(n, pa.int32()),
    }, schema=TRACE_SCHEMA)
    meta = TraceMetadata(
        source_format="synthetic-reuse",
        source_file="bench.compare.reuse_traffic",
        time_unit="ms",
        hash_block_size=BLOCK_TOKENS,
        prefix_identity="synthesized",
        notes=f"reuse-heavy traffic: {cfg.model_dump_json()}",
    )
    return table, meta


def write_reuse_trace(dst: Path, cfg: ReuseTrafficConfig) -> None:
    table, meta = generate(cfg)
    write_canonical(table, meta, dst)

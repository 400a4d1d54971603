"""The parity workloads: bursts of Mooncake rows replayed under one scheduler setting each.

Pure Python on purpose: the vLLM driver (its own venv) and the replay driver (the project's env)
both import this module, and neither may need the other's packages.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.shared import shared_dir

MOONCAKE = shared_dir() / "traces" / "mooncake" / "conversation_trace.jsonl"
HASH_BLOCK_SIZE = 512  # Mooncake: one hash id per 512 tokens (README_FAST25.md)
BLOCK_SIZE = 16  # vLLM's default block size on CUDA
MAX_INPUT = 16384  # longer rows are left out of every burst (they would not fit the small caches)


@dataclass(frozen=True)
class Workload:
    """One scheduler setting over one burst of trace rows (all arriving at step 0)."""

    name: str
    start: int  # first trace row
    rows: int  # rows in the burst
    num_gpu_blocks: int  # vLLM's KVCacheConfig.num_blocks (block 0 is the null block)
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    enable_prefix_caching: bool = True
    reserve_full_isl: bool = True
    num_spec_tokens: int = 0  # MTP drafts per step (0: no speculative decoding)
    mtp_layers: int = 0  # the model's num_nextn_predict_layers (1: single-layer MTP head)
    acceptance_rates: tuple[float, ...] = ()
    spec_seed: int = 7
    per_block_hashes: bool = False  # ids rewritten as per-block content hashes (not chained)
    max_output: int = 0  # cap on output tokens (0: the trace's), to keep fixtures small
    tags: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        d = asdict(self)
        d["acceptance_rates"] = list(self.acceptance_rates)
        d["tags"] = list(self.tags)
        return d

    @classmethod
    def from_json(cls, d: dict) -> Workload:
        d = dict(d)
        d["acceptance_rates"] = tuple(d["acceptance_rates"])
        d["tags"] = tuple(d["tags"])
        return cls(**d)


def _mtp(k: int, layers: int) -> dict:
    rates = (0.8, 0.6, 0.4)[:k]
    return {"num_spec_tokens": k, "mtp_layers": layers, "acceptance_rates": rates}


def _variants(start: int, rows: int, tag: str, ample: int, small: int) -> list[Workload]:
    """Every scheduler setting the parity harness covers, on one burst; ``small`` forces preemptions."""
    w = lambda name, **kw: Workload(name=f"{name}-{tag}", start=start, rows=rows, **kw)  # noqa: E731
    out = [
        w("ample", num_gpu_blocks=ample),
        w("small", num_gpu_blocks=small),
        w("no-full-isl", num_gpu_blocks=small, reserve_full_isl=False),
        w("max-seqs", num_gpu_blocks=ample, max_num_seqs=24),
        w("long-prefill", num_gpu_blocks=small, long_prefill_token_threshold=1000),
        w("priority", num_gpu_blocks=small, policy="priority"),
        w("no-prefix", num_gpu_blocks=small, enable_prefix_caching=False),
        w("per-block", num_gpu_blocks=small, per_block_hashes=True),
    ]
    for k in (1, 2, 3):
        out.append(w(f"mtp{k}-1layer", num_gpu_blocks=small, **_mtp(k, 1)))
        if k > 1:
            out.append(w(f"mtp{k}-{k}layer", num_gpu_blocks=small, **_mtp(k, k)))
    # Small budgets: prefill chunks end at arbitrary positions, so the multi-module MTP rules
    # (chunks kept clear of the prompt end, re-prefillable tokens never cached) get exercised.
    out.append(w("mtp3-1layer-chunked", num_gpu_blocks=small, max_num_batched_tokens=600, max_num_seqs=64,
                 **_mtp(3, 1)))
    out.append(w("mtp3-3layer-chunked", num_gpu_blocks=small, max_num_batched_tokens=600, max_num_seqs=64,
                 **_mtp(3, 3)))
    return out


def all_workloads() -> list[Workload]:
    """Two parts of the trace (its start and row 6000), two sizes each."""
    out: list[Workload] = []
    out += _variants(0, 100, "r0-100", ample=40000, small=3000)
    out += _variants(6000, 100, "r6000-100", ample=40000, small=3000)
    out += _variants(0, 300, "r0-300", ample=150000, small=6000)
    out += _variants(3000, 300, "r3000-300", ample=150000, small=6000)
    out = [dataclasses_replace(x, max_output=200) for x in out]
    return out + mtp_preempt_workloads()


def mtp_preempt_workloads() -> list[Workload]:
    """2-layer MTP (k = 2, prefill lookahead 2) under heavy preemption: a small cache, no full-prompt
    gate and outputs up to 400 tokens, so requests are preempted mid-prefill and mid-decode and resume
    on their own cached blocks (about 1,700 and 130 preemptions)."""
    m = _mtp(2, 2)
    common = dict(rows=300, num_gpu_blocks=2000, reserve_full_isl=False, max_output=400, **m)
    return [
        Workload(name="mtp2-2layer-preempt-lp500-r0-300", start=0, long_prefill_token_threshold=500, **common),
        Workload(name="mtp2-2layer-preempt-b600-r3000-300", start=3000, max_num_batched_tokens=600,
                 max_num_seqs=64, **common),
    ]


def dataclasses_replace(w: Workload, **kw) -> Workload:
    d = asdict(w)
    d.update(kw)
    return Workload(**d)


def load_rows(start: int, n: int, path: Path = MOONCAKE) -> list[dict]:
    """Rows [start, start + n) of the Mooncake trace: input_length, output_length, hash_ids."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= start + n:
                break
            if i >= start:
                r = json.loads(line)
                out.append({"input_length": r["input_length"], "output_length": r["output_length"],
                            "hash_ids": r["hash_ids"]})
    return out


def per_block_ids(rows: list[dict], modulus: int = 97) -> list[list[int]]:
    """Rewrite chained ids as per-block content hashes: the same id recurs after other prefixes.

    Position 0 keeps its id (shared system prompts stay shared); later ids are folded modulo a
    small number, so a block's content repeats across unrelated prompts. vLLM chains
    H(parent, block) and so shares a block only after an equal prefix; the replay must chain the
    ids at load to do the same (engine/trace_ids.py: chained_ids).
    """
    out = []
    for r in rows:
        ids = r["hash_ids"]
        out.append([ids[0]] + [1_000_000 + (x % modulus) for x in ids[1:]])
    return out


def request_inputs(w: Workload, rows: list[dict]) -> list[dict]:
    """What both drivers feed: per request its prompt length, output length, ids and priority."""
    ids = per_block_ids(rows) if w.per_block_hashes else [r["hash_ids"] for r in rows]
    out = []
    for r, h in zip(rows, ids):
        if r["input_length"] > MAX_INPUT:
            continue  # would not fit the small caches at all (replay rejects such rows up front)
        i = len(out)
        n_out = r["output_length"]
        if w.max_output:
            n_out = min(n_out, w.max_output)
        out.append({"idx": i, "input_tokens": r["input_length"], "output_tokens": max(1, n_out),
                    "hash_ids": list(h), "priority": i % 3 if w.policy == "priority" else 0})
    return out


def prompt_tokens(hash_ids: list[int], input_tokens: int) -> list[int]:
    """Token ids for a prompt such that equal trace ids give equal tokens (so equal chained-id
    prefixes are equal token prefixes, and vLLM's own hashes share exactly what the ids share)."""
    hb = HASH_BLOCK_SIZE
    toks: list[int] = []
    for i, h in enumerate(hash_ids):
        n = min(hb, input_tokens - i * hb)
        if n <= 0:
            break
        base = (h % 2_000_000) * hb
        toks.extend(range(base, base + n))
    if len(toks) < input_tokens:
        raise ValueError(f"{len(hash_ids)} hash ids cover fewer than {input_tokens} tokens")
    return toks


def output_token(idx: int, pos: int) -> int:
    """A generated token unique to its request (no other request's block can match it)."""
    return 2_000_000 * HASH_BLOCK_SIZE + idx * 100_000 + pos

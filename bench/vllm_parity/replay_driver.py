"""Our engine on a parity workload, in the same lock-step loop as the vLLM driver.

The scheduler is built exactly as `replay run` builds it (replay.engine.scheduler_factory.build_scheduler, the
factory `replay run` itself calls, from an
EngineConfig), then stepped one step per step with no timing: schedule(), then
update_from_output(), recording the tables of bench/vllm_parity/tables.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.vllm_parity.model_configs import model_dir
from bench.vllm_parity.tables import StepRecorder, Tables
from bench.vllm_parity.workloads import BLOCK_SIZE, HASH_BLOCK_SIZE, Workload, request_inputs
from replay.engine.block_keys import BlockKeys
from replay.engine.config import EngineConfig
from replay.engine.request import Request
from replay.engine.scheduler_factory import build_scheduler
from replay.engine.trace_ids import chained_ids, is_chained, shared_lead

MAX_STEPS = 200_000
MAX_MODEL_LEN = 131072  # as the vLLM driver (Llama-3.1-8B max_position_embeddings)


def engine_config(w: Workload, models_root: Path) -> EngineConfig:
    """The `replay run` config of a workload (the model is the same config.json vLLM reads)."""
    cfg: dict = {
        "model": str(model_dir(w, models_root) / "config.json"),
        # Neither changes a scheduling decision (the harness has no clock); they only make the
        # block counts pass replay's start-up check that the KV cache fits the GPUs (an 8-GPU node,
        # DeepSeek-V3 in fp8 as it is served).
        "tensor_parallel_size": 8,
        "dtype": "fp8" if w.num_spec_tokens else "bf16",
        "scheduler": {"max_num_batched_tokens": w.max_num_batched_tokens, "max_num_seqs": w.max_num_seqs,
                      "policy": w.policy, "long_prefill_token_threshold": w.long_prefill_token_threshold,
                      "reserve_full_isl": w.reserve_full_isl},
        "kv_cache": {"block_size": BLOCK_SIZE, "enable_prefix_caching": w.enable_prefix_caching,
                     "num_gpu_blocks": w.num_gpu_blocks},
    }
    if w.num_spec_tokens:
        cfg["speculative"] = {"num_speculative_tokens": w.num_spec_tokens,
                              "acceptance_rates": list(w.acceptance_rates), "seed": w.spec_seed}
    return EngineConfig.model_validate(cfg)


def run_replay(w: Workload, rows: list[dict], models_root: Path) -> Tables:
    config = engine_config(w, models_root)
    sched = build_scheduler(config, w.num_gpu_blocks, max_model_len=MAX_MODEL_LEN)
    hash_lookahead = sched.kv.hash_lookahead
    inputs = request_inputs(w, rows)
    lengths = [len(x["hash_ids"]) for x in inputs]
    offsets = np.zeros(len(inputs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    flat = np.array([h for x in inputs for h in x["hash_ids"]], dtype=np.uint64)
    if not is_chained(flat, offsets):
        flat = chained_ids(flat, offsets)  # as engine/trace_input.py does at load (engine/trace_ids.py)
    lead = shared_lead(flat, offsets)
    values = flat.tolist()
    for x in inputs:
        i = x["idx"]
        keys = BlockKeys(values, int(offsets[i]), int(offsets[i + 1]), HASH_BLOCK_SIZE, BLOCK_SIZE,
                         x["input_tokens"], i, hash_lookahead, int(lead[i]))
        sched.add_request(Request(i, str(i), 0.0, x["input_tokens"], x["output_tokens"], keys,
                                  priority=x["priority"]))
    rec = StepRecorder()
    pool = sched.kv.pool
    step = 0
    while sched.has_unfinished():
        if step >= MAX_STEPS:
            raise RuntimeError(f"{w.name}: no end after {MAX_STEPS} steps")
        out = sched.schedule(float(step))
        rec.scheduled({r.idx: n for r, n in zip(out.reqs, out.num_new_tokens)},
                      {r.idx: r.num_computed_tokens for r in out.reqs},
                      [r.idx for r in sched.running], pool.get_num_free_blocks())
        finished: list[Request] = []
        emitted: list[Request] = []
        sched.update_from_output(out, float(step), finished, emitted, [])
        rec.updated(step, [r.idx for r in emitted], [r.idx for r in finished], [r.idx for r in sched.running],
                    pool.get_num_free_blocks())
        step += 1
    return rec.tables

"""vLLM 0.33's own V1 Scheduler on a parity workload, stepped with fake model outputs.

Runs only in the vLLM venv (e.g. ``~/vllm-venv``, ``pip install vllm==0.33.0``; never a project
dependency). The scheduler is built as vLLM's tests/v1/core/utils.py ``create_scheduler`` builds it:
an exact KVCacheConfig (num_blocks, one full-attention group), offline, from a local folder holding
only config.json (bench/vllm_parity/model_configs.py), ``skip_tokenizer_init=True`` and
``DeviceConfig(device="cpu")`` since no accelerator platform is detected.

Each step: schedule(); a fake ModelRunnerOutput with one sampled token for every request whose
scheduled tokens reach its last known token (a non-final prefill chunk samples nothing), plus the
accepted drafts, drawn from replay's own AcceptanceSampler (engine/spec_decode.py) so both sides see
the same draws; update_from_output(); then k drafts for every running request through
update_draft_token_ids, as the MTP proposer hands them over.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.vllm_parity.model_configs import model_dir
from bench.vllm_parity.tables import StepRecorder, Tables
from bench.vllm_parity.workloads import BLOCK_SIZE, Workload, output_token, prompt_tokens, request_inputs

MAX_STEPS = 200_000
MAX_MODEL_LEN = 131072


def build_scheduler(w: Workload, models_root: Path):
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    folder = str(model_dir(w, models_root))
    model_config = ModelConfig(model=folder, tokenizer=folder, skip_tokenizer_init=True, dtype="bfloat16",
                               seed=0, max_model_len=MAX_MODEL_LEN)
    scheduler_config = SchedulerConfig(
        max_num_seqs=w.max_num_seqs, max_num_batched_tokens=w.max_num_batched_tokens,
        max_model_len=MAX_MODEL_LEN, long_prefill_token_threshold=w.long_prefill_token_threshold,
        enable_chunked_prefill=True, policy=w.policy, scheduler_reserve_full_isl=w.reserve_full_isl,
        is_encoder_decoder=False)
    cache_config = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=w.enable_prefix_caching)
    speculative_config = None
    if w.num_spec_tokens:
        speculative_config = SpeculativeConfig(method="mtp", num_speculative_tokens=w.num_spec_tokens,
                                               target_model_config=model_config,
                                               target_parallel_config=ParallelConfig())
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, speculative_config=speculative_config,
                             device_config=DeviceConfig(device="cpu"))
    kv_cache_config = KVCacheConfig(
        num_blocks=w.num_gpu_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1,
                                                                         head_size=1, dtype=torch.float32))])
    cache_config.num_gpu_blocks = w.num_gpu_blocks
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config, log_stats=False,
                     structured_output_manager=StructuredOutputManager(vllm_config),
                     block_size=BLOCK_SIZE), vllm_config


def run_vllm(w: Workload, rows: list[dict], models_root: Path) -> tuple[Tables, dict]:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request

    from replay.engine.spec_decode import AcceptanceSampler

    sched, vllm_config = build_scheduler(w, models_root)
    meta = {"vllm_version": __import__("vllm").__version__,
            "num_prefill_lookahead_tokens": vllm_config.num_prefill_lookahead_tokens,
            "num_hash_lookahead_tokens": vllm_config.num_hash_lookahead_tokens,
            "num_lookahead_tokens": vllm_config.num_lookahead_tokens}
    from vllm.utils.hashing import sha256

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256, vllm_config.num_hash_lookahead_tokens)
    inputs = request_inputs(w, rows)
    for x in inputs:
        params = SamplingParams(max_tokens=x["output_tokens"], ignore_eos=True)
        req = Request(request_id=str(x["idx"]), prompt_token_ids=prompt_tokens(x["hash_ids"], x["input_tokens"]),
                      sampling_params=params, pooling_params=None,
                      arrival_time=float(x["idx"]) * 1e-6, priority=x["priority"], block_hasher=hasher)
        sched.add_request(req)
    sampler = AcceptanceSampler(list(w.acceptance_rates), w.spec_seed) if w.num_spec_tokens else None
    k = w.num_spec_tokens
    spec_step: dict[str, int] = {}
    rec = StepRecorder()
    pool = sched.kv_cache_manager.block_pool
    step = 0
    while sched.has_unfinished_requests():
        if step >= MAX_STEPS:
            raise RuntimeError(f"{w.name}: no end after {MAX_STEPS} steps")
        so = sched.schedule()
        n_sched = so.num_scheduled_tokens
        reqs = sched.requests
        rec.scheduled({int(r): n for r, n in n_sched.items()},
                      {int(r): reqs[r].num_computed_tokens for r in n_sched},
                      [int(r.request_id) for r in sched.running], pool.get_num_free_blocks())
        req_ids = list(n_sched)
        sampled: list[list[int]] = []
        emitted: list[int] = []
        for rid in req_ids:
            r = reqs[rid]
            if r.num_computed_tokens < r.num_tokens:  # a non-final prefill chunk samples nothing
                sampled.append([])
                continue
            drafts = so.scheduled_spec_decode_tokens.get(rid)
            n = 1
            if drafts and all(d == -1 for d in drafts):
                pass  # pad_spec_decode placeholders: no real draft, so none is accepted
            elif drafts:
                s = spec_step.get(rid, 0)
                spec_step[rid] = s + 1
                n += sampler.num_accepted(int(rid), s, len(drafts))
            pos = r.num_output_tokens
            sampled.append([output_token(int(rid), pos + j) for j in range(n)])
            emitted.append(int(rid))
        out = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        engine_outputs = sched.update_from_output(so, out)
        finished = sorted({int(o.request_id) for eo in engine_outputs.values() for o in eo.outputs
                           if o.finish_reason is not None})
        if k:
            live = [rid for rid in req_ids if rid in reqs and not reqs[rid].is_finished()]
            sched.update_draft_token_ids(DraftTokenIds(live, [[0] * k for _ in live]))
        rec.updated(step, emitted, finished, [int(r.request_id) for r in sched.running],
                    pool.get_num_free_blocks())
        step += 1
    return rec.tables, meta

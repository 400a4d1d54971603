"""Configs vLLM refuses are refused here too, with the key named; YAML look-alikes are not numbers."""

from __future__ import annotations

import pytest

from replay.base.errors import ConfigError
from replay.engine.config import load_config


@pytest.mark.parametrize("override,message", [
    # Llama-3.1-8B: 32 attention heads, 8 KV heads (engine/models/catalog.yaml)
    ("tensor_parallel_size=3", "does not divide the 32 attention heads"),
    ("tensor_parallel_size=64", "does not divide the 32 attention heads"),
    ("max_model_len=131073", "exceeds meta-llama/Llama-3.1-8B's limit of 131072"),
    # 1e11 blocks x 16 tokens x 128 KiB/token: far beyond the H200's 140.4 GiB
    ("kv_cache.num_gpu_blocks=100000000000", "more than the 140.4 GiB of a whole h200_sxm"),
    ("kv_cache.kv_cache_size_tokens=2000000", "more than the 140.4 GiB"),
    ("kv_cache.num_gpu_blocks=1e11", "kv_cache.num_gpu_blocks: Input should be a valid integer"),
    ("scheduler.max_num_seqs=true", "scheduler.max_num_seqs: Input should be a valid integer"),
    ("scheduler.max_num_batched_tokens=8192.0", "Input should be a valid integer"),
    ("kv_cache.enable_prefix_caching=1", "Input should be a valid boolean"),
    ("load.speedup=.inf", "load.speedup: Input should be a finite number"),
    ("load.speedup=.nan", "load.speedup: Input should be a finite number"),
    ("host_offload={num_cpu_blocks: 10, d2h_gbps: .inf}", "host_offload.d2h_gbps: Input should be a finite number"),
])
def test_refused_with_the_key_named(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("override", [
    "tensor_parallel_size=2", "tensor_parallel_size=8", "tensor_parallel_size=16",  # 16: KV heads replicated
    "max_model_len=131072", "kv_cache.num_gpu_blocks=50000", "load.speedup=2",  # an int where a float goes
])
def test_what_vllm_accepts_is_accepted(override):
    load_config(None, [override])


def test_mla_model_checks_only_attention_heads():
    """DeepSeek-V3 (MLA, 128 heads): the KV latent is replicated on every rank, any divisor of 128 works."""
    assert load_config(None, ["model=deepseek-ai/DeepSeek-V3", "tensor_parallel_size=8"]).tensor_parallel_size == 8
    with pytest.raises(ConfigError, match="128 attention heads"):
        load_config(None, ["model=deepseek-ai/DeepSeek-V3", "tensor_parallel_size=6"])


def test_the_kv_bound_is_the_gpus_memory():
    """The bound is exact: the largest cache that fits one H200's usable memory passes, one block more fails."""
    from replay.engine.hardware import get_hardware

    cfg = load_config(None)
    per_block = cfg.kv_bytes_per_token() * cfg.kv_cache.block_size
    fits = int(get_hardware("h200_sxm").gpu.usable_memory_bytes.value) // per_block
    load_config(None, [f"kv_cache.num_gpu_blocks={fits}"])
    with pytest.raises(ConfigError, match="num_gpu_blocks"):
        load_config(None, [f"kv_cache.num_gpu_blocks={fits + 1}"])

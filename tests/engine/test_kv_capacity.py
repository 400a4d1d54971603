"""KV bytes per token and the GPU block count, as vLLM sizes them."""

import pytest

from replay.base.errors import ConfigError
from replay.engine.config import load_config
from replay.engine.kv_capacity import GIB, resolve_num_gpu_blocks


def cfg(*overrides):
    return load_config(None, list(overrides))


def test_llama_8b_bf16_is_128_kib_per_token():
    assert cfg().kv_bytes_per_token() == 131072  # spec: 2 * 32 * 8 * 128 * 2


def test_kv_dtype_tp_and_head_replication():
    assert cfg("kv_cache.cache_dtype=fp8").kv_bytes_per_token() == 65536
    assert cfg("dtype=fp8").kv_bytes_per_token() == 65536          # auto = weight dtype
    assert cfg("tensor_parallel_size=2").kv_bytes_per_token() == 65536
    # tp 16 > 8 KV heads: vLLM replicates, one KV head per rank
    assert cfg("tensor_parallel_size=16").kv_bytes_per_token() == 2 * 1 * 128 * 2 * 32


def test_mla_latent_is_not_sharded_and_mtp_layers_get_kv():
    ds = ("model=deepseek-ai/DeepSeek-V3", "tensor_parallel_size=8")
    assert cfg(*ds).kv_bytes_per_token() == 61 * (512 + 64) * 2      # no factor 2, not divided by TP
    with_mtp = cfg(*ds, "speculative.num_speculative_tokens=1")
    assert with_mtp.kv_bytes_per_token() == 62 * (512 + 64) * 2


def test_explicit_override_wins():
    assert cfg("kv_cache.kv_bytes_per_token=12345").kv_bytes_per_token() == 12345


def test_given_block_counts():
    c = resolve_num_gpu_blocks(cfg("kv_cache.num_gpu_blocks=1000"))
    assert (c.num_gpu_blocks, c.source, c.usable_blocks) == (1000, "num_gpu_blocks", 999)
    c = resolve_num_gpu_blocks(cfg("kv_cache.kv_cache_size_tokens=913824"))
    assert (c.num_gpu_blocks, c.source, c.num_tokens) == (57114, "kv_cache_size_tokens", 913824)


def test_memory_derivation_follows_vllm_formula():
    c = resolve_num_gpu_blocks(cfg())
    assert c.source == "memory"
    assert c.weights_bytes / GIB == pytest.approx(14.96, abs=0.05)  # vLLM logs 14.99 GiB for Llama-3.1-8B
    assert 0.5 * GIB < c.activation_peak_bytes < 4 * GIB
    expect = int(c.total_memory_bytes * 0.92) - c.weights_bytes - c.activation_peak_bytes \
        - c.non_torch_bytes - c.cuda_graph_bytes
    assert c.available_bytes == expect
    assert c.num_gpu_blocks == expect // (16 * 131072)
    assert 800_000 < c.num_tokens < 1_000_000


def test_more_memory_more_blocks():
    base = resolve_num_gpu_blocks(cfg()).num_gpu_blocks
    assert resolve_num_gpu_blocks(cfg("kv_cache.gpu_memory_utilization=0.8")).num_gpu_blocks < base
    assert resolve_num_gpu_blocks(cfg("tensor_parallel_size=2")).num_gpu_blocks > 2 * base
    assert resolve_num_gpu_blocks(cfg("kv_cache.block_size=32")).num_gpu_blocks == pytest.approx(base / 2, abs=1)


def test_model_too_big_is_a_clear_error():
    with pytest.raises(ConfigError, match="does not fit"):
        resolve_num_gpu_blocks(cfg("model=meta-llama/Llama-3.1-70B"))
    assert resolve_num_gpu_blocks(cfg("model=meta-llama/Llama-3.1-70B", "dtype=fp8")).num_gpu_blocks > 1000

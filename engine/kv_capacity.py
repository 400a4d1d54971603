"""KV cache size per token and the number of GPU blocks, the way vLLM V1 sizes them.

vLLM (``v1/worker/gpu_worker.determine_available_memory`` + ``v1/core/kv_cache_utils``):
  available = total_memory * gpu_memory_utilization - (weights + activation peak + non-torch + CUDA graphs)
  num_blocks = available // (page_size * num_kv_layers),  page_size = block_size * per-token bytes per layer
and block 0 of that pool is the reserved null block (it is counted in ``num_gpu_blocks``; the log line
"GPU KV cache size: N tokens" is num_blocks * block_size).

vLLM measures the activation peak, non-torch memory and CUDA-graph memory by profiling on the GPU;
we have no GPU, so they are modelled below with their sources. Users who know their server's figure
should give ``kv_cache.num_gpu_blocks`` or ``kv_cache.kv_cache_size_tokens`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from replay.base.errors import ConfigError
from replay.engine.config import DTYPE_BYTES, EngineConfig
from replay.engine.hardware import get_hardware
from replay.engine.models import ModelSpec, get_model

GIB = 1 << 30

# Non-torch memory per rank (CUDA context, cuBLAS workspaces): vLLM's memory profile logs
# "non_torch_memory" of about 0.2-0.6 GiB on Hopper at TP1. Guess, uncalibrated: 0.4 GiB.
NON_TORCH_BYTES_TP1 = int(0.4 * GIB)
# NCCL buffers when tp > 1: aiconfigurator-core 0.12.0 systems/h200_sxm.yaml misc.nccl_mem lists
# 342 MB at TP2 and 392 MB at TP4/8 (its "nonofficial correction based on observations").
NCCL_BYTES = {1: 0, 2: 358_612_992, 4: 411_041_792, 8: 411_041_792}
# CUDA graphs: vLLM logs "Graph capturing finished ... took 0.3-1.0 GiB" for 7-70B dense models with
# the default capture sizes (up to 512). Guess, uncalibrated: 0.5 GiB per rank.
CUDA_GRAPH_BYTES = int(0.5 * GIB)
# Activation peak of vLLM's profiling run: one forward over max_num_batched_tokens tokens plus a dummy
# sampler over max_num_seqs rows. Largest live set we model: the MLP's input, gate/up output and
# activation output plus the residual (T x (2h + 3*I/tp) in BF16), and the sampler's FP32 logits and
# probabilities (max_num_seqs x V/... x 4 bytes x 2). Comparable to the 1-3 GiB vLLM logs for 8B models
# at 8,192 batched tokens; an estimate, not a measurement.
_LOGITS_COPIES = 2


@dataclass(frozen=True)
class KVCapacity:
    num_gpu_blocks: int           # includes vLLM's reserved null block
    block_size: int
    kv_bytes_per_token: int       # per GPU rank, all KV layers
    source: str                   # "num_gpu_blocks" | "kv_cache_size_tokens" | "memory"
    total_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    weights_bytes: int | None = None
    activation_peak_bytes: int | None = None
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    available_bytes: int | None = None

    @property
    def num_tokens(self) -> int:
        """What vLLM logs as "GPU KV cache size: N tokens"."""
        return self.num_gpu_blocks * self.block_size

    @property
    def usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1


def weights_bytes_per_rank(config: EngineConfig, model: ModelSpec) -> int:
    """Weights on one rank: everything sharded by TP (vocab-parallel embedding and LM head included),
    plus the MTP head when it drafts. The LM head stays BF16 under fp8 (vLLM leaves it unquantized)."""
    w = DTYPE_BYTES[config.dtype]
    tp = config.tensor_parallel_size
    head = 0 if model.tie_word_embeddings else model.lm_head_params
    body = model.total_params - head
    if config.speculative is not None and config.speculative.drafter == "model":
        body += model.num_mtp_layers * model.mtp_layer_params
    return (body * w + head * 2) // tp


def activation_peak_bytes(config: EngineConfig, model: ModelSpec) -> int:
    """Modelled activation peak of vLLM's profiling forward (see the constant block above)."""
    tp = config.tensor_parallel_size
    tokens = config.scheduler.max_num_batched_tokens
    inter = max(model.intermediate_size, model.experts_per_token * model.moe_intermediate_size)
    mlp = tokens * (2 * model.hidden_size + 3 * inter // tp) * 2
    sampler = min(config.scheduler.max_num_seqs, tokens) * (model.vocab_size // tp) * 4 * _LOGITS_COPIES
    return mlp + sampler


def resolve_num_gpu_blocks(config: EngineConfig) -> KVCapacity:
    """How many KV blocks the modeled server has: given directly, from its logged token count, or
    derived from memory as vLLM does."""
    kv = config.kv_cache
    per_token = config.kv_bytes_per_token()
    bs = kv.block_size
    if kv.num_gpu_blocks is not None:
        return KVCapacity(kv.num_gpu_blocks, bs, per_token, "num_gpu_blocks")
    if kv.kv_cache_size_tokens is not None:
        blocks = kv.kv_cache_size_tokens // bs
        if blocks < 2:
            raise ConfigError(f"kv_cache.kv_cache_size_tokens={kv.kv_cache_size_tokens} is under two blocks "
                              f"of {bs} tokens")
        return KVCapacity(blocks, bs, per_token, "kv_cache_size_tokens")
    model = get_model(config.model)
    hw = get_hardware(config.hardware)
    tp = config.tensor_parallel_size
    total = int(hw.gpu.usable_memory_bytes.value)
    weights = weights_bytes_per_rank(config, model)
    act = activation_peak_bytes(config, model)
    non_torch = NON_TORCH_BYTES_TP1 + NCCL_BYTES.get(tp, NCCL_BYTES[8])
    graphs = CUDA_GRAPH_BYTES
    available = int(total * kv.gpu_memory_utilization) - weights - act - non_torch - graphs
    blocks = available // (bs * per_token) if available > 0 else 0
    if blocks < 2:
        raise ConfigError(
            f"{model.name} does not fit on {hw.name} at tensor_parallel_size={tp}, dtype={config.dtype}: "
            f"{weights / GIB:.1f} GiB of weights per rank leave {max(available, 0) / GIB:.2f} GiB for KV cache "
            f"(gpu_memory_utilization={kv.gpu_memory_utilization}); raise tensor_parallel_size or use fp8")
    return KVCapacity(blocks, bs, per_token, "memory", total_memory_bytes=total,
                      gpu_memory_utilization=kv.gpu_memory_utilization, weights_bytes=weights,
                      activation_peak_bytes=act, non_torch_bytes=non_torch, cuda_graph_bytes=graphs,
                      available_bytes=available)

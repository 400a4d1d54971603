"""Translate one of our EngineConfigs into the equivalent AISimulate ``predict`` config.

The comparison is only worth something when both simulators are told the same thing, so every key
that changes behaviour is either mapped exactly or refused with the reason. Keys that have no
AISimulate equivalent but leave behaviour at vLLM's default are recorded as notes in the result.

AISimulate facts used here (checked against aisimulate 0.13.0.dev202610270000000085, see
docs/fidelity.md):
- ``kv_cache.capacity.blocks`` counts usable blocks: a 161-token prompt does not fit in 10 blocks
  of 16 and fits in 11. vLLM's ``num_gpu_blocks`` (ours) includes the reserved null block, so
  AISimulate blocks = num_gpu_blocks - 1.
- its default ``block_size`` for vLLM is 64 (vLLM's own is 16), so the block size is always written.
- it refuses speculation together with host offload, and trace traffic only under
  ``trace_timestamps`` or ``concurrency`` load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.compare.translate_tiers import TierTranslationError, translate_tiers
from replay.engine.config import EngineConfig

# Our catalog names (vLLM / Hugging Face ids) -> AISimulate's bundled model configs.
MODEL_MAP: dict[str, str] = {
    "meta-llama/Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-405B": "meta-llama/Meta-Llama-3.1-405B",
    "meta-llama/Meta-Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Meta-Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "Qwen/Qwen3-8B": "Qwen/Qwen3-8B",
    "Qwen/Qwen3-32B": "Qwen/Qwen3-32B",
    "Qwen/Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B",
    "deepseek-ai/DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
    "XiaomiMiMo/MiMo-7B-Base": "XiaomiMiMo/MiMo-7B-Base",
}

HARDWARE_MAP: dict[str, str] = {"h200_sxm": "h200_sxm", "h100_sxm": "h100_sxm", "b200": "b200_sxm"}


class TranslationError(ValueError):
    """A config key whose behaviour AISimulate cannot reproduce; the message names the key."""


@dataclass
class PeerTraffic:
    """How the peer reads the trace: a Mooncake JSONL and the tokens per hash id."""

    path: str
    block_size: int


@dataclass
class Translation:
    peer: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def expected_accepted_from_rates(rates: list[float]) -> float:
    """E[accepted drafts per step] for conditional per-position rates: sum_i prod_{j<=i} a_j.

    (MTP, docs/engine.md): expected tokens per step = 1 + sum_i prod_{j<=i} a_j.
    """
    total, run = 0.0, 1.0
    for rate in rates:
        run *= rate
        total += run
    return total


def _refuse(key: str, value: Any, why: str) -> TranslationError:
    return TranslationError(f"{key}={value!r} cannot be translated to AISimulate: {why}")


def _capacity_blocks(cfg: EngineConfig) -> int:
    kv = cfg.kv_cache
    if kv.num_gpu_blocks is not None:
        total = kv.num_gpu_blocks
    elif kv.kv_cache_size_tokens is not None:
        # vLLM logs "GPU KV cache size: N tokens" as num_gpu_blocks * block_size (null block included).
        total = kv.kv_cache_size_tokens // kv.block_size
    else:
        raise TranslationError(
            "kv_cache.num_gpu_blocks (or kv_cache.kv_cache_size_tokens) is not set: each simulator would "
            "size the KV cache from memory its own way; give a fixed capacity so both use the same one"
        )
    if total < 2:
        raise TranslationError(f"kv_cache capacity of {total} blocks leaves no usable block after vLLM's null block")
    return total - 1


def translate(cfg: EngineConfig, traffic: PeerTraffic) -> Translation:
    """Build the AISimulate config dict for ``cfg`` replaying ``traffic``; refuse what does not map."""
    notes: list[str] = []

    model = MODEL_MAP.get(cfg.model)
    if model is None:
        raise _refuse("model", cfg.model, f"no AISimulate bundled config for it (known: {', '.join(sorted(MODEL_MAP))})")
    hardware = HARDWARE_MAP.get(cfg.hardware)
    if hardware is None:
        raise _refuse("hardware", cfg.hardware, f"known: {', '.join(sorted(HARDWARE_MAP))}")
    if cfg.dtype != "bf16":
        raise _refuse("dtype", cfg.dtype, "the comparison covers BF16 weights only")
    if cfg.semantics != "0.33":
        raise _refuse("semantics", cfg.semantics, "AISimulate ports one (current) vLLM scheduler")

    sched = cfg.scheduler
    if sched.policy != "fcfs":
        raise _refuse("scheduler.policy", sched.policy, "the trace path has no priority policy setting")
    if sched.long_prefill_token_threshold != 0:
        raise _refuse("scheduler.long_prefill_token_threshold", sched.long_prefill_token_threshold, "no such setting")
    if sched.watermark != 0.0:
        raise _refuse("scheduler.watermark", sched.watermark, "no such setting")
    if not sched.reserve_full_isl:
        raise _refuse("scheduler.reserve_full_isl", False, "no such setting")
    notes.append("scheduler.reserve_full_isl=true has no AISimulate key; its vLLM port decides admission itself")

    kv = cfg.kv_cache
    if kv.cache_dtype not in ("auto", "bf16"):
        raise _refuse("kv_cache.cache_dtype", kv.cache_dtype, "the comparison covers BF16 KV only")
    blocks = _capacity_blocks(cfg)
    notes.append(f"KV capacity: {blocks} usable blocks (vLLM num_gpu_blocks {blocks + 1} minus the null block)")
    kv_peer: dict[str, Any] = {
        "block_size": kv.block_size,
        "prefix_caching": kv.enable_prefix_caching,
        "capacity": {"type": "fixed", "blocks": blocks},
    }
    if kv.kv_bytes_per_token is not None:
        kv_peer["bytes_per_token"] = kv.kv_bytes_per_token

    ho = cfg.host_offload
    if not kv.offload_prompt_only and (ho is not None or kv.tiers):
        notes.append("kv_cache.offload_prompt_only=false applies to ours only: AISimulate offloads prompt "
                     "blocks only, vLLM's default")
    if ho is not None:
        if cfg.speculative is not None:
            raise TranslationError(
                "speculative and host_offload together cannot be translated: AISimulate refuses speculation "
                "with G2 offload (run the MTP-only and G2-only variants instead)"
            )
        if ho.block_size is not None and ho.block_size != kv.block_size:
            raise _refuse("host_offload.block_size", ho.block_size,
                          f"AISimulate has no offload block size; it offloads GPU blocks of {kv.block_size}")
        if ho.num_cpu_blocks is not None:
            host_blocks = ho.num_cpu_blocks
        else:
            if kv.kv_bytes_per_token is None:
                raise _refuse("host_offload.size_gib", ho.size_gib,
                              "give host_offload.num_cpu_blocks, or kv_cache.kv_bytes_per_token to size it")
            host_blocks = int(ho.size_gib * 2**30 // (kv.block_size * kv.kv_bytes_per_token))
            notes.append(f"host_offload.size_gib={ho.size_gib} -> {host_blocks} host blocks")
        kv_peer["host_offload"] = {
            "num_host_blocks": host_blocks,
            "d2h_bandwidth_gbps": ho.d2h_gbps,
            "h2d_bandwidth_gbps": ho.h2d_gbps,
            "latency_to_first_byte_ms": ho.latency_us / 1000.0,
        }
    try:
        translate_tiers(cfg, kv_peer, notes)
    except TierTranslationError as exc:
        raise TranslationError(str(exc)) from None

    load = cfg.load
    if load.mode == "trace_timestamps":
        peer_load: dict[str, Any] = {"type": "trace_timestamps", "speedup": load.speedup}
    elif load.mode == "concurrency":
        peer_load = {"type": "concurrency", "concurrency": load.concurrency}
    else:
        raise _refuse("load.mode", load.mode, "AISimulate replays a trace only on trace_timestamps or concurrency")
    if load.max_requests is not None:
        notes.append(f"load.max_requests={load.max_requests}: the peer's trace is cut to its first rows")

    engine: dict[str, Any] = {
        "mode": "aggregated",
        "model": model,
        "hardware": hardware,
        "backend": "vllm",
        "workers": {
            "aggregated": {
                "parallelism": {"tensor": cfg.tensor_parallel_size},
                "scheduler": {"max_batched_tokens": sched.max_num_batched_tokens, "max_sequences": sched.max_num_seqs},
                "kv_cache": kv_peer,
            }
        },
    }
    if cfg.max_model_len is not None:
        engine["context_length"] = cfg.max_model_len

    fleet = cfg.fleet
    if fleet is not None and fleet.disaggregated:
        engine["mode"] = "disaggregated"
        engine["workers"] = {pool: _pool_worker(cfg, pool) for pool in ("prefill", "decode")}
        engine["kv_transfer"] = _kv_transfer(fleet)
        notes.append(f"disaggregated: {fleet.prefill.replicas} prefill + {fleet.decode.replicas} decode replicas, "
                     "round robin in each pool")
    elif fleet is not None:
        if fleet.router != "round_robin" and fleet.replicas > 1:
            raise _refuse("fleet.router", fleet.router,
                          "AISimulate's parallelism.replicas spreads requests round robin; compare round_robin only")
        if fleet.router_latency_ms:
            raise _refuse("fleet.router_latency_ms", fleet.router_latency_ms, "AISimulate has no router latency")
        engine["workers"]["aggregated"]["parallelism"]["replicas"] = fleet.replicas
        notes.append(f"fleet: {fleet.replicas} replicas, round robin (AISimulate parallelism.replicas)")

    spec = cfg.speculative
    if spec is not None:
        if spec.acceptance_rates is not None:
            if len(spec.acceptance_rates) != spec.num_speculative_tokens:
                raise _refuse("speculative.acceptance_rates", spec.acceptance_rates,
                              "needs one rate per speculative token")
            expected = expected_accepted_from_rates(spec.acceptance_rates)
            notes.append(f"speculative.acceptance_rates {spec.acceptance_rates} -> expected_accepted_tokens "
                         f"{expected:.4f}; AISimulate takes only the mean, not the per-position rates")
        elif spec.expected_accepted_tokens is not None:
            expected = spec.expected_accepted_tokens
        else:
            raise TranslationError("speculative needs acceptance_rates or expected_accepted_tokens")
        if expected > spec.num_speculative_tokens:
            raise _refuse("speculative.expected_accepted_tokens", expected,
                          f"above num_speculative_tokens={spec.num_speculative_tokens}")
        engine["speculation"] = {
            "kind": spec.method,
            "params": {"depth": spec.num_speculative_tokens},
            "expected_accepted_tokens": expected,
            "seed": spec.seed,
        }
        if spec.drafter == "synthetic":
            notes.append("speculative.drafter=synthetic: AISimulate costs MTP on any model without a word")

    if cfg.timing.backend == "roofline":
        notes.append("timing: ours = roofline, AISimulate = aiconfigurator op-level database (target: within 20%)")
    else:
        notes.append("timing: both use aiconfigurator-core's H200 database (target: within 10%)")
    if cfg.timing.profile is not None:
        notes.append(f"timing.profile={cfg.timing.profile!r} applies to ours only")
    if cfg.timing.host_overhead_ms is not None:
        # Not refused: AISimulate has no such key and adds no per-step host time (docs/fidelity.md),
        # so 0.0 is the like-for-like setting and any other value is a difference on our side only.
        same = " (the like-for-like setting: AISimulate adds no per-step host time)" \
            if cfg.timing.host_overhead_ms == 0.0 else ""
        notes.append(f"timing.host_overhead_ms={cfg.timing.host_overhead_ms} applies to ours only{same}")

    peer = {
        "traffic": {
            "source": {"type": "trace", "paths": [traffic.path], "format": "mooncake", "block_size": traffic.block_size},
            "load": peer_load,
        },
        "engine": engine,
    }
    return Translation(peer=peer, notes=notes)


def _pool_worker(cfg: EngineConfig, pool: str) -> dict[str, Any]:
    """One pool of a disaggregated fleet as an AISimulate worker (its scheduler and KV set
    explicitly: AISimulate's prefill workers default to one sequence)."""
    pool_cfg = cfg.pool_config(pool)
    if pool_cfg.host_offload is not None or pool_cfg.speculative is not None:
        raise _refuse(f"fleet.{pool}", "host_offload/speculative", "the disaggregated comparison covers plain pools")
    kv = pool_cfg.kv_cache
    worker: dict[str, Any] = {
        "parallelism": {"tensor": pool_cfg.tensor_parallel_size, "replicas": getattr(cfg.fleet, pool).replicas},
        "scheduler": {"max_batched_tokens": pool_cfg.scheduler.max_num_batched_tokens,
                      "max_sequences": pool_cfg.scheduler.max_num_seqs},
        "kv_cache": {"block_size": kv.block_size, "prefix_caching": kv.enable_prefix_caching,
                     "capacity": {"type": "fixed", "blocks": _capacity_blocks(pool_cfg)}},
    }
    if kv.kv_bytes_per_token is not None:
        worker["kv_cache"]["bytes_per_token"] = kv.kv_bytes_per_token
    return worker


def _kv_transfer(fleet: Any) -> dict[str, Any]:
    for key in ("router", "prefill_router"):
        if getattr(fleet, key) != "round_robin":
            raise _refuse(f"fleet.{key}", getattr(fleet, key), "compare round_robin pools only")
    if fleet.local_prefill_max_tokens is not None or fleet.prefill_queue_max is not None:
        raise _refuse("fleet.local_prefill_max_tokens", fleet.local_prefill_max_tokens,
                      "AISimulate disaggregates every request")
    kt = fleet.kv_transfer
    if kt.latency_ms:
        raise _refuse("fleet.kv_transfer.latency_ms", kt.latency_ms, "AISimulate's kv_transfer has no latency")
    if kt.bandwidth_gb_per_s == float("inf"):
        raise _refuse("fleet.kv_transfer.bandwidth_gb_per_s", "inf", "give a finite bandwidth")
    return {"bandwidth_gb_per_second": kt.bandwidth_gb_per_s, "bytes_per_token": kt.bytes_per_token,
            "timing_mode": kt.timing_mode}

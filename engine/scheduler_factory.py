"""Build a replica's scheduler from a config, as ``replay run`` does: its KV cache manager (with the
0.33 or 0.11 rules and the MTP hash lookahead), its limits, its G2 tier and MTP sampler.

Construction only, so it stays out of the compiled scheduler; ``replay run``, the tests and the vLLM
parity driver all build through ``build_scheduler``.
"""

from __future__ import annotations

from replay.engine.config import EngineConfig
from replay.engine.kv_cache_manager import KVCacheManager
from replay.engine.kv_tiers import TierPools
from replay.engine.models import get_model
from replay.engine.offload import OffloadManager
from replay.engine.scheduler import Scheduler, SchedulerLimits
from replay.engine.spec_decode import AcceptanceSampler, resolve_rates


def prefill_lookahead(config: EngineConfig) -> int:
    """vLLM 0.33 VllmConfig.num_prefill_lookahead_tokens for MTP: k for a multi-module MTP head
    (num_nextn_predict_layers and k both > 1: each module reads one token further), else 1."""
    if config.speculative is None:
        return 0
    k = config.speculative.num_speculative_tokens
    layers = get_model(config.model).num_mtp_layers or 1  # vLLM's getattr default is 1
    return k if min(layers, k) > 1 else 1


def kv_cache_manager_for(config: EngineConfig, num_gpu_blocks: int, kv_connector: bool = False) -> KVCacheManager:
    """The KV cache manager `replay run` uses (and the vLLM parity harness drives). ``kv_connector``:
    a KV connector other than G2 is configured (the P/D connector of a disaggregated fleet)."""
    k = config.speculative.num_speculative_tokens if config.speculative else 0
    v011 = config.semantics == "0.11"
    caching = config.kv_cache.enable_prefix_caching
    la = prefill_lookahead(config) if (k and not v011) else 0
    # [0.33] VllmConfig.num_hash_lookahead_tokens: the prefill lookahead, but 0 (legacy hashes, and
    # so the EAGLE/MTP last-block drop) under a KV connector such as the G2 OffloadingConnector.
    connector = config.host_offload is not None or kv_connector or bool(config.kv_cache.tiers)
    kv = KVCacheManager(num_gpu_blocks, config.kv_cache.block_size, caching,
                        hash_lookahead=la if (caching and not connector) else 0,
                        drop_last_hit=bool(k and (v011 or connector)),
                        reprefillable=max(0, la - 1))
    kv.pool.uncached_first = not v011
    return kv


def scheduler_limits_for(config: EngineConfig, num_gpu_blocks: int, max_model_len: int) -> SchedulerLimits:
    sc = config.scheduler
    v011 = config.semantics == "0.11"
    k = config.speculative.num_speculative_tokens if config.speculative else 0
    return SchedulerLimits(
        max_num_batched_tokens=sc.max_num_batched_tokens,
        max_num_seqs=sc.max_num_seqs,
        max_model_len=max_model_len,
        long_prefill_token_threshold=sc.long_prefill_token_threshold,
        reserve_full_isl=sc.reserve_full_isl and not v011,
        reserve_loads=not v011,
        watermark_blocks=0 if v011 else int(sc.watermark * num_gpu_blocks),
        policy=sc.policy,
        num_spec_tokens=k,
        prefill_lookahead=0 if v011 else prefill_lookahead(config),
    )


def tier_pools_for(config: EngineConfig, kv_bytes_per_token: int = 0) -> TierPools | None:
    """The fleet's KV tiers below G2 (cluster tiers built once, shared by every replica), or None."""
    if not config.kv_cache.tiers:
        return None
    host = config.host_offload
    block_size = (host.block_size if host is not None else None) or config.kv_cache.block_size
    return TierPools(config.kv_cache.tiers, block_size,
                     block_size * (kv_bytes_per_token or config.kv_bytes_per_token()))


def build_scheduler(config: EngineConfig, num_gpu_blocks: int, max_model_len: int, *,
                    sampler: AcceptanceSampler | None = None, kv_bytes_per_token: int = 0,
                    kv_connector: bool = False, tier_pools: TierPools | None = None,
                    replica: int = 0) -> Scheduler:
    """One replica's scheduler as ``replay run`` builds it: its own KV cache and, with
    ``host_offload``, its own G2 tier; with ``kv_cache.tiers``, its chain of tiers from
    ``tier_pools`` (the fleet's, sharing cluster tiers; built for one replica when not given).
    ``sampler`` draws MTP acceptance (a fleet's replicas share one); built from the config when
    not given. ``kv_bytes_per_token`` prices G2 and tier copies (the config's own figure when 0)."""
    kv = kv_cache_manager_for(config, num_gpu_blocks, kv_connector)
    if sampler is None and config.speculative is not None:
        sampler = AcceptanceSampler(resolve_rates(config.speculative), config.speculative.seed)
    offload = None
    if config.kv_cache.tiers:
        pools = tier_pools or tier_pools_for(config, kv_bytes_per_token)
        assert pools is not None
        offload = OffloadManager(config.host_offload, kv, kv_bytes_per_token or config.kv_bytes_per_token(),
                                 lower=pools.chain_for(replica), prompt_only=config.kv_cache.offload_prompt_only)
    elif config.host_offload is not None:
        offload = OffloadManager(config.host_offload, kv, kv_bytes_per_token or config.kv_bytes_per_token(),
                                 prompt_only=config.kv_cache.offload_prompt_only)
    limits = scheduler_limits_for(config, num_gpu_blocks, max_model_len)
    return Scheduler(limits, kv, sampler, offload)

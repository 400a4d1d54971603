"""vLLM V1's KVCacheManager (v1/core/kv_cache_manager.py) for one full-attention group.

Block work is done per allocation (a chunk or a decode step), never per step over all of a
request's blocks: a request keeps its block table and how many leading blocks are already
registered in the prefix cache, so each call touches only the blocks that changed.

Private blocks: a full block whose key no other request can hold (it ends past the request's
leading trace ids that occur in other rows, or holds generated tokens) is findable only by its
owner, and only after a preemption. Such blocks are registered in the prefix-cache map when their
owner is preempted (and eagerly from then on), not when they fill; until then they carry the
free queue as "cached, findable by nobody" (an AnonymousRun counted as evictions,
engine/free_block_queue.py), so their eviction is still counted.
No lookup result changes; the reference workload's 15 M block registrations and evictions of
never-shared prompts become free-queue moves only.
"""

from __future__ import annotations

from typing import Final

from replay.engine.block_keys import key_group
from replay.engine.block_pool import BlockPool
from replay.engine.request import Request

_EAGER: Final = 1 << 62  # a preempted request registers every full block (it may look them up itself)


class KVCacheManager:
    __slots__ = ("pool", "block_size", "enable_caching", "hash_lookahead", "drop_last_hit", "reprefillable",
                 "_memo", "_evictable_memo", "_runs_memo")
    # The pool class: tests swap in tests/reference_block_pool.PerBlockPool to check it end to end.
    pool_factory = BlockPool

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool = True,
                 hash_lookahead: int = 0, drop_last_hit: bool = False, reprefillable: int = 0) -> None:
        self.pool = self.pool_factory(num_gpu_blocks, block_size)
        self.block_size = block_size
        self.enable_caching = enable_caching
        # MTP/EAGLE: [0.33] block hashes also cover the next `hash_lookahead` tokens;
        # [0.11] the last hit block is dropped instead.
        self.hash_lookahead = hash_lookahead
        self.drop_last_hit = drop_last_hit
        # vLLM 0.33 num_reprefillable_tokens: multi-module MTP may re-prefill the last
        # num_prefill_lookahead - 1 computed tokens, so they are never cached.
        self.reprefillable = reprefillable
        # The last lookup (request, pool version, walkable blocks, hits, hit tokens): schedule()
        # often asks again for the queue head that waiting_is_blocked() has just looked up, and a
        # head that stays blocked is asked at every step. The pool watches the key groups (trace
        # ids) the walk read (BlockPool.watched), and the walk is redone only after a key of one of
        # them was registered or evicted; the groups are one per trace block, so the watch costs
        # nothing per block to set up.
        self._memo: tuple[Request, int, int, list[int], int] | None = None
        # (hits, pool.free_version, how many of them are free, whether the pool watches them):
        # admission asks for the same hits up to three times in a row (the blocked-queue check, the
        # admission gate, allocate_slots), and a blocked head's at every step.
        self._evictable_memo: tuple[list[int], int, int, bool] | None = None
        # (hits, their keys' runs): the pool counts a hit's references in its trace block's table.
        self._runs_memo: tuple[list[int], list[range]] | None = None

    @staticmethod
    def _registrable(req: Request) -> int:
        """Leading full blocks of ``req`` worth registering: what any request could look up."""
        return req.keys.shared_blocks if not req.num_preemptions else _EAGER

    def num_registered_blocks(self, req: Request) -> int:
        n = req.num_cached_blocks
        sb = self._registrable(req)
        return n if n < sb else sb

    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Leading cached blocks of ``req`` and the tokens they cover.

        The last token is never a hit (it must be computed to produce logits), so the walk stops
        at (num_tokens - 1) // block_size blocks; with lookahead hashes a block also needs its
        next tokens to exist.
        """
        if not self.enable_caching:
            return [], 0
        pool = self.pool
        bs = self.block_size
        limit = min((req.num_tokens - 1) // bs, (req.num_tokens - self.hash_lookahead) // bs)
        memo = self._memo
        if memo is not None and memo[0] is req and memo[2] == limit and not pool.watch_hit:
            return memo[3], memo[4]  # nothing it read has changed; the list is read-only for callers
        # One table slice per trace block (BlockPool.cached_prefix), no key materialised.
        runs = req.keys.key_runs(0, limit, bs)
        hits = pool.cached_prefix(runs)
        pool.watched = groups_read(runs, len(hits))
        pool.watch_hit = False
        if self.drop_last_hit and hits:
            hits.pop()
        self._memo = (req, pool.version, limit, hits, len(hits) * bs)
        return hits, len(hits) * bs

    def num_blocks_to_admit(self, req: Request, new_computed_blocks: list[int], num_tokens: int,
                            num_lookahead_tokens: int = 0) -> int:
        """Free blocks that holding ``num_tokens`` tokens of ``req`` would consume.

        Hits whose ref_cnt is 0 sit in the free queue, so touching them consumes free capacity too.
        """
        bs = self.block_size
        needed = -(-(num_tokens + num_lookahead_tokens) // bs)
        held = len(req.block_ids) + len(new_computed_blocks)
        evictable_hits = self._num_evictable(req, new_computed_blocks) if new_computed_blocks else 0
        return max(0, needed - held) + evictable_hits

    def _num_evictable(self, req: Request, hits: list[int]) -> int:
        """How many of ``hits`` sit in the free queue (pool.num_free_among), memoised."""
        memo = self._evictable_memo
        pool = self.pool
        version = pool.free_version
        if memo is not None and memo[0] is hits and (memo[1] == version or (
                memo[3] and not pool.watch_free_change and not pool.watch_hit
                and self._memo is not None and self._memo[3] is hits)):
            return memo[2]
        n = pool.num_free_among(hits, self._hit_runs(req, hits))
        # The last lookup's hits (a blocked queue head's, asked at every step): the pool watches
        # their groups, so the count holds until a hit, a free or an eviction touches one of them.
        watched = self._memo is not None and self._memo[3] is hits
        if watched:
            pool.watch_free_change = False
        self._evictable_memo = (hits, version, n, watched)
        return n

    def _hit_runs(self, req: Request, hits: list[int]) -> list[range]:
        """The keys of ``hits``, the next blocks of ``req``, as runs (BlockKeys.key_runs), memoised."""
        memo = self._runs_memo
        if memo is not None and memo[0] is hits:
            return memo[1]
        held = len(req.block_ids)
        runs = req.keys.key_runs(held, held + len(hits), self.block_size)
        self._runs_memo = (hits, runs)
        return runs

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       new_computed_blocks: list[int] | None = None,
                       num_lookahead_tokens: int = 0, delay_cache: bool = False,
                       reserve_blocks: int = 0) -> bool:
        """Make room for ``num_new_tokens`` (+ lookahead) more tokens; False if the pool is short.

        ``delay_cache``: blocks that an asynchronous CPU load will fill are not registered yet
        (vLLM's delay_cache_blocks); the scheduler registers them when the load completes.
        ``reserve_blocks``: free blocks that must remain after the allocation (the watermark).
        """
        bs = self.block_size
        pool = self.pool
        num_new_computed = len(new_computed_blocks) if new_computed_blocks else 0
        num_computed = req.num_computed_tokens + num_new_computed * bs
        held = len(req.block_ids) + num_new_computed
        needed = -(-(num_computed + num_new_tokens + num_lookahead_tokens) // bs)
        num_new_blocks = needed - held
        if num_new_blocks < 0:
            num_new_blocks = 0
        if new_computed_blocks:
            evictable = self._num_evictable(req, new_computed_blocks)
            if num_new_blocks + evictable + reserve_blocks > pool.num_free:
                return False
            pool.touch(new_computed_blocks, self._hit_runs(req, new_computed_blocks))
            req.block_ids.extend(new_computed_blocks)
            req.num_cached_blocks = len(req.block_ids)
        elif num_new_blocks + reserve_blocks > pool.num_free:
            return False
        if num_new_blocks:
            req.block_ids.extend(pool.get_new_blocks(num_new_blocks))
        if self.enable_caching and not delay_cache:
            tokens_to_cache = num_computed + num_new_tokens
            if tokens_to_cache > req.num_tokens:
                tokens_to_cache = req.num_tokens  # draft tokens are never cached
            self.cache_blocks(req, tokens_to_cache)
        return True

    def cache_blocks(self, req: Request, num_computed_tokens: int) -> None:
        """Register the blocks full within ``num_computed_tokens`` whose key is known.

        vLLM 0.33 (coordinator.get_num_cacheable_tokens and the clamp in
        single_type_kv_cache_manager.cache_blocks): a block is cached once it is computed (less the
        re-prefillable tail of multi-module MTP) and its hash exists, i.e. the request's known
        tokens cover the block and its hash lookahead. Prompt lookahead tokens are known up front,
        so a prefill chunk caches its blocks as it computes them.
        """
        bs = self.block_size
        num_full = (num_computed_tokens - self.reprefillable) // bs
        hashed = (req.num_tokens - self.hash_lookahead) // bs
        if hashed < num_full:
            num_full = hashed
        start = req.num_cached_blocks
        if num_full > start:
            reg = self._registrable(req)
            if reg > num_full:
                reg = num_full
            if reg > start:
                self.pool.cache_full_blocks(req.block_ids[start:reg], req.keys.key_runs(start, reg, bs))
            req.num_cached_blocks = num_full

    def free(self, req: Request, preempted: bool = False) -> None:
        """Release a request's blocks, last block first, so its prefix head is evicted last.

        ``preempted``: the request will look its own blocks up when it resumes, so its private
        full blocks are registered now.
        """
        blocks = req.block_ids
        if blocks:
            n = req.num_cached_blocks
            reg = self._registrable(req)
            bs = self.block_size
            if reg < n and preempted and self.enable_caching:
                self.pool.cache_full_blocks(blocks[reg:n], req.keys.key_runs(reg, n, bs))
                reg = n
            if reg > n:
                reg = n
            # The registered prefix's keys as runs (prefix order; freed last block first): no key
            # list is made.
            runs = req.keys.key_runs(0, reg, bs) if reg else []
            blocks.reverse()
            # Eviction order: the never-full tail, the private blocks, then the registered prefix.
            self.pool.free_blocks(blocks, runs, len(blocks) - n, n - reg)
        req.block_ids = []
        req.num_cached_blocks = 0


def groups_read(runs: list[range], num_hits: int) -> set[int]:
    """The key groups (BlockKeys.key_group) of the keys a prefix walk over ``runs`` read: its
    ``num_hits`` hits and the first miss. Each run lies in one group, so this is one entry per run."""
    groups: set[int] = set()
    left = num_hits
    for rng in runs:
        n = len(rng)
        if n == 0:
            continue
        groups.add(key_group(rng.start))
        if left < n:  # the first miss is in this run
            break
        left -= n
    return groups

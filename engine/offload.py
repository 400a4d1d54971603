"""The G2 tier: vLLM's OffloadingConnector with a CPU LRU store (vLLM's v1/kv_offload/).

- Stores (D2H): at the end of each schedule(), every offload block of a scheduled request that is
  full after the step and not yet prepared is prepared (keys already on the CPU are skipped; the
  CPU LRU evicts from its front, never a block pinned by a load or still being written). The step's
  stores are one copy on the D2H lane, starting when the forward pass ends; a block is loadable only
  once its copy completes. A finished request's GPU blocks are freed when its stores complete.
- Loads (H2D): after the GPU prefix lookup, consecutive ready CPU blocks from the first GPU miss.
  A hit allocates GPU blocks and parks the request in WAITING_FOR_REMOTE_KVS (not counted in
  max_num_seqs) until the copy on the H2D lane completes; it is then scheduled as a prefill of the
  rest. A full hit still recomputes the last token.
- CPU key of an offload block = the key of its last GPU block (chained: it names the prefix).
- The CPU store (engine/cpu_store.py) holds only what it stores, as runs of keys (one per trace
  block): millions of configured blocks cost nothing up front, and a step's stores, evictions and
  lookups cost a few operations per trace block they touch, not per offload block.
- Tiers below G2 (``kv_cache.tiers``, engine/kv_tiers.py): the blocks offered to G2 go on to the
  write-through tiers, G2's evictions to an on-evict tier, and a lookup continues past the G2 hit
  through them. Without ``host_offload`` there is no G2 store: the GPU offers straight to the tiers.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from typing import Final

from replay.base.errors import ConfigError
from replay.engine.block_keys import key_group, runs_slice
from replay.engine.config import HostOffloadConfig
from replay.engine.cpu_store import RunLRUStore, runs_len
from replay.engine.key_lru_store import KeyLRUStore
from replay.engine.kv_cache_manager import KVCacheManager
from replay.engine.kv_tiers import TierChain
from replay.engine.request import Request

# get_num_new_matched_tokens: the lookup met a block whose copy is still in flight (vLLM's
# HIT_PENDING); the scheduler skips the request this step
LOOKUP_DEFERRED: Final = -1
_ANY_BATCH: Final = 1 << 62  # count_ready's bound that counts every held key, written or not


class OffloadManager:
    # The CPU store class: tests swap in KeyLRUStore (per key) to check the run store end to end.
    store_factory: type[RunLRUStore] | type[KeyLRUStore] = RunLRUStore

    def __init__(self, cfg: HostOffloadConfig | None, kv: KVCacheManager, kv_bytes_per_token: int,
                 lower: TierChain | None = None, prompt_only: bool = True) -> None:
        """``cfg`` None: no G2 store, only the tiers of ``lower`` (which then cannot be None).
        ``prompt_only``: stores stop at the prompt (vLLM's ``offload_prompt_only``, its default)."""
        gpu_bs = kv.block_size
        off_bs = (cfg.block_size if cfg is not None else None) or gpu_bs
        if off_bs % gpu_bs:
            raise ConfigError(f"host_offload.block_size {off_bs} must be a multiple of kv_cache.block_size {gpu_bs}")
        self.kv = kv
        self.block_size = off_bs
        self.lookahead = kv.hash_lookahead
        self.block_bytes = off_bs * kv_bytes_per_token
        self.lower = lower
        self.prompt_only = prompt_only
        self.has_host = cfg is not None
        self.has_curves = lower is not None and any(t.shadows for t in lower.tiers)
        if cfg is None:
            cfg = HostOffloadConfig.model_validate({"num_cpu_blocks": 1})  # its lanes are never used
            self.num_cpu_blocks = 0
        elif cfg.num_cpu_blocks is not None:
            self.num_cpu_blocks = int(cfg.num_cpu_blocks)
        else:
            size_gib = cfg.size_gib or 0.0  # the config requires one of the two
            self.num_cpu_blocks = int(size_gib * (1 << 30) // self.block_bytes)
        if self.has_host and self.num_cpu_blocks < 1:
            raise ConfigError(f"host_offload holds no block: size_gib {cfg.size_gib} < one block of "
                              f"{self.block_bytes} bytes")
        # Transfer time = latency + bytes / bandwidth (GB/s = 1e9 bytes/s), per direction, FIFO lanes.
        self.d2h_ms_per_byte = 1e3 / (cfg.d2h_gbps * 1e9)
        self.h2d_ms_per_byte = 1e3 / (cfg.h2d_gbps * 1e9)
        self.latency_ms = cfg.latency_us / 1e3
        # The store records the id of the store batch (one per step) that wrote each key; batch b's
        # copy completes at batch_done[b] (the D2H lane is FIFO, so completion times never decrease).
        self.store = self.store_factory(off_bs)
        if lower is not None and isinstance(self.store, RunLRUStore):
            self.store.evicted = []  # the first tier below may store on G2's evictions
        self.batch_done: list[float] = []
        self.version = 0  # bumped by every change to the store's contents or LRU order
        self.d2h_free_ms = 0.0
        self.h2d_free_ms = 0.0
        self._batch_size = 0  # blocks prepared in the current step
        self._batch_reqs: list[Request] = []
        self._deferred_free: list[tuple[float, int, Request]] = []
        self._loads: list[tuple[float, int]] = []  # (ready time, request idx) of loads in flight
        self.loading: dict[int, Request] = {}  # requests whose load is in flight or not yet taken up
        self.lookup_wait_ms = math.inf  # when a copy a deferred lookup waits for completes
        self._step_stored = 0
        self._step_loaded = 0
        self.total_stored_blocks = 0
        self.total_loaded_blocks = 0
        self.total_cpu_evictions = 0
        self.store_skipped_full = 0

    # -- stores --------------------------------------------------------------------------------
    def _runs(self, r: Request, m0: int, m1: int) -> list[range]:
        """CPU keys of offload blocks m0..m1-1 of ``r`` as runs: an offload block is named by the
        prefix its last GPU block ends, i.e. by a key at the offload block size. Cut from the runs
        of the request's last lookup when they reach m1 (a block's key never changes)."""
        memo = r.lookup_memo
        if memo is not None and memo[4] >= m1:
            looked_up: list[range] = memo[5]
            return runs_slice(looked_up, m0, m1)
        return r.keys.key_runs(m0, m1, self.block_size)

    def _first_unready_batch(self, now_ms: float) -> int:
        """Batches below this id have completed their copies by ``now_ms``."""
        return bisect_right(self.batch_done, now_ms)

    def copies_in_flight(self, now_ms: float) -> bool:
        """Whether a store's copy has not completed by ``now_ms`` (a lookup may meet it)."""
        return bool(self.batch_done) and self.batch_done[-1] > now_ms

    def prepare_stores(self, scheduled: list[Request], now_ms: float) -> None:
        store = self.store
        bs, la = self.block_size, self.lookahead
        capacity = self.num_cpu_blocks
        batch = len(self.batch_done)  # this step's batch id
        ready_below = -1
        prompt_only = self.prompt_only
        for r in scheduled:
            # vLLM's _calc_num_offloadable_tokens: this step's tokens, capped at the known tokens and,
            # with offload_prompt_only, at the prompt.
            known = r.num_prompt_tokens if prompt_only else r.num_prompt_tokens + r.num_output_tokens
            tokens = r.num_computed_tokens if r.num_computed_tokens < known else known
            full = (tokens - la) // bs
            m = r.num_stored_offload_blocks
            if full <= m:
                continue
            if ready_below < 0:
                ready_below = self._first_unready_batch(now_ms)
            runs = self._runs(r, m, full)
            lower = self.lower
            if lower is not None and not self.has_host:
                lower.offer(runs)
                r.num_stored_offload_blocks = full
                continue
            new, evicted = store.store(runs, batch, capacity, ready_below)
            if evicted is None:  # vLLM's prepare_store returns None: nothing stored, retried later
                self.store_skipped_full += new
                continue
            if lower is not None:
                # The chain below is written from host memory: blocks G2 refused reach it when a
                # later step's retry stores them, once.
                lower.offer(runs)
            self.total_cpu_evictions += evicted
            self.version += 1
            r.num_stored_offload_blocks = full
            if new:
                self._batch_size += new
                self._batch_reqs.append(r)

    def step_executed(self, start_ms: float, end_ms: float) -> None:
        """The forward pass ran from start to end: this step's stores start on the D2H lane."""
        n = self._batch_size
        if self.lower is not None:
            self._step_executed_tiers(end_ms)
        if not n:
            return
        nbytes = n * self.block_bytes
        begin = end_ms if end_ms > self.d2h_free_ms else self.d2h_free_ms
        done = begin + self.latency_ms + nbytes * self.d2h_ms_per_byte
        self.d2h_free_ms = done
        self.batch_done.append(done)
        for r in self._batch_reqs:
            if done > r.stores_done_ms:
                r.stores_done_ms = done
        self._step_stored += nbytes
        self.total_stored_blocks += n
        self._batch_size = 0
        self._batch_reqs = []

    def _step_executed_tiers(self, end_ms: float) -> None:
        """The step's offers leave for the tiers below when host memory has them: once the G2 copy
        completes (or at the step's end without G2); what G2 evicted goes to an on-evict tier."""
        lower = self.lower
        assert lower is not None
        begin = end_ms
        if self._batch_size:
            begin = max(end_ms, self.d2h_free_ms) + self.latency_ms + self._batch_size * self.block_bytes * \
                self.d2h_ms_per_byte
        lower.flush_offers(begin)
        store = self.store
        if isinstance(store, RunLRUStore) and store.evicted:
            evicted = store.evicted
            store.evicted = []
            lower.evicted_from_host(evicted, end_ms)

    def request_finished(self, r: Request, end_ms: float) -> None:
        r.lookup_memo = None
        if self.lower is not None:
            self.lower.forget(r.idx)
        if r.stores_done_ms > end_ms:
            heapq.heappush(self._deferred_free, (r.stores_done_ms, r.idx, r))
        else:
            self.kv.free(r)

    # -- loads ---------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, r: Request, num_local: int, now_ms: float) -> int:
        """CPU hit tokens beyond the ``num_local`` GPU hits (vLLM's OffloadingConnector).

        Touches every stored key of the request (prefix heads most recent), then counts
        consecutive complete CPU blocks from the first GPU miss; less than one offload block
        of gain loads nothing. LOOKUP_DEFERRED when the block after them is stored but its copy
        is still in flight (vLLM's HIT_PENDING): the scheduler then skips the request this step.
        """
        bs = self.block_size
        known = r.num_tokens
        num_blocks = (known - self.lookahead) // bs
        if num_blocks <= 0:
            return 0
        store = self.store
        memo = r.lookup_memo
        ready_below = self._first_unready_batch(now_ms)
        start = num_local // bs
        # A blocked queue head is looked up at every step: its key runs are kept with the memo.
        if memo is not None and memo[4] == num_blocks:
            runs, groups = memo[5], memo[6]
        else:
            runs = self._runs(r, 0, num_blocks)
            groups = [key_group(run.start) for run in runs]
        if memo is not None and memo[0] == self.version and memo[4] == num_blocks:
            # Nothing touched the store since this request's own last lookup: its keys are still the
            # LRU tail in touch order (touching again changes nothing), and the hit count only needs
            # recomputing if more copies completed.
            if memo[1] == ready_below and memo[2] == start:
                hits = memo[3]
                pending = memo[7]
            else:
                hits = store.count_ready(runs, start, ready_below)
                pending = self._copy_pending(runs, start + hits, num_blocks)
        else:
            store.touch(runs, groups)
            self.version += 1
            hits = store.count_ready(runs, start, ready_below)
            pending = self._copy_pending(runs, start + hits, num_blocks)
        r.lookup_memo = (self.version, ready_below, start, hits, num_blocks, runs, groups, pending)
        r.load_keys = []
        if pending:
            # vLLM 0.33: the block after the ready hits is stored but its copy has not completed
            # (HIT_PENDING), so _maximal_prefix_lookup returns None and the scheduler skips the
            # request this step; it is looked up again at the next one. An idle replica wakes when
            # the earliest copy in flight completes.
            if ready_below < len(self.batch_done) and self.batch_done[ready_below] < self.lookup_wait_ms:
                self.lookup_wait_ms = self.batch_done[ready_below]
            return LOOKUP_DEFERRED
        end = start + hits
        if self.lower is not None and end < num_blocks:
            self.lower.apply(now_ms)
            end = self.lower.lookup(r.idx, runs, end, num_blocks)
        if num_blocks * bs - num_local < bs or end == start:
            return 0
        ext = end * bs - num_local
        if ext < bs:
            return 0  # less than one offload block to gain: not worth a load (vLLM)
        if num_local + ext >= known:
            ext = known - 1 - num_local  # a full hit recomputes the last token
        r.load_keys = runs_slice(runs, start, start + hits)
        return ext

    def _copy_pending(self, runs: list[range], pos: int, num_blocks: int) -> bool:
        """Whether the key at offload block ``pos`` (the first not ready) is stored, its copy in flight."""
        return pos < num_blocks and self.store.count_ready(runs, pos, _ANY_BATCH) > 0

    def start_load(self, r: Request, num_local: int, num_external: int, now_ms: float) -> None:
        done = now_ms
        if r.load_keys:  # always, without tiers below G2
            self.store.pin(r.load_keys)
            n = runs_len(r.load_keys)
            nbytes = n * self.block_bytes
            begin = now_ms if now_ms > self.h2d_free_ms else self.h2d_free_ms
            done = begin + self.latency_ms + nbytes * self.h2d_ms_per_byte
            self.h2d_free_ms = done
            self._step_loaded += nbytes
            self.total_loaded_blocks += n
        if self.lower is not None:
            t, parts = self.lower.start_load(r.idx, now_ms)
            r.tier_loads = parts
            if t > done:
                done = t
            if r.tier_hit_tokens is None and r.num_preemptions == 0:  # hits per tier at first admission
                r.tier_hit_tokens = self.lower.count_hits(runs_len(r.load_keys) if self.has_host else None, parts,
                                                          num_local, num_external, self.block_size)
        r.load_ready_ms = done
        heapq.heappush(self._loads, (done, r.idx))
        self.loading[r.idx] = r

    def start_cluster_read(self, r: Request, num_local: int, now_ms: float) -> tuple[int, int, float]:
        """A decode replica's P/D request (``num_local`` prompt tokens hit in its GPU cache) loads
        the whole prompt blocks the cluster-scope tiers hold from there on, over this replica's
        links to them (``fleet.kv_transfer.decode_source: cluster_tier``). Returns (tokens, bytes)
        taken from the tiers, and when they have landed; the rest comes over the P->D link."""
        lower = self.lower
        bs = self.block_size
        num_blocks = r.num_prompt_tokens // bs
        start = num_local // bs
        if lower is None or start >= num_blocks:
            return 0, 0, now_ms
        lower.apply(now_ms)
        parts = lower.walk(self._runs(r, 0, num_blocks), start, num_blocks, cluster_only=True)
        if not parts:
            return 0, 0, now_ms
        blocks = sum([p.blocks for p in parts])
        done = lower.send(parts, now_ms)
        r.tier_loads = parts
        heapq.heappush(self._loads, (done, r.idx))  # the replica wakes when the last part lands
        return (start + blocks) * bs - num_local, blocks * self.block_bytes, done

    def peek_tier_hits(self, r: Request, num_local: int, now_ms: float) -> dict[str, int]:
        """Hit tokens per tier (G2 as ``host`` first, when present) a lookup of ``r`` would find now
        after ``num_local`` GPU hit tokens, in whole offload blocks; for routers (ReplicaView), so
        it changes nothing but letting completed tier writes in."""
        bs = self.block_size
        num_blocks = (r.num_prompt_tokens + r.num_output_tokens - self.lookahead) // bs
        start = num_local // bs
        out: dict[str, int] = {}
        runs = self._runs(r, 0, num_blocks) if num_blocks > start else []
        pos = start
        if self.has_host:
            h = self.store.count_ready(runs, start, self._first_unready_batch(now_ms)) if runs else 0
            out["host"] = h * bs
            pos += h
        lower = self.lower
        if lower is not None:
            blocks = [0] * len(lower.tiers)
            if runs and pos < num_blocks:
                lower.apply(now_ms)
                for p in lower.walk(runs, pos, num_blocks):
                    blocks[p.tier] += p.blocks
            for tier, n in zip(lower.tiers, blocks):
                out[tier.name] = n * bs
        return out

    def first_admission(self, r: Request) -> None:
        """The request's first admission used its last lookup: the tiers' size curves count it."""
        memo = r.lookup_memo
        lower = self.lower
        if memo is None or lower is None:
            return
        num_blocks, runs = memo[4], memo[5]
        pos = memo[2] + memo[3]  # past the GPU and G2 hits
        parts = lower.pending_parts(r.idx) if pos < num_blocks else []
        lower.admitted(runs, pos, num_blocks, parts)

    def reserved_blocks(self) -> int:
        """GPU blocks the requests loading still need for their whole known tokens (vLLM 0.33
        Scheduler._inflight_prefill_reserved_blocks, over the loads in flight: G2's and the tiers'
        alike; docs/kv-tiers.md, "Departures", says what of vLLM's set is left out)."""
        bs = self.kv.block_size
        n = 0
        for r in self.loading.values():
            need = -(-(r.num_prompt_tokens + r.num_output_tokens) // bs) - len(r.block_ids)
            if need > 0:
                n += need
        return n

    def finish_load(self, r: Request) -> None:
        self.loading.pop(r.idx, None)
        if r.load_keys:
            self.store.unpin(r.load_keys)
        r.load_keys = []
        if self.lower is not None and r.tier_loads:
            parts = r.tier_loads
            r.tier_loads = []
            self.lower.finish_load(parts, r.load_ready_ms)
            if self.has_host:
                self._promote(parts, r.load_ready_ms)

    def _promote(self, parts: list, now_ms: float) -> None:
        """Blocks loaded from tiers below G2 stay in G2 (they crossed host memory), as vLLM's
        tiering manager promotes them into the CPU tier; written, so ready at once."""
        store = self.store
        for p in parts:
            new, evicted = store.store(p.runs, -1, self.num_cpu_blocks, self._first_unready_batch(now_ms))
            if evicted is not None:
                self.total_cpu_evictions += evicted
                self.version += 1

    # -- clock ---------------------------------------------------------------------------------
    def advance(self, now_ms: float) -> None:
        """Free finished requests' GPU blocks whose stores have completed by ``now_ms``."""
        if self.lower is not None:
            self.lower.apply(now_ms)
        deferred = self._deferred_free
        while deferred and deferred[0][0] <= now_ms:
            _, _, r = heapq.heappop(deferred)
            self.kv.free(r)
        loads = self._loads
        while loads and loads[0][0] <= now_ms:
            heapq.heappop(loads)
        if self.lookup_wait_ms <= now_ms:
            self.lookup_wait_ms = math.inf

    def next_event_ms(self) -> float:
        t = self._deferred_free[0][0] if self._deferred_free else math.inf
        if self._loads and self._loads[0][0] < t:
            t = self._loads[0][0]
        if self.lookup_wait_ms < t:
            t = self.lookup_wait_ms
        if self.lower is not None:
            landing = self.lower.next_event_ms()
            if landing < t:
                t = landing
        return t

    def step_stats(self) -> tuple[int, int, int, float]:
        stored, loaded = self._step_stored, self._step_loaded
        self._step_stored = self._step_loaded = 0
        used = len(self.store)
        return stored, loaded, used, used / self.num_cpu_blocks if self.num_cpu_blocks else 0.0

    def release(self) -> None:
        """Empty the G2 store and the tiers below for good once the replay's outputs are written,
        so that reference counting, not the cyclic collector, frees them (RunLRUStore.release)."""
        if isinstance(self.store, RunLRUStore):
            self.store.release()
        if self.lower is not None:
            self.lower.release()

    def requests_holding_blocks(self) -> list[Request]:
        """Finished requests whose GPU blocks wait for their stores (debug checks)."""
        return [r for _, _, r in self._deferred_free]

    def totals(self) -> dict[str, int]:
        return {
            "num_cpu_blocks": self.num_cpu_blocks,
            "cpu_blocks_stored": self.total_stored_blocks,
            "cpu_blocks_loaded": self.total_loaded_blocks,
            "cpu_evictions": self.total_cpu_evictions,
            "bytes_stored": self.total_stored_blocks * self.block_bytes,
            "bytes_loaded": self.total_loaded_blocks * self.block_bytes,
            "cpu_store_skipped_full": self.store_skipped_full,
        }

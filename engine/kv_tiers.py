"""KV cache tiers below the G2 host tier: local disk, remote pools, cluster-shared stores.

``host_offload`` (engine/offload.py) is the first tier of the chain; the tiers here follow it in
``kv_cache.tiers`` order (without host_offload the GPU's stores go straight to them). Each tier is
an LRU store of offload blocks (engine/cpu_store.py's run store, one key per offload block, the key
of the prefix it ends) behind read and write links (engine/kv_links.py). A ``cluster``-scope tier
is one ``KVTier`` object that every replica's chain holds: what one replica writes, another reads.

Rules (docs/kv-tiers.md says why; LMCache, Dynamo KVBM and vLLM's tiering manager do the same):
- Stores: a ``write_through`` tier receives every block the GPU offers to the chain (after the G2
  copy completes, when there is a G2 tier); an ``on_evict`` tier receives the blocks the tier above
  it evicts. A write spends the tier's write link(s); blocks the tier already holds are not sent.
  The blocks become visible to lookups when the write completes; a write that finds no room (every
  block pinned by loads) is dropped. Stores never hold a GPU block or stall a step.
- Lookups: after the GPU and G2 hits, consecutive blocks are taken from the first tier (in chain
  order) holding the next block, tier after tier, until no tier holds it (hits may span tiers).
  Lookups do not touch the LRU; loads do.
- Loads: asynchronous, as vLLM's connector load path: the request holds its GPU blocks and waits;
  each tier's part crosses that tier's read links; the request is ready when the last part lands.
  Loaded blocks are pinned in their tier until then, touched at the end, and promoted into the host
  tiers above their source (G2 included): the bytes pass through host memory on their way.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from replay.base.errors import ConfigError
from replay.engine.block_keys import runs_slice
from replay.engine.cpu_store import RunLRUStore, runs_len
from replay.engine.kv_links import Link, transfer
from replay.engine.kv_tier_config import KVTierConfig


class KVTier:
    """One tier's store, pending writes and counters. Replica scope: one object per replica;
    cluster scope: one object for the whole fleet."""

    def __init__(self, cfg: KVTierConfig, block_size: int, block_bytes: int) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.block_bytes = block_bytes
        if cfg.num_blocks is not None:
            self.capacity = int(cfg.num_blocks)
        else:
            self.capacity = int((cfg.size_gb or 0.0) * 1e9 // block_bytes)
            if self.capacity < 1:
                raise ConfigError(f"kv_cache.tiers.{cfg.name}.size_gb: {cfg.size_gb} GB holds no block of "
                                  f"{block_bytes} bytes")
        self.latency_ms = cfg.latency_ms
        self.store = RunLRUStore(block_size)
        self.pending: list[tuple[float, int, list[range]]] = []  # (write done, seq, key runs)
        self._seq = 0
        self.version = 0  # bumps at every change of the store's contents
        # A cluster tier is changed by every replica: writes enter it no later than the fleet's
        # clock, so a replica running a decode window ahead of the others cannot make a write
        # visible to them early (the fleet sets this; None: the caller's time is the clock).
        self.clock: Callable[[], float] | None = None
        self.below: KVTier | None = None  # the next tier, when it stores on this tier's evictions
        self.evict_links: list[Link] = []  # the links those evictions are written over
        self.pool_read: Link | None = None
        self.pool_write: Link | None = None
        if cfg.scope == "cluster":
            if cfg.pool_read_gb_per_s is not None:
                self.pool_read = Link(f"{cfg.name}.pool_read", cfg.pool_read_gb_per_s)
            if cfg.pool_write_gb_per_s is not None:
                self.pool_write = Link(f"{cfg.name}.pool_write", cfg.pool_write_gb_per_s)
        # size_curve: shadow stores of other sizes that see the same writes and loads, and the
        # blocks they would have given the lookups that reached this tier.
        self.shadows = [RunLRUStore(block_size) for _ in cfg.size_curve]
        self.shadow_hit_blocks = [0] * len(cfg.size_curve)
        self.hit_tokens = 0
        self.blocks_read = 0
        self.blocks_written = 0
        self.evictions = 0
        self.writes_dropped = 0  # blocks whose write found no room

    # -- stores --------------------------------------------------------------------------------
    def write(self, runs: list[range], begin_ms: float, links: list[Link]) -> None:
        """Send the blocks of ``runs`` this tier does not hold over ``links`` from ``begin_ms``."""
        new = runs_len(runs) - self.store.num_held(runs)
        if new <= 0:
            return
        done = transfer(links, begin_ms, new * self.block_bytes, self.latency_ms)
        self._seq += 1
        heapq.heappush(self.pending, (done, self._seq, runs))
        self.blocks_written += new

    def apply(self, now_ms: float) -> None:
        """Writes completed by ``now_ms`` enter the store (evicting its least recent blocks)."""
        clock = self.clock
        if clock is not None:
            t = clock()
            if t < now_ms:
                now_ms = t
        pending = self.pending
        while pending and pending[0][0] <= now_ms:
            done, _, runs = heapq.heappop(pending)
            self.insert(runs, done)

    def insert(self, runs: list[range], now_ms: float) -> None:
        for shadow, size in zip(self.shadows, self.cfg.size_curve):
            shadow.store(runs, 0, size, 1)
        new, evicted = self.store.store(runs, 0, self.capacity, 1)
        if evicted is None:
            self.writes_dropped += new
            return
        self.version += 1
        self.evictions += evicted
        out = self.store.evicted
        if out:
            self.store.evicted = []
            below = self.below
            if below is not None:
                below.write(out, now_ms, self.evict_links)

    def release(self) -> None:
        """Empty the store and its size-curve shadows for good (RunLRUStore.release says why)."""
        self.store.release()
        for shadow in self.shadows:
            shadow.release()
        self.pending = []

    # -- loads ---------------------------------------------------------------------------------
    def count(self, runs: list[range], start: int) -> int:
        return self.store.count_ready(runs, start, 1)

    def touch(self, runs: list[range]) -> None:
        self.store.touch(runs)
        for shadow in self.shadows:
            shadow.touch(runs)
        self.version += 1

    def reference(self, runs: list[range], start: int, num_blocks: int) -> None:
        """A request's lookup reached this tier at offload block ``start``: what each shadow size
        would have given it."""
        hits = self.shadow_hit_blocks
        for i, shadow in enumerate(self.shadows):
            hits[i] += min(shadow.count_ready(runs, start, 1), num_blocks - start)


class TierLinks:
    """One replica's read and write links to one tier."""

    __slots__ = ("read", "write")

    def __init__(self, read: list[Link], write: list[Link]) -> None:
        self.read = read
        self.write = write


class TierPools:
    """The fleet's tier objects and links: cluster tiers and per-node disk links built once,
    replica tiers per replica (``chain_for``)."""

    def __init__(self, tiers: list[KVTierConfig], block_size: int, block_bytes: int) -> None:
        self.configs = tiers
        self.block_size = block_size
        self.block_bytes = block_bytes
        self.cluster: dict[str, KVTier] = {t.name: KVTier(t, block_size, block_bytes)
                                           for t in tiers if t.scope == "cluster"}
        self.node_links: dict[tuple[str, int], TierLinks] = {}
        self.chains: list[TierChain] = []

    def set_clock(self, clock: Callable[[], float]) -> None:
        """The fleet's clock, which bounds when writes enter the cluster tiers."""
        for tier in self.cluster.values():
            tier.clock = clock

    def _links(self, cfg: KVTierConfig, tier: KVTier, replica: int) -> TierLinks:
        if cfg.medium == "disk" and cfg.scope == "replica":
            key = (cfg.name, replica // cfg.replicas_per_node)
            links = self.node_links.get(key)
            if links is None:
                links = self.node_links[key] = TierLinks(
                    [Link(f"{cfg.name}.node{key[1]}.read", cfg.read_gb_per_s)],
                    [Link(f"{cfg.name}.node{key[1]}.write", cfg.write_gb_per_s)])
            return links
        read = [Link(f"{cfg.name}.r{replica}.read", cfg.read_gb_per_s)]
        write = [Link(f"{cfg.name}.r{replica}.write", cfg.write_gb_per_s)]
        if tier.pool_read is not None:
            read.append(tier.pool_read)
        if tier.pool_write is not None:
            write.append(tier.pool_write)
        return TierLinks(read, write)

    def chain_for(self, replica: int) -> TierChain:
        tiers: list[KVTier] = []
        links: list[TierLinks] = []
        for cfg in self.configs:
            tier = self.cluster.get(cfg.name) or KVTier(cfg, self.block_size, self.block_bytes)
            tiers.append(tier)
            links.append(self._links(cfg, tier, replica))
        for i in range(len(tiers) - 1):
            upper, lower = tiers[i], tiers[i + 1]
            if lower.cfg.store == "on_evict":
                upper.below = lower
                upper.store.evicted = []  # the store now reports what it evicts
                # A cluster tier's evictions move inside the pool (its aggregate link); a replica
                # tier's over this replica's link to the tier below.
                upper.evict_links = ([lower.pool_write] if lower.pool_write is not None else []) \
                    if upper.cfg.scope == "cluster" else links[i + 1].write
        chain = TierChain(tiers, links)
        self.chains.append(chain)
        return chain

    def unique_tiers(self) -> list[list[KVTier]]:
        """Per configured tier, its distinct objects (one for a cluster tier, one per replica else)."""
        out: list[list[KVTier]] = []
        for i, cfg in enumerate(self.configs):
            if cfg.scope == "cluster":
                out.append([self.cluster[cfg.name]])
            else:
                out.append([c.tiers[i] for c in self.chains])
        return out

    def links_of(self, i: int) -> list[Link]:
        """Distinct links of configured tier ``i`` (for utilization)."""
        seen: dict[int, Link] = {}
        for c in self.chains:
            for link in c.links[i].read + c.links[i].write:
                seen.setdefault(id(link), link)
        return list(seen.values())


class TierLoad:
    """One part of a request's load: ``runs`` from tier ``tier`` (its index in the chain)."""

    __slots__ = ("tier", "runs", "blocks")

    def __init__(self, tier: int, runs: list[range]) -> None:
        self.tier = tier
        self.runs = runs
        self.blocks = runs_len(runs)


class TierChain:
    """One replica's tiers below G2, in lookup order (engine/offload.py drives it)."""

    def __init__(self, tiers: list[KVTier], links: list[TierLinks]) -> None:
        self.tiers = tiers
        self.links = links
        self._offers: list[list[range]] = []  # this step's blocks offered to write-through tiers
        self._loads: dict[int, list[TierLoad]] = {}  # request idx -> parts found by its last lookup
        self._memo: dict[int, tuple[tuple[int, ...], int, int, list[TierLoad]]] = {}
        self.write_through = [i for i, t in enumerate(tiers) if t.cfg.store == "write_through"]
        self.host_tiers = [i for i, t in enumerate(tiers) if t.cfg.medium == "host"]
        # Tiers whose evictions are written to a cluster tier: their writes landing are events.
        self.cluster_feeders = [t for t in tiers if t.below is not None and t.below.cfg.scope == "cluster"]

    def apply(self, now_ms: float) -> None:
        for tier in self.tiers:
            if tier.pending and tier.pending[0][0] <= now_ms:
                tier.apply(now_ms)

    def next_event_ms(self) -> float:
        """When the next write lands in a tier whose evictions go to a cluster tier. Landing, it
        evicts, and those writes queue on the cluster's shared link in the order replicas issue
        them, which other replicas' transfers then wait behind: the replica must act at that
        instant (a decode window must not carry it to the window's end), or the order, and what
        every replica sees of the pool, would depend on how its steps were grouped."""
        t = math.inf
        for tier in self.cluster_feeders:
            if tier.pending and tier.pending[0][0] < t:
                t = tier.pending[0][0]
        return t

    def release(self) -> None:
        """Empty this replica's tiers for good (a cluster tier too: releasing it twice is harmless)."""
        for tier in self.tiers:
            tier.release()

    # -- stores --------------------------------------------------------------------------------
    def offer(self, runs: list[range]) -> None:
        self._offers.append(runs)

    def flush_offers(self, begin_ms: float) -> None:
        """The step's offered blocks leave for the write-through tiers at ``begin_ms`` (when the
        GPU copy, or the G2 copy, has them in host memory)."""
        offers = self._offers
        if not offers:
            return
        self._offers = []
        # One write per request, as G2 stores per request: two requests of one step may offer the
        # same prefix, and one store call must never name a key twice.
        for i in self.write_through:
            tier, links = self.tiers[i], self.links[i].write
            for runs in offers:
                tier.write(runs, begin_ms, links)

    def evicted_from_host(self, runs: list[range], now_ms: float) -> None:
        """G2 evicted ``runs``: the first tier takes them when it stores on evictions."""
        if self.tiers and self.tiers[0].cfg.store == "on_evict":
            self.tiers[0].write(runs, now_ms, self.links[0].write)

    # -- lookups and loads ---------------------------------------------------------------------
    def lookup(self, idx: int, runs: list[range], start: int, num_blocks: int) -> int:
        """Extend a hit that ends at offload block ``start`` through the tiers; returns where it
        ends. The parts are kept for ``start_load``. Repeated lookups of a blocked queue head reuse
        the last answer while no tier changed."""
        tiers = self.tiers
        versions = tuple([t.version for t in tiers])
        memo = self._memo.get(idx)
        if memo is not None and memo[0] == versions and memo[1] == start and memo[2] == num_blocks:
            parts = memo[3]
        else:
            parts = self.walk(runs, start, num_blocks)
            self._memo[idx] = (versions, start, num_blocks, parts)
        self._loads[idx] = parts
        return start + sum([p.blocks for p in parts])

    def walk(self, runs: list[range], start: int, num_blocks: int, cluster_only: bool = False) -> list[TierLoad]:
        """The parts a hit from offload block ``start`` takes from the tiers (changes nothing);
        ``cluster_only``: from the cluster-scope tiers alone (a decode replica's P/D read)."""
        parts: list[TierLoad] = []
        pos = start
        progress = True
        while progress and pos < num_blocks:
            progress = False
            for i, tier in enumerate(self.tiers):
                if cluster_only and tier.cfg.scope != "cluster":
                    continue
                n = tier.count(runs, pos)
                if n:
                    parts.append(TierLoad(i, runs_slice(runs, pos, pos + n)))
                    pos += n
                    progress = True
                    if pos >= num_blocks:
                        break
        return parts

    def start_load(self, idx: int, now_ms: float) -> tuple[float, list[TierLoad]]:
        """Pin and send the parts of ``idx``'s last lookup; returns (completion, parts)."""
        parts = self._loads.pop(idx, [])
        return self.send(parts, now_ms), parts

    def send(self, parts: list[TierLoad], now_ms: float) -> float:
        """Pin ``parts`` in their tiers and issue their reads; returns when the last has landed."""
        done = now_ms
        for p in parts:
            tier = self.tiers[p.tier]
            tier.store.pin(p.runs)
            t = transfer(self.links[p.tier].read, now_ms, p.blocks * tier.block_bytes, tier.latency_ms)
            tier.blocks_read += p.blocks
            if t > done:
                done = t
        return done

    def finish_load(self, parts: list[TierLoad], now_ms: float) -> None:
        """Unpin, touch (a load is an access) and promote into the host tiers above each source."""
        for p in parts:
            tier = self.tiers[p.tier]
            tier.store.unpin(p.runs)
            tier.touch(p.runs)
            for i in self.host_tiers:
                if i < p.tier:
                    self.tiers[i].insert(p.runs, now_ms)

    def pending_parts(self, idx: int) -> list[TierLoad]:
        return self._loads.get(idx, [])

    def admitted(self, runs: list[range], start: int, num_blocks: int, parts: list[TierLoad]) -> None:
        """A request's first admission looked up ``runs`` from offload block ``start`` and took
        ``parts``: each tier with a size curve is referenced where the walk reached it (its first
        part, else where the walk stopped)."""
        end = start + sum([p.blocks for p in parts])
        for i, tier in enumerate(self.tiers):
            if not tier.shadows:
                continue
            pos = end
            at = start
            for p in parts:
                if p.tier == i:
                    pos = at
                    break
                at += p.blocks
            tier.reference(runs, pos, num_blocks)

    def count_hits(self, host_blocks: int | None, parts: list[TierLoad], num_local: int, num_external: int,
                   block_size: int) -> list[int]:
        """A request's first admission took ``parts`` (and ``host_blocks`` offload blocks from G2,
        None without G2): its hit tokens per tier (G2 first when present, ``hit_tokens_per_tier``),
        counted on each tier below."""
        off = 0 if host_blocks is None else 1
        loaded = ([] if host_blocks is None else [host_blocks * block_size]) + [0] * len(self.tiers)
        for p in parts:
            loaded[off + p.tier] += p.blocks * block_size
        tokens = hit_tokens_per_tier(loaded, num_local, num_external, block_size)
        for i, tier in enumerate(self.tiers):
            tier.hit_tokens += tokens[off + i]
        return tokens

    def forget(self, idx: int) -> None:
        self._memo.pop(idx, None)
        self._loads.pop(idx, None)


def hit_tokens_per_tier(loaded: list[int], num_local: int, num_external: int, block_size: int) -> list[int]:
    """The tokens a request's first admission took from each tier (chain order, G2 first when
    present), given the tokens of whole offload blocks each ``loaded``: less the GPU hit's share of
    the first offload block (``num_local`` past a block boundary), taken from the first tier with a
    hit, and less what ``num_external`` leaves out (the recomputed last token of a full hit), taken
    from the last tiers first."""
    tokens = list(loaded)
    extra = sum(tokens) - num_external
    align = num_local - (num_local // block_size) * block_size
    for i in range(len(tokens)):  # the GPU's share: from the first tier with a hit
        if tokens[i]:
            cut = min(align, tokens[i])
            tokens[i] -= cut
            extra -= cut
            break
    for i in range(len(tokens) - 1, -1, -1):  # the recomputed last token: from the last
        if extra <= 0:
            break
        cut = min(extra, tokens[i])
        tokens[i] -= cut
        extra -= cut
    return tokens

"""What a router may read of one replica: a narrow, read-only view (docs/fleet.md, "Writing a router").

The fleet builds one ``ReplicaView`` per replica when it starts (engine/fleet.py) and hands the
list to every routing call; each answer is read from the replica at that instant (the routing
instant, see engine/fleet.py's module doc), never cached by the view. A router reads nothing else of
a replica: not its scheduler, its KV cache manager or its block pool. The view holds the replica in
private slots and offers no attribute or method that returns an engine object, so the engine's
internals can change without touching a router, and a router cannot change a replica's state.

Answers:
- ``replica``: the replica's id (steady for its lifetime; an autoscaled fleet may give a retired
  replica's id to a new, cold one, and tells routers so through ``Router.replica_started``).
- ``num_waiting``: requests routed here and not running yet: the scheduler's waiting queue
  (preempted requests included) plus those still on their way (router latency).
- ``num_running``: requests in the scheduler's running batch.
- ``num_free_blocks`` / ``num_usable_blocks``: free and usable GPU KV blocks (vLLM's null block
  excluded); a free block may still hold a cached prefix (vLLM evicts lazily).
- ``kv_usage()``: 1 - free / usable, vLLM's kv_cache_usage (what its stats publish).
- ``waiting_prompt_tokens()``: prompt tokens still to prefill of the waiting requests.
- ``prefix_hit_blocks(runs)``: how many leading blocks of ``runs`` (a request's block keys, as
  ``BlockKeys.key_runs`` gives them) the replica's GPU prefix cache holds now: the blocks a request
  with those keys would find cached if it were scheduled here at once (vLLM additionally recomputes
  the last token, so a full hit on the whole prompt gives back one block; that is the engine's
  business, not the router's). ``prefix_hit_blocks_of(views, runs)`` asks every view at once;
  ``ViewsAsked`` (``Router.views_asked``) does so for a list a router asks again and again.

- ``tier_hit_tokens(req, gpu_hit_tokens, now_ms)``: per KV tier after the GPU (G2 as ``host`` first, then
  ``kv_cache.tiers``), the tokens a lookup of ``req`` would take from it now, continuing a GPU hit of
  ``gpu_hit_tokens`` (docs/kv-tiers.md); empty without tiers. What Dynamo's router learns from the
  tiers' KV events.

Every other block answer is about the GPU tier (G1).
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from replay.engine.block_pool import cached_prefix_lens

if TYPE_CHECKING:
    from replay.engine.core import EngineCore
    from replay.engine.request import Request


class ReplicaView:
    """Read-only view of one replica for routers (see the module doc). Built once per fleet."""

    __slots__ = ("_core", "_pool", "_usable", "_id")

    def __init__(self, core: EngineCore, replica: int | None = None) -> None:
        """``replica``: the id routers know this replica by, when it is not the engine's fleet
        number (a disaggregated fleet numbers each pool's replicas from 0 for its own router)."""
        self._core = core
        self._id = core.replica if replica is None else replica
        self._pool = core.kv_pool
        self._usable = core.kv_pool.num_gpu_blocks - 1  # block 0 is vLLM's null block

    # Read through C-level getters (operator.attrgetter): no Python frame per read, as the routers
    # read every replica at every arrival.
    num_waiting = property(attrgetter("_core.num_waiting"), doc=(
        "Requests routed here, not running: waiting queue (preempted included) plus in flight."))
    num_running = property(attrgetter("_core.num_running"), doc="Requests in the running batch.")
    replica = property(attrgetter("_id"), doc=(
        "The replica's id: what a router keys its own per-replica state by (an autoscaled fleet hands "
        "routers only its live replicas, so a position in the list is not an id)."))

    @property
    def num_free_blocks(self) -> int:
        """Free GPU KV blocks (cached-but-free ones included: they are evicted when reused)."""
        return self._pool.get_num_free_blocks()

    @property
    def num_usable_blocks(self) -> int:
        """GPU KV blocks a request can hold (all but the null block); constant over the run."""
        return self._usable

    def kv_usage(self) -> float:
        """GPU KV cache usage in [0, 1]: 1 - free / usable (vLLM's kv_cache_usage)."""
        return self._core.kv_usage()

    def waiting_prompt_tokens(self) -> int:
        """Prompt tokens still to compute of the requests waiting here (queue and on their way):
        what admission control's predicted wait is made of. Walks the queue: read it per arrival
        only when a bound needs it."""
        core = self._core
        total = 0
        for r in core.sched.waiting:
            total += r.num_tokens - r.num_computed_tokens
        for e in core.inbox:
            total += e[3].num_tokens - e[3].num_computed_tokens
        return total

    def prefix_hit_blocks(self, runs: list[range]) -> int:
        """Leading blocks of ``runs`` (BlockKeys.key_runs order) held by this replica's GPU prefix
        cache now: a request with these keys would find that many blocks cached here."""
        return self._pool.cached_prefix_len(runs)

    def tier_hit_tokens(self, req: Request, gpu_hit_tokens: int, now_ms: float) -> dict[str, int]:
        """Per tier after the GPU, in chain order: tokens a lookup of ``req`` would load from it at
        ``now_ms`` (the routing instant)."""
        offload = self._core.offload
        if offload is None:
            return {}
        return offload.peek_tier_hits(req, gpu_hit_tokens, now_ms)

    def __repr__(self) -> str:
        return (f"ReplicaView(replica={self._core.replica}, waiting={self.num_waiting}, "
                f"running={self.num_running}, free_blocks={self.num_free_blocks}/{self._usable})")


def prefix_hit_blocks_of(replicas: list[ReplicaView], runs: list[range]) -> list[int]:
    """``prefix_hit_blocks(runs)`` of every replica in ``replicas``, in order: one compiled loop over
    their prefix caches, for a router that asks every replica at every arrival. Any other object with
    this interface (a test's stand-in) is asked through its method."""
    return ViewsAsked(replicas).prefix_hit_blocks(runs)


class ViewsAsked:
    """One list of views a router asks at every arrival, read once: the replicas' ids and their
    prefix caches. A router keeps one while ``is_for`` its list (a fixed fleet hands it the same list
    at every arrival), so an arrival's prefix lookups are one compiled call with nothing gathered."""

    __slots__ = ("views", "size", "ids", "_pools")

    def __init__(self, views: list[ReplicaView]) -> None:
        self.views = views
        self.size = len(views)
        self.ids = [view.replica for view in views]
        self._pools = [view._pool for view in views] if all(type(view) is ReplicaView for view in views) else None

    def is_for(self, views: list[ReplicaView]) -> bool:
        """Whether ``views`` is the list read: an autoscaled fleet replaces its list when a replica
        leaves and grows it in place when one joins (a view's replica and cache never change)."""
        return views is self.views and len(views) == self.size

    def prefix_hit_blocks(self, runs: list[range]) -> list[int]:
        """``prefix_hit_blocks(runs)`` of every view, in order."""
        if self._pools is not None:
            return cached_prefix_lens(self._pools, runs)
        return [view.prefix_hit_blocks(runs) for view in self.views]

"""The router interface: one small class per policy, as in Dynamo's and llm-d's routers.

A router sees an arriving request (its block keys, lengths, session) and the replicas as they are
at that instant, and names the replica that gets it. Routers that only look at the request (round
robin, random, session affinity) say so, which lets every replica fast-forward decode windows up to
the next arrival that is actually its own; for routers that read replica state, every replica's
window is brought to every arrival before ``route`` is called (the state they read must be the
state at that instant: engine/decode_window.py, ``OpenDecodeWindow``).

Writing a router: one small file in engine/routers/ with a ``Router`` subclass that sets ``name``
(and ``reads_replica_state = True`` if ``route`` reads a replica), implements ``route``, and
imports nothing of the engine but this module, engine/request.py (the ``Request`` record: block
keys, lengths, session, timestamps) and engine/replica_view.py (``ReplicaView``: the only thing a
router may read of a replica: queue lengths, KV usage, prefix hits). Then register its options
model in engine/router_options.py, its class in engine/routers/__init__.py and its name in
engine/fleet_config.py's ``RouterName``; tests/engine/test_router_imports.py fails if a router module imports
anything else of the engine. docs/fleet.md, "Writing a router", walks through an example.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from replay.engine.replica_view import ReplicaView, ViewsAsked
from replay.engine.request import Request
from replay.engine.spec_decode import splitmix64
from replay.engine.trace_input import TraceArrays

__all__ = ["Router", "RouterContext", "splitmix64"]  # splitmix64: a seeded 64-bit hash for routers


@dataclass
class RouterContext:
    """What every router may know before the run: the fleet's shape and the trace's request rows."""

    num_replicas: int
    block_size: int
    num_gpu_blocks: int
    seed: int
    trace: TraceArrays


class Router:
    name: ClassVar[str] = ""
    reads_replica_state: ClassVar[bool] = False  # True: the choice depends on replica state at arrival
    hears_first_tokens: ClassVar[bool] = False  # True: request_first_token is called (it costs a call each)
    # True: route() asks every replica's prefix cache (prefix_hit_blocks_of): the fleet keeps an index
    # of the replicas' cached trace blocks for it
    reads_prefix_caches = False
    # True: the choice is the best of costs each replica's own state gives (``quote``), chosen over
    # the whole fleet's costs (``choose``) and recorded on the chosen replica alone (``commit``). Such
    # a fleet's replicas can be replayed in step by several processes, each pricing its own replicas
    # (engine/lockstep.py); ``route`` is then quote, choose, commit (this class's).
    picks_by_cost: ClassVar[bool] = False
    # True: ``route`` may return None, the request going to replicas another process replays (a
    # fleet in step, engine/lockstep.py); such a router is asked even by a part of one replica.
    passes_some_requests = False

    def __init__(self, ctx: RouterContext, options) -> None:
        self.ctx = ctx
        self.options = options
        self.n = ctx.num_replicas
        # Ties are broken by a seeded draw (Dynamo and llm-d pick uniformly among equal scores).
        self.rng = random.Random(ctx.seed * 1_000_003 + 7919)
        self._asked: ViewsAsked | None = None  # the replica list the last arrival asked (views_asked)

    def route(self, req: Request, replicas: list[ReplicaView], now_ms: float) -> int:
        """The replica (index into ``replicas``) that gets ``req``, arriving at ``now_ms``.
        ``replicas`` are the live replicas, each view answering for the routing instant. In a fixed
        fleet it is every replica, in id order, at every call; in an autoscaled fleet
        (engine/fleet_scaling.py) replicas join and leave it, so a router keys the state it keeps
        per replica by ``view.replica`` (the id, below ``ctx.num_replicas``), not by position."""
        if not self.picks_by_cost:
            raise NotImplementedError
        quote = self.quote(req, replicas, now_ms)
        pos = self.choose(quote.costs)
        self.commit(req, replicas[pos].replica, quote, pos, now_ms)
        return pos

    def quote(self, req: Request, replicas: list[ReplicaView], now_ms: float):
        """``picks_by_cost`` routers: a record with ``costs``, one per replica of ``replicas``, each
        from that replica's state and what this router keeps of it alone."""
        raise NotImplementedError

    def choose(self, costs: list[float]) -> int:
        """``picks_by_cost`` routers: the position of the chosen cost, over every live replica's."""
        raise NotImplementedError

    def commit(self, req: Request, replica: int, quote, pos: int, now_ms: float) -> None:
        """``picks_by_cost`` routers: ``req`` goes to replica id ``replica``, at ``pos`` of ``quote``."""
        raise NotImplementedError

    def picks_a_minimum(self) -> bool:
        """``picks_by_cost`` routers: whether ``choose`` always picks one of the lowest costs (so a
        replica priced above another cannot be chosen)."""
        return False

    def request_finished(self, req: Request, replica: int) -> None:
        """The request left replica ``replica`` (an id; routers that track their own load forget it)."""

    def request_first_token(self, req: Request) -> None:
        """``req`` (a request this router routed, or one with the same trace row) produced its first
        token, wherever it ran; called only when ``hears_first_tokens`` (Dynamo: mark_prefill_completed)."""

    def replica_started(self, replica: int) -> None:
        """A new replica joined under id ``replica`` (an autoscaled fleet reuses a retired replica's
        id): an empty engine with a cold cache, so whatever the router remembers of that id is stale."""

    # -- prediction (lets decode windows run past arrivals that go elsewhere) ------------------------
    def static_targets(self, rows: np.ndarray) -> np.ndarray | None:
        """Targets of these trace rows if they depend on the rows alone (not on order or state)."""
        return None

    def next_open_offset(self, replica: int) -> int | None:
        """Round robin: how many open arrivals from now until this replica's next one, provided
        no closed-loop arrival comes in between; None when the router cannot say."""
        return None

    def views_asked(self, replicas: list[ReplicaView]) -> ViewsAsked:
        """``replicas``' ids and prefix caches, gathered once per list: a fixed fleet hands the same
        list at every arrival (ViewsAsked.is_for says when it is another or has grown)."""
        asked = self._asked
        if asked is None or not asked.is_for(replicas):
            asked = self._asked = ViewsAsked(replicas)
        return asked

    def _pick_min(self, costs: list[float]) -> int:
        """Lowest cost; equal costs broken by a seeded uniform draw."""
        best = min(costs)
        if costs.count(best) == 1:  # the common case, without a Python loop (this runs per arrival)
            return costs.index(best)
        ties = [i for i, c in enumerate(costs) if c == best]
        return ties[self.rng.randrange(len(ties))]

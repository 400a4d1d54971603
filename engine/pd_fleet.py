"""A disaggregated fleet: the fleet loop with a prefill pool and a decode pool (docs/disagg.md).

The same loop, clock and replicas as any fleet (engine/fleet.py); prefill replicas are numbered
first, decode replicas after them. What differs is the path of a request, as vLLM's P/D proxy and
NixlConnector take it (vLLM 0.33: the toy proxy of tests/v1/kv_connector/nixl_integration,
nixl/pull_scheduler.py, v1/core/sched/scheduler.py):

1. At arrival the decode router (``fleet.router``, over decode replicas) picks the decode replica;
   the request is prefilled there itself when the conditional-disaggregation rule says so (uncached
   prompt at most ``local_prefill_max_tokens``, or more than ``prefill_queue_max`` requests waiting
   for prefill: Dynamo's disaggregated router). Otherwise the prefill router picks a prefill replica.
2. The prefill replica runs the request with ``max_tokens = 1`` (the proxy's request): its own
   prefix cache, chunked prefill, preemption. When its step samples the token the request finishes
   (the token is discarded); its blocks stay held (vLLM ``delay_free_blocks``).
3. At that instant the proxy sends the request to the decode replica (``do_remote_prefill``). Its
   scheduler admits it like a prefix hit: local prefix hit, then the rest of the prompt as an
   asynchronous load: blocks for the whole prompt allocated, the request parked in
   WAITING_FOR_REMOTE_KVS (no token budget, not in max_num_seqs) and the read started.
4. The read moves over the prefill replica's egress and the decode replica's ingress, shared
   fairly with other reads (engine/kv_transfer.py). When it completes, the prefill replica frees
   the blocks, and the decode replica's next schedule takes the request with the last prompt token
   still to compute: that 1-token step samples the client's first token.
"""

from __future__ import annotations

import math
from bisect import insort
from functools import partial

from replay.engine.arrivals import ArrivalPlan
from replay.engine.core import OPEN, EngineCore
from replay.engine.fleet import FleetLoop, ProgressFn
from replay.engine.kv_transfer import Transfer, TransferNetwork
from replay.engine.pd_outputs import PDRequestColumns
from replay.engine.recorder import Recorder
from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request
from replay.engine.routers.base import Router
from replay.engine.trace_input import TraceArrays


class PDFleetLoop(FleetLoop):
    # Decode windows end at every arrival: the P/D proxy moves requests and KV between the pools at
    # instants of its own (transfer events), which open windows are not brought to.
    windows_stay_open = False

    def __init__(self, trace: TraceArrays, plan: ArrivalPlan, prefill_cores: list[EngineCore],
                 decode_cores: list[EngineCore], decode_router: Router | None, prefill_router: Router | None,
                 recorder: Recorder, columns: PDRequestColumns, network: TransferNetwork, *,
                 block_size: int, hash_lookahead: int, rejected: dict[int, str], transfer_bytes_per_token: int,
                 transfer_full_prompt: bool, local_prefill_max_tokens: int | None, prefill_queue_max: int | None,
                 router_latency_ms: float = 0.0, progress: ProgressFn | None = None,
                 live_prefill: int | None = None, live_decode: int | None = None,
                 reads_cluster_tier: bool = False) -> None:
        """``prefill_cores``, ``decode_cores``: one engine per fleet slot of each pool; an autoscaled
        pool (engine/pd_scaling.py) has more slots than replicas at the start, and only the first
        ``live_prefill`` / ``live_decode`` serve then (the rest are empty engines a joining replica
        replaces)."""
        self.num_prefill = len(prefill_cores)
        self.prefill_cores = prefill_cores
        self.decode_cores = decode_cores
        super().__init__(trace, plan, prefill_cores + decode_cores, decode_router, recorder, block_size=block_size,
                         hash_lookahead=hash_lookahead, rejected=rejected, router_latency_ms=router_latency_ms,
                         progress=progress)
        self.prefill_router = prefill_router
        self.hear_first_tokens(prefill_router)
        # The replicas each pool's router may choose from, known by their number within the pool.
        self.prefill_views = self.views[:self.num_prefill if live_prefill is None else live_prefill]
        self.decode_views = [ReplicaView(c, replica=i) for i, c in
                             enumerate(decode_cores[:len(decode_cores) if live_decode is None else live_decode])]
        self.pool_controls: list = []  # an autoscaled pool's controller (engine/pd_scaling.py), by event row
        self.columns = columns
        self.network = network
        self.bytes_per_token = transfer_bytes_per_token
        self.full_prompt = transfer_full_prompt
        self.local_prefill_max_tokens = local_prefill_max_tokens
        self.prefill_queue_max = prefill_queue_max
        # Window bounds valid on both pools (they may run different hardware and MTP settings).
        timers = [c.timer for c in self.cores]
        self._min_step_ms = min(t.min_step_ms() if hasattr(t, "min_step_ms") else 0.0 for t in timers)
        self._tokens_per_step = 1 + max(c.spec_k for c in self.cores)
        for core in prefill_cores:
            core.emits_tokens = False  # the proxy discards the prefill replica's token
            core.ff_ok = False  # it never decodes: every request there has max_tokens = 1
        for core in decode_cores:
            core.sched.start_remote_load = partial(self._start_read, core)
        self._decode_of: dict[int, int] = {}  # trace row -> its decode replica, while it prefills
        self._held: dict[int, tuple[EngineCore, Request]] = {}  # trace row -> (prefill replica, its request)
        self._reads: dict[int, tuple[Transfer, EngineCore, Request]] = {}  # reads in flight
        # Per decode replica: prefill replicas (fleet numbers) computing prompts bound for it, and
        # how many reads into it are in flight; both bound its decode windows (_horizon).
        self._bound_for: list[dict[int, int]] = [{} for _ in decode_cores]
        self._incoming = [0] * len(decode_cores)
        self._net_version = 0
        # fleet.kv_transfer.decode_source cluster_tier: a decode replica loads what the cluster
        # tiers hold of the prompt from them; trace row -> when those parts have landed.
        self.reads_cluster_tier = reads_cluster_tier
        self._tier_ready: dict[int, float] = {}

    def _prediction_mode(self) -> str:
        return "any"  # a request reaches a decode replica when a prefill step ends, not at arrival

    # -- the request's path ----------------------------------------------------------------------
    def _arrive(self, idx: int, time_ms: float, kind: int) -> None:
        if self.pool_controls:
            if idx < 0:  # a pool controller's event (engine/pd_scaling.py)
                self.pool_controls[-1 - idx].act(time_ms)
                return
            for control in self.pool_controls:
                control.arrived(idx)
        reason = self.rejected.get(idx)
        if reason is not None:
            self.rec.request_rejected(idx, time_ms, reason)
            self._request_done(idx, time_ms)
            return
        req = self.make_request(idx, time_ms)
        views = self.decode_views
        dview = views[self.router.route(req, views, time_ms) if self.router is not None else 0]
        d = dview.replica
        decode = self.decode_cores[d]
        self.rec.replica[idx] = d
        ready = time_ms + self.latency
        if self._prefill_locally(req, dview):
            self.register_parent(req, decode.replica)
            self.deliver(req, decode, ready, kind)
            return
        views = self.prefill_views
        p = views[self.prefill_router.route(req, views, time_ms) if self.prefill_router is not None else 0].replica
        prefill = self.prefill_cores[p]
        self.columns.prefill_replica[idx] = p
        req.do_remote_decode = True
        req.max_tokens = 1  # the proxy's request to the prefill replica
        self._decode_of[idx] = d
        bound = self._bound_for[d]
        bound[prefill.replica] = bound.get(prefill.replica, 0) + 1
        self.register_parent(req, prefill.replica)
        self.deliver(req, prefill, ready, kind)

    def _prefill_locally(self, req: Request, decode: ReplicaView) -> bool:
        """Dynamo's disaggregated router: prefill on the decode replica when the prompt's uncached
        part is short enough, or when the prefill queue is too long."""
        limit = self.local_prefill_max_tokens
        if limit is not None:
            bs = self.block_size
            runs = req.keys.key_runs(0, req.num_prompt_tokens // bs, bs)
            uncached = req.num_prompt_tokens - decode.prefix_hit_blocks(runs) * bs
            if uncached <= limit:
                return True
        bound = self.prefill_queue_max
        if bound is not None and sum(v.num_waiting for v in self.prefill_views) > bound:
            return True
        return False

    def _on_finished(self, r: Request, end_ms: float, core: EngineCore) -> None:
        idx = r.idx
        slots = self._parent_slots.pop(idx, None)
        if slots:
            for entries in slots:
                entries[:] = [e for e in entries if e[2] is not r]
        if core.replica >= self.num_prefill:  # the decode replica's last token: done
            if self.router is not None:
                self.router.request_finished(r, core.replica - self.num_prefill)
            self._request_done(idx, end_ms)
            self._pool_finished(core, end_ms)
            return
        # The prefill replica answered the proxy: it now sends the request to the decode replica.
        if self.prefill_router is not None:
            self.prefill_router.request_finished(r, core.replica)
        d = self._decode_of.pop(idx)
        bound = self._bound_for[d]
        bound[core.replica] -= 1
        if not bound[core.replica]:
            del bound[core.replica]
        self._held[idx] = (core, r)
        self.columns.prefill_end[idx] = end_ms
        decode = self.decode_cores[d]
        dreq = self.make_request(idx, r.arrival_ms)
        dreq.do_remote_prefill = True
        dreq.first_scheduled_ms = r.first_scheduled_ms  # the client's request was first scheduled on P
        dreq.num_cached_tokens = r.num_cached_tokens  # the prompt's compute saved by P's prefix cache
        dreq.num_cpu_hit_tokens = r.num_cpu_hit_tokens
        dreq.num_preemptions = r.num_preemptions
        dreq.tier_hit_tokens = r.tier_hit_tokens  # the prompt's compute saved by P's KV tiers
        self.register_parent(dreq, decode.replica)
        self.deliver(dreq, decode, end_ms, OPEN)

    # -- autoscaled pools (engine/pd_scaling.py) ----------------------------------------------------
    def run(self) -> None:
        for control in self.pool_controls:
            control.start()
        super().run()

    def install_pool_replica(self, core: EngineCore) -> None:
        """A new replica joins its pool, live, in the slot its fleet number names (the slot's old
        engine, empty or retired, is replaced; its heap entries go stale with the version)."""
        slot = core.replica
        core.version = self.cores[slot].version + 1
        self.cores[slot] = core
        self.views[slot] = ReplicaView(core)
        if not self.plan.concurrency:
            core.on_finished = self._on_finished
            core.finish_is_quiet = self._finish_quiet
        if self.first_token_routers:
            core.on_first_token = self._on_first_token
        d = slot - self.num_prefill
        if d < 0:
            core.emits_tokens = False
            core.ff_ok = False
            self.prefill_cores[slot] = core
            insort(self.prefill_views, self.views[slot], key=lambda v: v.replica)
            router, local = self.prefill_router, slot
        else:
            core.sched.start_remote_load = partial(self._start_read, core)
            self.decode_cores[d] = core
            insort(self.decode_views, ReplicaView(core, replica=d), key=lambda v: v.replica)
            router, local = self.router, d
        if router is not None:
            router.replica_started(local)

    def remove_pool_replica(self, pool: str, replica: int) -> None:
        """The replica (numbered within ``pool``) leaves its pool's router; what it holds still runs."""
        if pool == "prefill":
            self.prefill_views = [v for v in self.prefill_views if v.replica != replica]
        else:
            self.decode_views = [v for v in self.decode_views if v.replica != replica]

    def _pool_finished(self, core: EngineCore, t: float) -> None:
        """Tell an autoscaled pool's controller that ``core`` may have become idle (it retires if draining)."""
        for control in self.pool_controls:
            control.replica_maybe_idle(core, t)

    def replica_idle(self, core: EngineCore) -> bool:
        """Nothing left on ``core``: no request queued, running or on its way, no prompt's blocks held
        for a read (prefill), no prompt bound for it still prefilling elsewhere (decode)."""
        if core.inbox or core.sched.has_unfinished() or core.sched.held_requests:
            return False
        d = core.replica - self.num_prefill
        return d < 0 or not (self._bound_for[d] or self._incoming[d])

    def _start_read(self, decode: EngineCore, r: Request, num_local: int, now_ms: float) -> None:
        """The decode replica allocated ``r``'s blocks (``num_local`` prompt tokens hit locally):
        the read of the rest from its prefill replica begins (vLLM starts it with the step)."""
        idx = r.idx
        prefill, _ = self._held[idx]
        bs = self.block_size
        prompt_blocks = -(-r.num_prompt_tokens // bs)
        blocks = prompt_blocks if self.full_prompt else prompt_blocks - num_local // bs
        cols = self.columns
        offload = decode.sched.offload
        if self.reads_cluster_tier and offload is not None:
            # What the cluster tiers hold (past the local hit) comes from them, the rest from P.
            tokens, tier_bytes, ready = offload.start_cluster_read(r, num_local, now_ms)
            if tokens:
                blocks -= tokens // bs
                self._tier_ready[idx] = ready
                cols.tier_tokens[idx] = tokens
                cols.tier_bytes[idx] = tier_bytes
        nbytes = blocks * bs * self.bytes_per_token  # NIXL reads whole blocks
        d = decode.replica - self.num_prefill
        tr = Transfer(idx=idx, src=prefill.replica, dst=d, nbytes=nbytes, start_ms=now_ms)
        self.network.start(tr, now_ms)
        self._reads[idx] = (tr, decode, r)
        self._incoming[d] += 1
        cols.decode_cached[idx] = num_local
        cols.transfer_bytes[idx] = nbytes
        cols.transfer_start[idx] = now_ms
        self._reschedule_network()

    def transfer_event(self, t: float, version: int) -> None:
        if version != self._net_version:
            return  # superseded: the transfers changed since it was scheduled
        for tr in self.network.advance(t):
            prefill, preq = self._held.pop(tr.idx)
            prefill.sched.release_held(preq, t)  # vLLM finished_sending: P frees the blocks
            self.wake(prefill, t)
            self._pool_finished(prefill, t)  # a draining prefill replica retires once its blocks are read
            _, decode, dreq = self._reads.pop(tr.idx)
            self._incoming[tr.dst] -= 1
            # vLLM finished_recving: seen by the decode replica's next schedule (with a cluster
            # tier's part, once that has landed too).
            dreq.load_ready_ms = max(t, self._tier_ready.pop(tr.idx, t))
            self.columns.transfer_end[tr.idx] = t
            self.wake(decode, t)
        self._reschedule_network()

    def _reschedule_network(self) -> None:
        self._net_version += 1
        t = self.network.next_event_ms()
        if t != math.inf:
            self.push_transfer_event(t, self._net_version)

    # -- what bounds a replica ---------------------------------------------------------------------
    def _horizon(self, core: EngineCore) -> float:
        """A decode replica's window also stops where a read into it may complete (any transfer's
        next event: a completion elsewhere speeds the rest up) and where a prefill replica computing
        a prompt bound for it may finish a step (the request arrives then). A bound prefill replica
        with no step in flight, requests waiting and finished prompts held may be stalled on their
        blocks: any decode replica starting a read from it, at any instant, can set it going again,
        so no window is taken past now (its wake time is only its next arrival)."""
        h = super()._horizon(core)
        d = core.replica - self.num_prefill
        if d < 0:
            return h
        bound = self._bound_for[d]
        if self._incoming[d] or bound:
            t = self.network.next_event_ms()
            if t < h:
                h = t
            cores = self.cores
            for p in bound:
                prefill = cores[p]
                if prefill.pending is None and prefill.sched.held_requests and prefill.sched.waiting:
                    return core.now if core.now < h else h
                w = prefill.wake_ms
                if w < h:
                    h = w
        return h

    def _next_event(self, core: EngineCore) -> float:
        t = super()._next_event(core)
        d = core.replica - self.num_prefill
        if (self._incoming[d] if d >= 0 else core.sched.held_requests):
            n = self.network.next_event_ms()
            if n < t:
                t = n
        return t

"""vLLM V1's Scheduler (v1/core/sched/scheduler.py): one token budget per step, running first.

`schedule()` builds one step; the simulator times it and calls `update_from_output()` at the step's
end. This module schedules the RUNNING requests and applies a step's output; admitting WAITING
requests, schedule()'s second phase, is engine/schedule_waiting.py (``WaitingAdmission``, which
``Scheduler`` extends). Behaviour follows vLLM 0.33 unless `semantics == "0.11"` (no full-prompt
admission gate, no watermark, last hit block dropped with MTP instead of lookahead hashes).
Departures from vLLM are listed in docs/engine.md.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice

from replay.engine.kv_cache_manager import KVCacheManager
from replay.engine.request import Request, RequestStatus
from replay.engine.schedule_waiting import SchedulerLimits, WaitingAdmission, reserve_prefill_lookahead
from replay.engine.spec_decode import AcceptanceSampler
from replay.engine.waiting_queue import FCFSQueue, PriorityQueue


class SchedulerOutput:
    """One step: which requests run how many tokens, and the step's shape for the timer."""

    __slots__ = ("reqs", "num_new_tokens", "num_drafts", "num_prefill_reqs", "prefill_tokens",
                 "prefill_ctx_tokens", "prefill_attn_work", "num_decode_reqs", "decode_query_tokens",
                 "decode_ctx_tokens", "num_preempted", "total_tokens")

    def __init__(self) -> None:
        self.reqs: list[Request] = []
        self.num_new_tokens: list[int] = []
        self.num_drafts: list[int] = []
        self.num_prefill_reqs = 0
        self.prefill_tokens = 0
        self.prefill_ctx_tokens = 0
        self.prefill_attn_work = 0
        self.num_decode_reqs = 0
        self.decode_query_tokens = 0
        self.decode_ctx_tokens = 0
        self.num_preempted = 0
        self.total_tokens = 0

    def count(self, before: int, n: int, known: int, sign: int = 1) -> int:
        """Add (``sign`` 1) or take back (-1) the share of one request scheduled for ``n`` tokens
        from ``before`` computed of ``known``; returns its drafts (decodes: trimmed to the budget)."""
        if known - before <= 1:
            self.num_decode_reqs += sign
            self.decode_query_tokens += sign * n
            self.decode_ctx_tokens += sign * (before + n)
            return n - 1
        self.num_prefill_reqs += sign
        self.prefill_tokens += sign * n
        self.prefill_ctx_tokens += sign * before
        self.prefill_attn_work += sign * (n * before + n * (n + 1) // 2)
        return 0


class Scheduler(WaitingAdmission):
    def __init__(self, limits: SchedulerLimits, kv: KVCacheManager,
                 sampler: AcceptanceSampler | None = None, offload=None) -> None:
        self.limits = limits
        self.kv = kv
        self.sampler = sampler
        self.offload = offload  # replay.engine.offload.OffloadManager or None
        self.waiting = PriorityQueue() if limits.policy == "priority" else FCFSQueue()
        self.running: list[Request] = []
        self.total_preemptions = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self.cpu_hit_tokens = 0
        # Disaggregated fleets (engine/pd_fleet.py): prefill replicas keep the finished requests
        # whose blocks wait for a decode replica's read; decode replicas start reads through this.
        self.held_requests: dict[int, Request] = {}  # trace row -> finished request, blocks held
        self.first_token_reqs: list[Request] = []  # first tokens of the step being applied (core hands them on)
        self.start_remote_load: Callable[[Request, int, float], None] | None = None

    # ------------------------------------------------------------------ queues
    def add_request(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.waiting.add(req)

    def has_unfinished(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    # ------------------------------------------------------------------ schedule
    def _preempt(self, victim: Request) -> None:
        """Preemption by recompute: free everything; the blocks stay cached until evicted."""
        self.kv.free(victim, preempted=True)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_draft_tokens = 0
        victim.num_preemptions += 1
        self.total_preemptions += 1
        self.waiting.prepend(victim)

    def _pick_victim(self) -> tuple[Request, int]:
        """The request to preempt and its index in running (FCFS: the last admitted; priority: the
        worst (priority, arrival))."""
        running = self.running
        if self.limits.policy == "priority":
            idx = max(range(len(running)), key=lambda j: (running[j].priority, running[j].arrival_ms, running[j].idx))
            return running.pop(idx), idx
        return running.pop(), len(running)

    def schedule(self, now_ms: float) -> SchedulerOutput:
        lim = self.limits
        kv = self.kv
        out = SchedulerOutput()
        budget = lim.max_num_batched_tokens
        # vLLM 0.33: the threshold protects other requests from a long prefill; with one eligible
        # request there is nobody to protect, so it is off.
        lpt = lim.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0
        k = lim.num_spec_tokens
        pla = lim.prefill_lookahead
        max_model_len = lim.max_model_len
        bs = kv.block_size
        caching = kv.enable_caching
        la_hash = kv.hash_lookahead
        rp = kv.reprefillable
        sched_reqs = out.reqs
        sched_tokens = out.num_new_tokens
        prefill_scheduled = False

        # Phase 1: RUNNING, in admission order. A scheduled request's share of the step's shape is
        # counted (and its state advanced) at once, so the running set is walked once per step.
        running = self.running
        drafts_list = out.num_drafts
        i = 0
        preempted_any = False
        while i < len(running) and budget > 0:
            r = running[i]
            before = r.num_computed_tokens
            known = r.num_prompt_tokens + r.num_output_tokens
            n = known + r.num_draft_tokens - before
            if 0 < lpt < n:
                n = lpt
            if n > budget:
                n = budget
            cap = max_model_len - 1 - before
            if n > cap:
                n = cap
            if pla > 1:
                n = reserve_prefill_lookahead(known - before - n, n, pla)
            if n <= 0:
                i += 1
                continue
            # Fast path (most decode steps): the held blocks already cover the new tokens and the
            # lookahead, and no block becomes cacheable; allocate_slots would change nothing.
            done = before + n
            cacheable = ((done if done < known else known) - rp) // bs
            hashed = (known - la_hash) // bs
            if (done + k + bs - 1) // bs > len(r.block_ids) or (
                    caching and (cacheable if cacheable < hashed else hashed) > r.num_cached_blocks):
                scheduled = True
                while not kv.allocate_slots(r, n, None, k):
                    victim, victim_idx = self._pick_victim()
                    if victim_idx < i:
                        i -= 1  # the list shifted left under the current request (vLLM: req_index -= 1)
                    if victim in sched_reqs:
                        # Take back what scheduling it counted: its budget and its share of the shape.
                        j = sched_reqs.index(victim)
                        del sched_reqs[j]
                        del drafts_list[j]
                        vn = sched_tokens.pop(j)
                        budget += vn
                        out.count(victim.num_computed_tokens - vn, vn,
                                  victim.num_prompt_tokens + victim.num_output_tokens, -1)
                    self._preempt(victim)
                    preempted_any = True
                    out.num_preempted += 1
                    if victim is r:
                        scheduled = False
                        break
                if not scheduled:
                    if lim.policy == "priority":
                        continue  # vLLM 0.33: later (higher-priority) requests may still fit
                    break
            prefill_scheduled |= r.is_prefill_chunk
            drafts = out.count(before, n, known)
            r.num_draft_tokens = drafts
            r.is_prefill_chunk = done < known
            r.num_computed_tokens = done  # optimistic, as vLLM does
            sched_reqs.append(r)
            sched_tokens.append(n)
            drafts_list.append(drafts)
            budget -= n
            i += 1

        # Phase 2: WAITING, only when nothing was preempted this step.
        if not preempted_any:
            num_running_scheduled = len(sched_reqs)
            budget = self.schedule_waiting(now_ms, budget, sched_reqs, sched_tokens, prefill_scheduled)
            # The admitted requests' share of the step's shape.
            for r, n in zip(islice(sched_reqs, num_running_scheduled, None),
                            islice(sched_tokens, num_running_scheduled, None)):
                before = r.num_computed_tokens
                known = r.num_prompt_tokens + r.num_output_tokens
                drafts = out.count(before, n, known)
                r.num_draft_tokens = drafts
                r.is_prefill_chunk = before + n < known
                drafts_list.append(drafts)
                if r.first_scheduled_ms < 0:
                    r.first_scheduled_ms = now_ms
                r.num_computed_tokens = before + n
        out.total_tokens = out.prefill_tokens + out.decode_query_tokens
        if self.offload is not None and sched_reqs:
            self.offload.prepare_stores(sched_reqs, now_ms)
        return out

    # ------------------------------------------------------------------ update
    def update_from_output(self, out: SchedulerOutput, end_ms: float, finished: list[Request],
                           chunk_reqs: list[Request], chunk_tokens: list[int]) -> tuple[int, int]:
        """Apply a finished step: emit tokens, roll back rejected drafts, finish requests.

        Emitted chunks are appended to ``chunk_reqs``/``chunk_tokens`` (all at ``end_ms``;
        ``chunk_tokens`` stays empty without speculative decoding, where every chunk is one token);
        finished requests to ``finished``. Returns (draft tokens verified, drafts accepted) for the step.
        """
        k = self.limits.num_spec_tokens
        max_model_len = self.limits.max_model_len
        running_status = RequestStatus.RUNNING
        if not k:
            self._update_without_drafts(out, end_ms, finished, chunk_reqs, chunk_tokens, max_model_len)
            return 0, 0
        sampler = self.sampler
        assert sampler is not None  # spec decoding (k > 0) always has one
        step_drafts = 0
        step_accepted = 0
        for r, drafts in zip(out.reqs, out.num_drafts):
            if r.status is not running_status:
                continue
            known = r.num_prompt_tokens + r.num_output_tokens
            if r.num_computed_tokens < known:
                continue  # a non-final prefill chunk emits nothing
            if drafts and r.padded_drafts:
                # Placeholder drafts never match a sampled token; vLLM's spec-decoding stats count
                # them as drafts all the same (none accepted). No acceptance draw is used up.
                r.padded_drafts = False
                r.num_computed_tokens -= drafts
                r.num_drafts += 1
                r.num_draft_tokens_total += drafts
                step_drafts += drafts
                emitted = 1
            elif drafts:
                accepted = sampler.num_accepted(r.idx, r.spec_step, drafts)
                r.spec_step += 1
                r.num_computed_tokens -= drafts - accepted  # blocks are kept
                r.num_drafts += 1
                r.num_draft_tokens_total += drafts
                r.num_accepted_tokens += accepted
                step_drafts += drafts
                step_accepted += accepted
                emitted = 1 + accepted
                remaining = r.max_tokens - r.num_output_tokens
                if emitted > remaining:
                    emitted = remaining
            else:
                emitted = 1
            r.num_output_tokens += emitted
            if r.first_token_ms < 0:
                r.first_token_ms = end_ms
                self.first_token_reqs.append(r)
            chunk_reqs.append(r)
            chunk_tokens.append(emitted)
            if k:
                # vLLM 0.33 update_from_output: with spec decoding, blocks whose lookahead tokens are
                # now known are cached at once (before a finished request frees them).
                self.kv.cache_blocks(r, r.num_computed_tokens)
            if length_reached(r, max_model_len):
                r.status = RequestStatus.FINISHED
                r.finish_ms = end_ms
                r.num_draft_tokens = 0
                finished.append(r)
            else:
                r.num_draft_tokens = k  # the drafter proposes k tokens after sampling
        self._free_finished(finished, end_ms)
        return step_drafts, step_accepted

    def _update_without_drafts(self, out: SchedulerOutput, end_ms: float, finished: list[Request],
                               chunk_reqs: list[Request], chunk_tokens: list[int], max_model_len: int) -> None:
        """update_from_output without speculative decoding: every emitting request emits one token."""
        running_status = RequestStatus.RUNNING
        for r in out.reqs:
            if r.status is not running_status:
                continue
            known = r.num_prompt_tokens + r.num_output_tokens
            if r.num_computed_tokens < known:
                continue  # a non-final prefill chunk emits nothing
            r.num_output_tokens += 1
            if r.first_token_ms < 0:
                r.first_token_ms = end_ms
                self.first_token_reqs.append(r)
            chunk_reqs.append(r)
            if length_reached(r, max_model_len):
                r.status = RequestStatus.FINISHED
                r.finish_ms = end_ms
                finished.append(r)
        self._free_finished(finished, end_ms)  # chunk_tokens stays empty: every chunk is one token

    def finish_decoded(self, end_ms: float, max_model_len: int, finished: list[Request]) -> int:
        """A decode window's last step has emitted its tokens (counts already applied): finish the
        requests it completed, as _update_without_drafts does, and return how many."""
        done: list[Request] = []
        for r in self.running:
            if length_reached(r, max_model_len):
                r.status = RequestStatus.FINISHED
                r.finish_ms = end_ms
                done.append(r)
        self._free_finished(done, end_ms)
        finished.extend(done)
        return len(done)

    def _free_finished(self, finished: list[Request], end_ms: float) -> None:
        if finished:
            running_status = RequestStatus.RUNNING
            self.running = [r for r in self.running if r.status is running_status]
            for r in finished:
                if r.do_remote_decode:
                    # P/D prefill replica (vLLM request_finished -> delay_free_blocks): the blocks stay
                    # held until the decode replica has read them (release_held).
                    self.held_requests[r.idx] = r
                else:
                    self.free_request_blocks(r, end_ms)

    def free_request_blocks(self, r: Request, end_ms: float) -> None:
        """A finished request gives its GPU blocks back (after its G2 stores, with host offload)."""
        if self.offload is not None:
            self.offload.request_finished(r, end_ms)
        else:
            self.kv.free(r)

    def release_held(self, r: Request, now_ms: float) -> None:
        """P/D prefill replica: the decode replica has read ``r``'s KV (vLLM finished_sending)."""
        del self.held_requests[r.idx]
        self.free_request_blocks(r, now_ms)


def length_reached(r: Request, max_model_len: int) -> bool:
    """After a step's tokens are counted: the request has all its output, or fills the model."""
    return r.num_output_tokens >= r.max_tokens or r.num_prompt_tokens + r.num_output_tokens >= max_model_len

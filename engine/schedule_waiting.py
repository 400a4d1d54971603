"""vLLM V1's Scheduler.schedule, its second phase: admitting WAITING requests (v1/core/sched/scheduler.py).

Runs only when the running phase preempted nobody. The queue head is admitted while the token budget,
``max_num_seqs`` and the KV pool allow; a head that does not fit blocks the queue (FCFS head-of-line
blocking). A request with CPU (G2) or remote hits starts its asynchronous load and waits in
WAITING_FOR_REMOTE_KVS. ``waiting_is_blocked`` tells decode windows when nobody can be admitted
until a running request finishes. engine/scheduler.py's Scheduler extends ``WaitingAdmission`` with
the running phase and the step updates; the limits both read are ``SchedulerLimits``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replay.engine.kv_cache_manager import KVCacheManager
from replay.engine.request import Request, RequestStatus
from replay.engine.waiting_queue import FCFSQueue, PriorityQueue


@dataclass(slots=True)
class SchedulerLimits:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    long_prefill_token_threshold: int = 0
    reserve_full_isl: bool = True
    # vLLM 0.33 reserves the blocks of the loads in flight in allocate_slots whatever the
    # full-prompt gate (_inflight_prefill_reserved_blocks); the 0.11 rules have no reservation.
    reserve_loads: bool = True
    watermark_blocks: int = 0
    policy: str = "fcfs"
    num_spec_tokens: int = 0
    prefill_lookahead: int = 0  # vLLM 0.33 num_prefill_lookahead_tokens (MTP: 1, or k multi-module)


class WaitingAdmission:
    """The scheduler's admission of waiting requests (engine/scheduler.py's Scheduler is one)."""

    # Set by Scheduler.__init__ (engine/scheduler.py documents them).
    limits: SchedulerLimits
    kv: KVCacheManager
    offload: Any  # replay.engine.offload.OffloadManager or None
    waiting: FCFSQueue | PriorityQueue
    running: list[Request]
    prefix_query_tokens: int
    prefix_hit_tokens: int
    cpu_hit_tokens: int
    start_remote_load: Callable[[Request, int, float], None] | None

    def schedule_waiting(self, now_ms: float, budget: int, sched_reqs: list[Request],
                         sched_tokens: list[int], prefill_scheduled: bool = False) -> int:
        """vLLM's second phase of schedule(): admit waiting requests in queue order while the budget,
        max_num_seqs and the KV pool allow (head-of-line blocking); returns the budget left."""
        lim = self.limits
        kv = self.kv
        waiting = self.waiting
        running = self.running
        offload = self.offload
        lpt = lim.long_prefill_token_threshold if len(running) + len(waiting) > 1 else 0
        k = lim.num_spec_tokens
        pla = lim.prefill_lookahead
        skipped: list[Request] = []
        # vLLM pads a new decode only when the running pass scheduled someone (scheduled_running_reqs),
        # not when only this pass's own admissions precede it.
        running_scheduled = len(sched_reqs) > 0
        while waiting and budget > 0 and len(running) < lim.max_num_seqs:
            r = waiting.peek()
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if r.load_ready_ms > now_ms:
                    skipped.append(waiting.pop())  # not head-of-line: vLLM skips it this step
                    continue
                if r.remote_loading:
                    r.remote_loading = False
                    if r.tier_loads:  # P/D with a cluster tier's part: unpin, touch, promote it
                        assert offload is not None
                        offload.finish_load(r)
                    if r.num_computed_tokens == r.num_tokens:  # vLLM _update_waiting_for_remote_kv:
                        r.num_computed_tokens -= 1  # the last prompt token is recomputed to sample
                    kv.allocate_slots(r, 0, None, 0)  # the read blocks become findable only now (vLLM)
                else:
                    offload.finish_load(r)
                    kv.allocate_slots(r, 0, None, 0)  # the loaded blocks become findable only now (vLLM)
                r.status = RequestStatus.WAITING
                r.load_wait_ms += now_ms - r.load_start_ms

            new_computed: list[int] = []
            num_local = 0
            num_external = 0
            if r.num_computed_tokens == 0:
                new_computed, num_local = kv.get_computed_blocks(r)
                if r.do_remote_prefill:
                    # vLLM NixlConnector: the rest of the prompt (its partial last block included) is read.
                    num_external = r.num_prompt_tokens - num_local
                elif offload is not None:
                    num_external = offload.get_num_new_matched_tokens(r, num_local, now_ms)
                    if num_external < 0:  # a block of its prefix is still being copied (HIT_PENDING)
                        skipped.append(waiting.pop())  # vLLM: skipped this step, looked up again next
                        continue
            num_computed = r.num_computed_tokens + num_local + num_external
            known = r.num_prompt_tokens + r.num_output_tokens
            reserve = lim.watermark_blocks if running else 0  # vLLM: only when others are scheduled

            if num_external:
                # Asynchronous H2D load: hold GPU blocks for local + external tokens, wait for the copy.
                # vLLM 0.33 admits it only if it fits beside the blocks the loads already in flight
                # still need for their whole prompts (_inflight_prefill_reserved_blocks): a load holds
                # its blocks and cannot be preempted, so loads must not starve each other.
                reserved = offload.reserved_blocks() if offload is not None else 0
                if not self.admission_fits(r, new_computed, known, running, reserved, num_computed):
                    break
                if not kv.allocate_slots(r, num_external, new_computed, 0, delay_cache=True):
                    break
                waiting.pop()
                remote = r.do_remote_prefill
                self.record_first_admission(r, num_local, 0 if remote else num_external)
                r.num_computed_tokens = num_computed
                if remote:
                    r.do_remote_prefill = False  # one read per request (vLLM clears it at allocation)
                    r.remote_loading = True
                    r.load_ready_ms = math.inf  # the transfer network sets it when the read lands
                    start = self.start_remote_load
                    assert start is not None  # a decode replica of a disaggregated fleet has one
                    start(r, num_local, now_ms)
                else:
                    offload.start_load(r, num_local, num_external, now_ms)
                r.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                r.load_start_ms = now_ms
                skipped.append(r)
                continue

            n = known - num_computed
            padded = False
            if n == 1 and k and not prefill_scheduled and (running_scheduled or num_computed > 0) \
                    and num_computed + 1 + k + 1 <= lim.max_model_len:
                # vLLM 0.33 pad_spec_decode: a new decode joins with k placeholder drafts (all rejected)
                # to keep the batch a uniform decode batch; it waits if the budget cannot take them.
                if 1 + k > budget:
                    break
                n = 1 + k
                padded = True
            if 0 < lpt < n:
                n = lpt
            if n > budget:
                n = budget  # chunked prefill is always on in V1
            if pla > 1:
                n = reserve_prefill_lookahead(known - num_computed - n, n, pla)
                if n <= 0:
                    skipped.append(waiting.pop())  # vLLM: requeued, does not block the queue
                    continue
            if not self.admission_fits(r, new_computed, known, running):
                break  # head-of-line blocking
            # vLLM 0.33 gives every admission its num_lookahead_tokens slots.
            if not kv.allocate_slots(r, n, new_computed, k, reserve_blocks=reserve):
                break
            waiting.pop()
            self.record_first_admission(r, num_local, 0)
            r.num_computed_tokens = num_computed
            r.status = RequestStatus.RUNNING
            r.padded_drafts = padded
            running.append(r)
            sched_reqs.append(r)
            sched_tokens.append(n)
            budget -= n
        for r in reversed(skipped):
            waiting.prepend(r)
        return budget

    def waiting_is_blocked(self) -> bool:
        """True when schedule() can admit nobody now and nobody until a running request finishes.

        Used to fast-forward decode windows with a non-empty queue. Holds when the running set is
        at max_num_seqs, or (full-prompt gate on) when the head does not fit: the free pool only
        shrinks while nobody finishes, and evicted hits turn into blocks to allocate, so the head's
        need never falls below the free count inside a window. With host offload, CPU hits do not
        change the gate (it counts the whole prompt), deferred frees and loads are window-ending
        events, and the head's per-step CPU lookup (it touches the CPU LRU) is replayed by the
        window; a head still waiting for its own load is not handled (the scheduler skips it).
        """
        if not self.waiting:
            return True
        lim = self.limits
        if len(self.running) >= lim.max_num_seqs:
            return True
        if not lim.reserve_full_isl:
            return False
        r = self.waiting.peek()
        if r.num_computed_tokens != 0 or r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            return False
        hits, _ = self.kv.get_computed_blocks(r)
        return not self.admission_fits(r, hits, r.num_prompt_tokens + r.num_output_tokens, self.running)

    def admission_fits(self, r: Request, new_computed: list[int], known: int,
                       running: list[Request], reserved: int = 0, load_tokens: int = 0) -> bool:
        """vLLM >= 0.19 full-prompt gate (+ watermark when others run); [0.11] no gate.

        vLLM 0.33 (allocate_slots, full_sequence_must_fit): room for every known token, lookahead
        slots not included. A load (``load_tokens``: the tokens it allocates for) must also leave
        the ``reserved`` blocks of the loads in flight, with the gate or without it.
        """
        lim = self.limits
        if not lim.reserve_full_isl:
            if not (reserved and lim.reserve_loads):
                return True
            return self.kv.num_blocks_to_admit(r, new_computed, load_tokens) + reserved <= self.kv.pool.get_num_free_blocks()
        need = self.kv.num_blocks_to_admit(r, new_computed, known) + reserved
        if running:
            need += lim.watermark_blocks
        return need <= self.kv.pool.get_num_free_blocks()

    def record_first_admission(self, r: Request, num_local: int, num_external: int) -> None:
        if r.num_cached_tokens < 0:
            r.num_cached_tokens = num_local
            r.num_cpu_hit_tokens = num_external
            self.prefix_query_tokens += r.num_prompt_tokens
            self.prefix_hit_tokens += num_local
            self.cpu_hit_tokens += num_external
            if self.offload is not None and self.offload.has_curves:
                self.offload.first_admission(r)


def reserve_prefill_lookahead(remaining: int, n: int, lookahead: int) -> int:
    """vLLM 0.33 Scheduler._reserve_prefill_lookahead: a prefill chunk never ends within
    ``lookahead`` tokens of the prefill end (multi-module MTP reads that far ahead)."""
    if 0 < remaining < lookahead:
        n -= lookahead - remaining
    return n if n > 0 else 0

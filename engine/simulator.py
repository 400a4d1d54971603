"""The discrete-event loop: release arrivals, schedule a step, time it, apply its output, repeat.

Simulated time only moves forward by step durations or by jumping to the next event when nothing
can run (an idle server, a request waiting for an H2D load or a store to complete).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from engine.arrivals import ArrivalPlan
from engine.block_keys import BlockKeys
from engine.decode_window import run_decode_window
from engine.recorder import Recorder
from engine.request import Request
from engine.scheduler import Scheduler
from engine.timing.base import StepTimer
from engine.trace_input import TraceArrays
from replay.errors import ReplayError

ProgressFn = Callable[[float, int], None]


class Simulator:
    def __init__(self, trace: TraceArrays, plan: ArrivalPlan, scheduler: Scheduler, timer: StepTimer,
                 recorder: Recorder, *, block_size: int, hash_lookahead: int,
                 rejected: dict[int, str], check_invariants: bool = False,
                 progress: ProgressFn | None = None, fast_forward: bool = True) -> None:
        self.trace = trace
        self.plan = plan
        self.sched = scheduler
        self.timer = timer
        self.rec = recorder
        self.block_size = block_size
        self.hash_lookahead = hash_lookahead
        self.rejected = rejected
        self.check_invariants = check_invariants
        self.progress = progress
        self.fast_forward = fast_forward
        self.num_done = 0
        self.now = 0.0
        self._dynamic: list[tuple[float, int, int]] = []  # (ready_ms, seq, idx) released on completions
        self._dyn_seq = 0
        self._conc_next = 0

    # -- arrivals ------------------------------------------------------------------------------
    def _push_dynamic(self, ready_ms: float, idx: int) -> None:
        self._dyn_seq += 1
        heapq.heappush(self._dynamic, (ready_ms, self._dyn_seq, idx))

    def _release(self, idx: int, ready_ms: float) -> None:
        reason = self.rejected.get(idx)
        if reason is not None:
            self.rec.request_rejected(idx, ready_ms, reason)
            self._request_done(idx, ready_ms)
            return
        t = self.trace
        off = t.hash_offsets
        inp = int(t.input_tokens[idx])
        keys = BlockKeys(t.hash_values, int(off[idx]), int(off[idx + 1]), t.hash_block_size,
                         self.block_size, inp, idx, self.hash_lookahead, int(t.shared_lead[idx]))
        req = Request(idx, t.request_id[idx], ready_ms, inp, int(t.output_tokens[idx]), keys,
                      t.session_id[idx], int(t.turn[idx]) if t.turn[idx] >= 0 else None,
                      int(t.priority[idx]))
        self.sched.add_request(req)

    def _request_done(self, idx: int, time_ms: float) -> None:
        self.num_done += 1
        plan = self.plan
        for dep, delay in plan.dependents.get(idx, ()):
            self._push_dynamic(time_ms + delay, dep)
        if plan.concurrency:
            self._start_next_concurrent(time_ms)

    def _start_next_concurrent(self, time_ms: float) -> None:
        order = self.plan.concurrency_order
        if self._conc_next < len(order):
            idx = int(order[self._conc_next])
            self._conc_next += 1
            self._push_dynamic(time_ms, idx)

    def _next_event_ms(self, open_ptr: int) -> float:
        t = math.inf
        if open_ptr < len(self.plan.open_times):
            t = float(self.plan.open_times[open_ptr])
        if self._dynamic and self._dynamic[0][0] < t:
            t = self._dynamic[0][0]
        off = self.sched.offload
        if off is not None:
            t = min(t, off.next_event_ms())
        return t

    # -- main loop -----------------------------------------------------------------------------
    def run(self) -> None:
        plan = self.plan
        sched = self.sched
        rec = self.rec
        timer = self.timer
        offload = sched.offload
        open_times = plan.open_times.tolist()
        open_order = plan.open_order.tolist()
        n_open = len(open_times)
        open_ptr = 0
        dynamic = self._dynamic
        if plan.concurrency:
            for _ in range(plan.concurrency):
                self._start_next_concurrent(0.0)
        spec_k = sched.limits.num_spec_tokens
        kv_pool = sched.kv.pool
        step_ms = timer.step_ms
        emit_chunks = rec.emit_chunks
        step_idx = 0
        idle_spins = 0
        ff_ok = self.fast_forward and spec_k == 0
        now = 0.0
        last_progress = -1.0
        while True:
            while open_ptr < n_open and open_times[open_ptr] <= now:
                self._release(open_order[open_ptr], open_times[open_ptr])
                open_ptr += 1
            while dynamic and dynamic[0][0] <= now:
                ready, _, idx = heapq.heappop(dynamic)
                self._release(idx, ready)
            if offload is not None:
                offload.advance(now)
            if not sched.has_unfinished():
                nxt = self._next_event_ms(open_ptr)
                if nxt == math.inf:
                    break
                now = max(now, nxt)
                continue
            if ff_ok:
                end, taken = run_decode_window(sched, step_ms, rec, now, self._next_event_ms(open_ptr), step_idx)
                if taken:
                    step_idx += taken
                    now = end
                    if self.check_invariants:
                        self._check(None)
                    continue
            out = sched.schedule(now)
            if out.total_tokens == 0:
                nxt = self._next_event_ms(open_ptr)
                if out.num_preempted == 0 and nxt == math.inf:
                    raise ReplayError(self._stuck_message(now))
                idle_spins = idle_spins + 1 if nxt <= now else 0
                if idle_spins > 4 + len(sched.running):
                    raise ReplayError(self._stuck_message(now))
                if nxt != math.inf:  # a step that only preempted retries at the same time
                    now = max(now, nxt)
                continue
            idle_spins = 0
            passes = spec_k if spec_k and out.num_decode_reqs + out.num_prefill_reqs else 0
            dur = step_ms(out.num_prefill_reqs, out.prefill_tokens, out.prefill_ctx_tokens,
                          out.prefill_attn_work, out.num_decode_reqs, out.decode_query_tokens,
                          out.decode_ctx_tokens, passes)
            end = now + dur
            if offload is not None:
                offload.step_executed(now, end)
            finished: list[Request] = []
            chunk_reqs: list[int] = []
            chunk_tokens: list[int] = []
            drafts, accepted = sched.update_from_output(out, end, finished, chunk_reqs, chunk_tokens)
            if chunk_reqs:
                emit_chunks(chunk_reqs, end, chunk_tokens)
            for r in finished:
                rec.request_finished(r)
                self._request_done(r.idx, end)
            free = kv_pool.get_num_free_blocks()
            usable = kv_pool.num_gpu_blocks - 1
            if offload is not None:
                stored, loaded, cpu_used, cpu_usage = offload.step_stats()
            else:
                stored = loaded = cpu_used = 0
                cpu_usage = 0.0
            rec.record_step((step_idx, now, dur, out.total_tokens, out.prefill_tokens, out.num_prefill_reqs,
                             out.num_decode_reqs, len(sched.running), len(sched.waiting), out.num_preempted,
                             1.0 - free / usable, usable - free, drafts, accepted, stored, loaded,
                             cpu_used, cpu_usage))
            step_idx += 1
            if self.check_invariants:
                self._check(out)
            now = end
            if self.progress is not None and now - last_progress > 1000.0:
                last_progress = now
                self.progress(now, self.num_done)
        self.now = now
        for r in list(sched.running) + list(sched.waiting):
            rec.request_unfinished(r)
        if self.progress is not None:
            self.progress(now, self.num_done)

    def _stuck_message(self, now: float) -> str:
        head = self.sched.waiting.peek() if self.sched.waiting else None
        what = f"request {head.request_id!r} ({head.num_tokens} tokens)" if head else "no request"
        return (f"the replay cannot make progress at t={now:.1f} ms: {what} does not fit in the KV cache "
                f"({self.sched.kv.pool.get_num_free_blocks()} free blocks) and nothing else can run")

    def _check(self, out) -> None:
        """Debug mode invariants: block conservation, ref counts, budget."""
        lim = self.sched.limits
        if out is not None:
            assert out.total_tokens <= lim.max_num_batched_tokens, "token budget exceeded"
        assert len(self.sched.running) <= lim.max_num_seqs, "max_num_seqs exceeded"
        pool = self.sched.kv.pool
        holders: dict[int, int] = {}
        in_use_keys: dict[int, int | None] = {}
        off = self.sched.offload
        reqs = list(self.sched.running) + [r for r in self.sched.waiting if r.block_ids]
        if off is not None:
            reqs += off.requests_holding_blocks()
        for r in reqs:
            keys = r.keys.block_keys(0, self.sched.kv.num_registered_blocks(r))
            for j, b in enumerate(r.block_ids):
                holders[b] = holders.get(b, 0) + 1
                key = keys[j] if j < len(keys) else None
                if in_use_keys.get(b) is None:
                    in_use_keys[b] = key
        pool.check_invariants(in_use_keys, holders)

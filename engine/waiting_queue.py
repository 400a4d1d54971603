"""vLLM's request queues: FCFS deque, or a priority heap ordered by (priority, arrival).

vLLM 0.33 keeps waiting requests that hold KV blocks (a KV load in flight or finished, or computed
tokens while waiting) in a queue of their own, ``kv_holding_waiting``, drained before ``waiting``
(v1/core/sched/scheduler.py: "a block-holder must never sit behind a request whose failed
allocation would stop the scheduling scan"); a preempted request goes to the head of ``waiting``,
so behind them. The FCFS deque keeps that order in one queue: block holders first, each group in
vLLM's order. The priority queue keeps vLLM's two heaps: the block holders', served first, and the
others', each by (priority, arrival).
"""

from __future__ import annotations

import heapq
from collections import deque

from replay.engine.request import Request, RequestStatus


def holds_kv_blocks(req: Request) -> bool:
    """vLLM 0.33 ``_holds_kv_blocks``: computed tokens while waiting, or a KV load it waits for."""
    return req.num_computed_tokens > 0 or req.status == RequestStatus.WAITING_FOR_REMOTE_KVS


class FCFSQueue:
    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        """Back to the head of its group (vLLM: prepend_request on kv_holding_waiting or waiting): a
        request holding KV blocks to the very head, any other (a preempted one, or one skipped this
        step) behind the block holders, whose allocations would otherwise never be reached."""
        q = self._q
        if holds_kv_blocks(req):
            q.appendleft(req)
            return
        i = 0
        n = len(q)
        while i < n and holds_kv_blocks(q[i]):
            i += 1
        if i == 0:
            q.appendleft(req)
        else:
            q.insert(i, req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def __iter__(self):
        return iter(self._q)


class PriorityQueue:
    """Lower priority value first, ties by arrival time (then trace order, for determinism). As in
    vLLM 0.33, the requests holding KV blocks wait in a heap of their own (``kv_holding_waiting``),
    served before the other heap whatever the priorities: a block holder behind a request whose
    allocation fails would never be reached. Which heap is decided when a request is queued, as
    vLLM's ``_enqueue_waiting_request`` does."""

    __slots__ = ("_holding", "_heap")

    def __init__(self) -> None:
        self._holding: list[tuple[int, float, int, Request]] = []
        self._heap: list[tuple[int, float, int, Request]] = []

    def add(self, req: Request) -> None:
        heap = self._holding if holds_kv_blocks(req) else self._heap
        heapq.heappush(heap, (req.priority, req.arrival_ms, req.idx, req))

    prepend = add  # vLLM: prepend_request on a heap is add_request (a preempted request by its key)

    def peek(self) -> Request:
        return (self._holding or self._heap)[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._holding or self._heap)[3]

    def __len__(self) -> int:
        return len(self._holding) + len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._holding) or bool(self._heap)

    def __iter__(self):
        """Serving order: the block holders, then the others."""
        return (item[3] for heap in (self._holding, self._heap) for item in sorted(heap))

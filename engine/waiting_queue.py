"""vLLM's request queues: FCFS deque, or a priority heap ordered by (priority, arrival)."""

from __future__ import annotations

import heapq
from collections import deque

from replay.engine.request import Request


class FCFSQueue:
    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        """Preempted requests go back to the head (vLLM: waiting.prepend_request)."""
        self._q.appendleft(req)

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
    """Lower priority value first, ties by arrival time (then trace order, for determinism)."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_ms, req.idx, req))

    prepend = add  # a preempted request re-enters by its (priority, arrival) key

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self):
        return (item[3] for item in sorted(self._heap))

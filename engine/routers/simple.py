"""Routers that look only at the request: round robin, seeded random, session affinity."""

from __future__ import annotations

import hashlib
from bisect import bisect_left

import numpy as np

from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request
from replay.engine.routers.base import Router, RouterContext, splitmix64  # the hash the MTP draws use


def _hash64(text: str) -> int:
    """Stable 64-bit hash of a string (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


class RoundRobinRouter(Router):
    """Replica 0, 1, ..., N-1, 0, ... in arrival order: what AISimulate does with
    ``parallelism.replicas``, and the baseline every other router is compared with."""

    name = "round_robin"

    def __init__(self, ctx: RouterContext, options) -> None:
        super().__init__(ctx, options)
        self.counter = 0

    def route(self, req: Request, replicas: list[ReplicaView], now_ms: float) -> int:
        target = self.counter % len(replicas)
        self.counter += 1
        return target

    def next_open_offset(self, replica: int) -> int | None:
        return (replica - self.counter) % self.n


class RandomRouter(Router):
    """Uniform over replicas, seeded. Each request's draw is a hash of (seed, trace row), so the
    choice does not depend on the order in which requests arrive (closed-loop turns included)."""

    name = "random"

    def route(self, req: Request, replicas: list[ReplicaView], now_ms: float) -> int:
        return splitmix64((self.ctx.seed << 32) ^ req.idx) % len(replicas)

    def _target(self, row: int) -> int:
        return splitmix64((self.ctx.seed << 32) ^ row) % self.n

    def static_targets(self, rows: np.ndarray) -> np.ndarray:
        return np.fromiter((self._target(int(r)) for r in rows), dtype=np.int64, count=len(rows))


class SessionAffinityRouter(Router):
    """Every turn of a session to one replica, by consistent hashing of the session id.

    A hash ring in the manner of Envoy's ring_hash load balancer: each replica owns
    ceil(ring_size / N) points (hashes of "replica-<i>-<j>"), a session goes to the owner of the
    first point at or after the hash of its id, wrapping around. Growing the fleet from N to N+1
    moves about 1/(N+1) of the sessions. Requests without a session hash their request id. In an
    autoscaled fleet the ring holds every replica id the fleet may use; a session whose owner is not
    live goes to the next point owned by a live replica (so a replica leaving moves only its own
    sessions, and they come back when the id is live again).
    """

    name = "session_affinity"

    def __init__(self, ctx: RouterContext, options) -> None:
        super().__init__(ctx, options)
        per = -(-options.ring_size // self.n)
        points = sorted((_hash64(f"replica-{i}-{j}"), i) for i in range(self.n) for j in range(per))
        self._ring = [p for p, _ in points]
        self._owner = [i for _, i in points]
        self._memo: dict[str, int] = {}

    def _lookup(self, key: str) -> int:
        pos = bisect_left(self._ring, _hash64(key))
        return self._owner[pos if pos < len(self._ring) else 0]

    def _key(self, row: int) -> str:
        trace = self.ctx.trace
        sid = trace.session_id[row]
        return "r:" + trace.request_id[row] if sid is None else "s:" + sid

    def _target(self, row: int) -> int:
        trace = self.ctx.trace
        sid = trace.session_id[row]
        if sid is None:
            return self._lookup("r:" + trace.request_id[row])
        target = self._memo.get(sid)
        if target is None:
            target = self._memo[sid] = self._lookup("s:" + sid)
        return target

    def route(self, req: Request, replicas: list[ReplicaView], now_ms: float) -> int:
        if len(replicas) == self.n:  # every replica live: the position is the id
            return self._target(req.idx)
        live = {v.replica: i for i, v in enumerate(replicas)}
        ring, owner = self._ring, self._owner
        pos = bisect_left(ring, _hash64(self._key(req.idx)))
        for k in range(len(ring)):
            found = live.get(owner[(pos + k) % len(ring)])
            if found is not None:
                return found
        raise RuntimeError("session_affinity: no live replica on the ring")

    def static_targets(self, rows: np.ndarray) -> np.ndarray:
        return np.fromiter((self._target(int(r)) for r in rows), dtype=np.int64, count=len(rows))

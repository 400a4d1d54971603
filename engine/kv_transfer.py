"""The KV transfer network of a disaggregated fleet: prefill egress and decode ingress links shared fairly.

Every prefill replica has one egress link and every decode replica one ingress link, each of
``fleet.kv_transfer.bandwidth_gb_per_s``. A transfer (one request's KV, prefill -> decode) uses its
source's egress and its destination's ingress; concurrent transfers share links max-min fairly
(progressive filling, what per-flow fair queueing on the NICs converges to), recomputed whenever a
transfer starts or its bytes finish, so a burst of reads out of one prefill replica queues behind
one another's bytes. A transfer completes ``latency_ms`` after its last byte (the read's fixed cost:
descriptor setup and the completion notification), and frees its links at its last byte.

Exact, event-driven: between two events every rate is constant, so a transfer's last byte lands at
``last_update + remaining / rate``; the fleet loop (engine/pd_fleet.py) asks for ``next_event_ms``
and calls ``advance`` there. Work per event is proportional to the transfers in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Transfer:
    """One request's KV read from a prefill replica into a decode replica."""

    idx: int  # trace row
    src: int  # prefill replica (index in its pool)
    dst: int  # decode replica (index in its pool)
    nbytes: int
    start_ms: float
    remaining: float = 0.0  # bytes still to move
    rate: float = 0.0  # bytes per ms, constant until the next event
    bytes_done_ms: float = math.inf  # when the last byte moves, at the current rates
    done_ms: float = math.inf  # bytes_done_ms + latency: when the decode replica sees it complete


class TransferNetwork:
    """Links of one disaggregated fleet and the transfers in flight on them."""

    def __init__(self, bandwidth_gb_per_s: float, latency_ms: float) -> None:
        self.bytes_per_ms = bandwidth_gb_per_s * 1e6  # GB/s = 1e9 bytes/s = 1e6 bytes/ms
        self.latency_ms = latency_ms
        self.moving: list[Transfer] = []  # bytes still on the links
        self.landing: list[Transfer] = []  # bytes moved, completion notice pending (latency)
        self.now = 0.0
        self.total_bytes = 0
        self.total_transfers = 0
        self.link_busy_ms: dict[tuple[str, int], float] = {}  # (side, replica) -> time with traffic

    def start(self, tr: Transfer, now_ms: float) -> None:
        """Begin ``tr`` at ``now_ms`` (no earlier than the last event)."""
        self._move_to(now_ms)
        tr.remaining = float(tr.nbytes)
        self.total_bytes += tr.nbytes
        self.total_transfers += 1
        if tr.nbytes == 0 or self.bytes_per_ms == math.inf:
            self._bytes_done(tr, now_ms)
        else:
            self.moving.append(tr)
        self._share()

    def next_event_ms(self) -> float:
        t = math.inf
        for tr in self.moving:
            if tr.bytes_done_ms < t:
                t = tr.bytes_done_ms
        for tr in self.landing:
            if tr.done_ms < t:
                t = tr.done_ms
        return t

    def advance(self, now_ms: float) -> list[Transfer]:
        """Move time to ``now_ms``; returns the transfers completed by then, in completion order."""
        self._move_to(now_ms)
        self._share()
        done = [tr for tr in self.landing if tr.done_ms <= now_ms]
        if done:
            self.landing = [tr for tr in self.landing if tr.done_ms > now_ms]
            done.sort(key=lambda tr: (tr.done_ms, tr.start_ms, tr.idx))
        return done

    def in_flight(self) -> int:
        return len(self.moving) + len(self.landing)

    # -- internals ---------------------------------------------------------------------------------
    def _bytes_done(self, tr: Transfer, t: float) -> None:
        tr.remaining = 0.0
        tr.rate = 0.0
        tr.bytes_done_ms = t
        tr.done_ms = t + self.latency_ms
        self.landing.append(tr)

    def _move_to(self, now_ms: float) -> None:
        """Advance every moving transfer to ``now_ms`` at its current rate; those whose last byte
        lands by then (at the time predicted when the rates were set) leave the links."""
        dt = now_ms - self.now
        if dt < 0:
            raise RuntimeError(f"KV transfer clock moved back from {self.now} to {now_ms}")
        if self.moving:
            busy = self.link_busy_ms
            links = {("prefill", tr.src) for tr in self.moving} | {("decode", tr.dst) for tr in self.moving}
            for link in links:
                busy[link] = busy.get(link, 0.0) + dt
            still = []
            for tr in self.moving:
                if tr.bytes_done_ms <= now_ms:
                    self._bytes_done(tr, tr.bytes_done_ms)
                else:
                    tr.remaining -= tr.rate * dt
                    still.append(tr)
            self.moving = still
        self.now = now_ms

    def _share(self) -> None:
        """Max-min fair rates by progressive filling over the egress and ingress links, then each
        moving transfer's predicted last byte."""
        moving = self.moving
        if not moving:
            return
        cap = self.bytes_per_ms
        left: dict[tuple[str, int], float] = {}
        users: dict[tuple[str, int], list[Transfer]] = {}
        for tr in moving:
            for link in (("prefill", tr.src), ("decode", tr.dst)):
                left.setdefault(link, cap)
                users.setdefault(link, []).append(tr)
        unfixed = {id(tr) for tr in moving}
        while unfixed:
            best_link = None
            best_share = math.inf
            for link in sorted(users):
                n = sum(1 for tr in users[link] if id(tr) in unfixed)
                if n:
                    share = left[link] / n
                    if share < best_share:
                        best_share, best_link = share, link
            assert best_link is not None
            for tr in users[best_link]:
                if id(tr) in unfixed:
                    unfixed.discard(id(tr))
                    tr.rate = best_share
                    for link in (("prefill", tr.src), ("decode", tr.dst)):
                        left[link] -= best_share
        now = self.now
        for tr in moving:
            tr.bytes_done_ms = now + tr.remaining / tr.rate

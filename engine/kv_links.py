"""The links KV tier transfers cross: a PCIe lane, a node's disk, a replica's NIC, a pool's aggregate.

A link serves its transfers one after another at its full bandwidth, in the order they are issued
(one DMA queue, one copy stream, one NIC queue): concurrent transfers share its bandwidth in time.
n equal transfers issued together complete at S/B, 2S/B, ... nS/B; under fair (processor) sharing
they would all complete at nS/B. The last completion and the link's throughput are the same; the
order model fixes each completion when the transfer is issued, so a request waiting for a load
knows when it is ready and no later transfer moves it (documented in docs/kv-tiers.md).

A transfer crossing several links (a replica's NIC, then a remote pool's aggregate) occupies each
for its bytes at that link's bandwidth and completes when the slowest is done.
"""

from __future__ import annotations


class Link:
    """One link's queue: when it is next free, and what it has carried."""

    __slots__ = ("name", "ms_per_byte", "free_ms", "busy_ms", "bytes")

    def __init__(self, name: str, gb_per_s: float) -> None:
        self.name = name
        self.ms_per_byte = 1e3 / (gb_per_s * 1e9)  # GB = 1e9 bytes, as vendors rate links
        self.free_ms = 0.0
        self.busy_ms = 0.0
        self.bytes = 0

    def occupy(self, now_ms: float, nbytes: int) -> float:
        """Queue ``nbytes`` at ``now_ms``; returns when they have crossed this link."""
        begin = now_ms if now_ms > self.free_ms else self.free_ms
        dur = nbytes * self.ms_per_byte
        self.free_ms = begin + dur
        self.busy_ms += dur
        self.bytes += nbytes
        return self.free_ms


def transfer(links: list[Link], now_ms: float, nbytes: int, latency_ms: float) -> float:
    """Issue one transfer of ``nbytes`` over ``links`` at ``now_ms``; returns its completion time
    (latency to first byte, then the slowest link's queue)."""
    start = now_ms + latency_ms
    done = start
    for link in links:
        t = link.occupy(start, nbytes)
        if t > done:
            done = t
    return done

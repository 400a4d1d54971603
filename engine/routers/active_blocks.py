"""The KV-aware router's per-worker bookkeeping and its cost loop, compiled with the engine core.

Dynamo's router asks every worker at every arrival. On a 64-replica fleet that is 64 cost terms per
request, each a few dictionary reads; interpreted, the loop cost more than the replica's prefix-cache
lookups it summarizes. ``ActiveBlocks`` and ``kv_aware_costs`` hold that loop (engine/native.py
compiles this module; pure Python runs the same code). The policy itself, with its sources, is in
engine/routers/kv_aware.py.
"""

from __future__ import annotations


class ActiveBlocks:
    """The distinct prompt blocks of one worker's active requests (Dynamo's ActiveSequences), held
    as key runs (BlockKeys.key_runs from block 0): a run is the blocks of one trace block, and as
    block keys are chained, every request's run in a given trace block is a prefix of the same
    sequence, named by its first key. So per run start the lengths held (with their counts) say
    everything: the blocks held there are the longest length's, and a request's leading blocks
    held are found run by run. Per request, work in runs (one per trace block), not in blocks."""

    __slots__ = ("lengths", "longest", "num_blocks")

    def __init__(self) -> None:
        # Keyed by the run start's int object as the range holds it (dict[object, ...]): compiled
        # code would otherwise unbox each start and box it again, a new int object per lookup.
        self.lengths: dict[object, dict[int, int]] = {}  # run start -> {length: active requests}
        self.longest: dict[object, int] = {}  # run start -> the longest length held
        self.num_blocks = 0  # distinct blocks held: the sum of the longest lengths

    def add(self, runs: list[range]) -> None:
        lengths, longest = self.lengths, self.longest
        for run in runs:
            n = len(run)
            key: object = run.start
            counts = lengths.get(key)
            if counts is None:
                lengths[key] = {n: 1}
                longest[key] = n
                self.num_blocks += n
                continue
            counts[n] = counts.get(n, 0) + 1
            m = longest[key]
            if n > m:
                longest[key] = n
                self.num_blocks += n - m

    def remove(self, runs: list[range]) -> None:
        lengths, longest = self.lengths, self.longest
        for run in runs:
            n = len(run)
            key: object = run.start
            counts = lengths[key]
            left = counts[n] - 1
            if left:
                counts[n] = left
                continue
            del counts[n]
            m = longest[key]
            if not counts:
                del lengths[key]
                del longest[key]
                self.num_blocks -= m
            elif n == m:
                m2 = max(counts)
                longest[key] = m2
                self.num_blocks -= m - m2

    def held_prefix(self, runs: list[range]) -> int:
        """Leading blocks of ``runs`` held by an active request."""
        longest = self.longest
        total = 0
        for run in runs:
            n = len(run)
            start: object = run.start
            m = longest.get(start, 0)
            if m < n:
                return total + m
            total += n
        return total


def kv_aware_costs(workers: list[int], overlaps: list[int], credits: list[int] | None, actives: list[ActiveBlocks],
                   prefill_tokens: list[int], prompt_runs: list[range], isl: int, block_size: int,
                   weight: float, new_tokens: list[int]) -> list[float]:
    """Dynamo's cost of each worker (engine/routers/kv_aware.py has the formula), in the order of
    ``workers`` (replica ids) with their ``overlaps`` (leading cached blocks); ``credits``: tokens
    credited for hits in lower KV tiers, or None. Appends each worker's uncached prompt tokens to
    ``new_tokens``."""
    num_blocks = isl // block_size
    first_start: object = -1
    first_len = 0
    if prompt_runs:
        first = prompt_runs[0]
        first_start = first.start
        first_len = len(first)
    costs: list[float] = []
    for pos in range(len(workers)):
        w = workers[pos]
        new = isl - overlaps[pos] * block_size
        if credits is not None:
            new -= credits[pos]
        if new < 0:
            new = 0
        active = actives[w]
        held = 0
        if first_len:
            held = active.longest.get(first_start, 0)
            if held >= first_len:
                held = active.held_prefix(prompt_runs)
        decode_blocks = num_blocks - held + active.num_blocks
        costs.append(weight * (new + prefill_tokens[w]) / block_size + decode_blocks)
        new_tokens.append(new)
    return costs

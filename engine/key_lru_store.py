"""The per-key CPU block store: the reference ``RunLRUStore`` (engine/cpu_store.py) is tested against.

One OrderedDict entry per offload block key, with the same semantics as the run store (the
docstring of engine/cpu_store.py): a randomized test compares the two call by call, and replays with this store
swapped in (``OffloadManager.store_factory``) must give byte-identical outputs. Simple rather than
fast: a store or a lookup costs one operation per key.
"""

from __future__ import annotations

from collections import OrderedDict


class KeyLRUStore:
    """One OrderedDict entry per key (key -> batch id of the copy that wrote it)."""

    def __init__(self, block_size: int) -> None:  # the block size matters to the run store only
        self.lru: OrderedDict[int, int] = OrderedDict()
        self.pins: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.lru)

    def lru_items(self) -> list[tuple[int, int]]:
        return list(self.lru.items())

    def store(self, runs: list[range], batch: int, capacity: int, ready_below: int) -> tuple[int, int | None]:
        lru = self.lru
        keys = [k for run in runs for k in run]
        new = [k for k in keys if k not in lru]
        need = len(new) - (capacity - len(lru))
        victims: list[int] = []
        if need > 0:
            protected = set(keys)
            for key, b in lru.items():
                if b < ready_below and key not in self.pins and key not in protected:
                    victims.append(key)
                    if len(victims) == need:
                        break
            else:
                return len(new), None
            for key in victims:
                del lru[key]
        for key in reversed(keys):
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = batch
        return len(new), len(victims)

    def touch(self, runs: list[range], groups: list[int] | None = None) -> None:
        lru = self.lru
        for key in [k for run in reversed(runs) for k in reversed(run)]:
            if key in lru:
                lru.move_to_end(key)

    def count_ready(self, runs: list[range], start: int, ready_below: int) -> int:
        hits = 0
        for key in [k for run in runs for k in run][start:]:
            b = self.lru.get(key)
            if b is None or b >= ready_below:
                break
            hits += 1
        return hits

    def pin(self, runs: list[range]) -> None:
        for run in runs:
            for key in run:
                self.pins[key] = self.pins.get(key, 0) + 1

    def unpin(self, runs: list[range]) -> None:
        for run in runs:
            for key in run:
                c = self.pins[key] - 1
                if c:
                    self.pins[key] = c
                else:
                    del self.pins[key]

"""Python's cyclic garbage collector is off while a replay runs, and restored after it.

The engine frees what it drops by reference count: whole replays with collection off (mooncake-fleet8
with no tiers, G2, and G2 with two tiers below it; P/D; MTP with and without G2; a 32-replica fleet;
an autoscaled fleet; the sample sessions) left the same 10 unreachable objects each time. A
collection, though, traverses the millions of long-lived objects a replay keeps: a three-tier fleet
spent 1.4 s of 13.5 s in it even with a young threshold of 100,000. The CPU stores' LRU lists,
cyclic by nature, are released once the outputs are written (``EngineCore.release``).
docs/engine.md, "No cyclic garbage collection during a replay", has the measurements.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def collector_off() -> Iterator[None]:
    """Automatic collection off inside; left as it was if already off (a nested replay, a forked
    worker of one)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def without_collector(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` runs under ``collector_off`` (replays: engine/run.py, engine/cluster_run.py)."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with collector_off():
            return fn(*args, **kwargs)

    return wrapper

"""python -m bench.vllm_parity.ablations: how much each corrected rule matters, measured.

Each ablation puts one pre-fix rule back (a monkeypatch, in this process only) and replays every
fixture; the table counts the steps that then differ from vLLM. A rule whose ablation changes
nothing on any workload would be untested by the fixtures.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.vllm_parity.__main__ import FIXTURES, read_rows
from bench.vllm_parity.replay_driver import run_replay
from bench.vllm_parity.tables import compare, read_fixture
from bench.vllm_parity.workloads import Workload


def _old_free_order() -> None:
    """Rule 1 undone: freed blocks without a hash join the tail like cached ones."""
    from replay.engine.free_block_queue import FreeKVCacheBlockQueue

    FreeKVCacheBlockQueue.prepend_uncached = lambda self, n: self.append_anonymous(n, False)


def _no_admission_lookahead() -> None:
    """Rule 2 undone: a request with no computed tokens is admitted without lookahead slots."""
    from replay.engine.kv_cache_manager import KVCacheManager
    from replay.engine.request import RequestStatus

    orig = KVCacheManager.allocate_slots

    def allocate_slots(self, req, n, new_computed=None, lookahead=0, delay_cache=False, reserve_blocks=0):
        if req.status is not RequestStatus.RUNNING and req.num_computed_tokens == 0:
            lookahead = 0
        return orig(self, req, n, new_computed, lookahead, delay_cache, reserve_blocks)

    KVCacheManager.allocate_slots = allocate_slots


def _cache_when_computed_past_lookahead() -> None:
    """Rule 3 undone: a block is cached only once its lookahead tokens are computed too."""
    from replay.engine.kv_cache_manager import KVCacheManager

    def cache_blocks(self, req, num_computed_tokens):
        num_full = (num_computed_tokens - self.hash_lookahead) // self.block_size
        start = req.num_cached_blocks
        if num_full > start:
            reg = min(self._registrable(req), num_full)
            if reg > start:
                self.pool.cache_full_blocks(req.block_ids[start:reg], req.keys.key_runs(start, reg, self.block_size))
            req.num_cached_blocks = num_full

    KVCacheManager.cache_blocks = cache_blocks


def _lookahead_k_always() -> None:
    """Rule 4 undone: the hash lookahead is k whatever the MTP head's layer count."""
    import replay.engine.scheduler_factory as factory

    factory.prefill_lookahead = lambda config: config.speculative.num_speculative_tokens if config.speculative else 0


ABLATIONS: dict[str, Callable[[], None]] = {
    "free-order": _old_free_order,
    "admission-lookahead": _no_admission_lookahead,
    "cache-when-known": _cache_when_computed_past_lookahead,
    "prefill-lookahead": _lookahead_k_always,
}


def main(argv: list[str]) -> int:
    name = argv[0]
    ABLATIONS[name]()
    models = Path(tempfile.gettempdir()) / "vllm-parity-models"
    total_diff = 0
    for path in sorted(FIXTURES.glob("*.json.gz")):
        if path.name.startswith("rows-"):
            continue
        wj, _, vt = read_fixture(path)
        w = Workload.from_json(wj)
        c = compare(vt, run_replay(w, read_rows(w), models))
        diff = max(c.steps_vllm, c.steps_replay) - c.identical_steps
        total_diff += diff
        if diff or c.request_differences:
            print(f"{name}: {w.name}: {diff} of {c.steps_vllm} steps differ, {c.request_differences} "
                  f"first-token/finish steps differ; first: {c.first_difference[:160]}", flush=True)
    print(f"{name}: {total_diff} differing steps in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

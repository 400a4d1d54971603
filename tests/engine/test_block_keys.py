"""Block keys: the range() fast path equals the per-token definition, and keys mean what they say."""

from __future__ import annotations

import random

from replay.engine.block_keys import BlockKeys


def test_fast_path_matches_definition():
    rng = random.Random(1)
    for _ in range(2000):
        hb = rng.choice([16, 32, 48, 64, 100, 512])
        bs = rng.choice([16, 32, 64])
        la = rng.choice([0, 0, 1, 2, 3])
        inp = rng.randint(1, 3000)
        n_ids = -(-inp // hb)
        ids = [rng.randint(0, 2**64 - 1) for _ in range(n_ids)]
        keys = BlockKeys(ids, 0, n_ids, hb, bs, inp, rng.randint(0, 2**30), la)
        total = (inp + 500) // bs
        j0 = rng.randint(0, total)
        j1 = rng.randint(j0, total)
        assert keys.block_keys(j0, j1) == [keys.prefix_key((j + 1) * bs + la) for j in range(j0, j1)]


def test_shared_prefix_gives_equal_keys_and_divergence_differs():
    # Two prompts sharing trace block 7 (512 tokens) then diverging: their first 32 engine blocks
    # (16 tokens each) have equal keys, the rest differ; generated-token blocks are per request.
    a = BlockKeys([7, 8], 0, 2, 512, 16, 1000, unique_tag=1)
    b = BlockKeys([7, 9], 0, 2, 512, 16, 1000, unique_tag=2)
    ka, kb = a.block_keys(0, 70), b.block_keys(0, 70)
    assert ka[:32] == kb[:32]
    assert all(x != y for x, y in zip(ka[32:], kb[32:]))
    assert len(set(ka)) == 70  # a chain never repeats a key


def test_uint64_ids_are_not_truncated():
    a = BlockKeys([2**64 - 1], 0, 1, 16, 16, 16, unique_tag=0)
    b = BlockKeys([2**63 - 1], 0, 1, 16, 16, 16, unique_tag=0)
    assert a.block_keys(0, 1) != b.block_keys(0, 1)


def test_offload_keys_are_the_last_gpu_block_keys():
    # The G2 key of an offload block of f GPU blocks is the key of its last GPU block.
    from replay.engine.config import HostOffloadConfig
    from replay.engine.kv_cache_manager import KVCacheManager
    from replay.engine.offload import OffloadManager
    from replay.engine.request import Request

    for la in (0, 2):
        kv = KVCacheManager(64, 16, hash_lookahead=la)
        off = OffloadManager(HostOffloadConfig(num_cpu_blocks=10, block_size=64), kv, 1000)
        keys = BlockKeys([5, 6, 7], 0, 3, 100, 16, 300, unique_tag=4, lookahead=la)
        req = Request(0, "r", 0.0, 300, 10, keys)
        gpu = keys.keys_upto(20)
        runs = off._runs(req, 1, 5)
        assert [k for run in runs for k in run] == [keys.prefix_key((m + 1) * 64 + la) for m in range(1, 5)]
        assert [k for run in runs for k in run] == gpu[2 * 4 - 1:5 * 4:4]


def test_key_runs_cut_from_the_kept_runs_equal_fresh_ones():
    """At the GPU block size, runs from block 0 are kept and later calls are cut from them: the
    same runs (keys, steps, one per trace block) as computing them afresh, in any order of calls."""
    rng = random.Random(5)
    for _ in range(300):
        hb = rng.choice([16, 48, 64, 512])
        bs = rng.choice([16, 32])
        la = rng.choice([0, 0, 2])
        inp = rng.randint(1, 3000)
        n_ids = -(-inp // hb)
        ids = [rng.randint(0, 2**40) for _ in range(n_ids)]
        keys = BlockKeys(ids, 0, n_ids, hb, bs, inp, 9, la)
        total = (inp + 300) // bs
        for _ in range(8):
            j1 = rng.randint(0, total)
            j0 = 0 if rng.random() < 0.4 else rng.randint(0, j1)
            got = keys.key_runs(j0, j1, bs)
            fresh = BlockKeys(ids, 0, n_ids, hb, bs, inp, 9, la).key_runs(j0, j1, bs)
            assert [(list(r), r.step) for r in got] == [(list(r), r.step) for r in fresh]

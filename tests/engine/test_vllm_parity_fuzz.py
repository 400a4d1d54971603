"""bench/vllm_parity/fuzz.py draws the same workload for a seed every time, and ours replays it."""

from __future__ import annotations

from bench.vllm_parity.fuzz import SECOND_PROFILE, make
from bench.vllm_parity.replay_driver import run_replay


def test_a_seed_is_one_workload():
    for seed in (0, 7, SECOND_PROFILE, SECOND_PROFILE + 3):
        (w1, rows1), (w2, rows2) = make(seed), make(seed)
        assert w1 == w2 and rows1 == rows2
        assert w1.num_spec_tokens == 2 and w1.mtp_layers == 2


def test_both_profiles_replay_to_the_end(tmp_path):
    for seed in (3, SECOND_PROFILE + 1):
        w, rows = make(seed)
        tables = run_replay(w, rows, tmp_path)
        assert len(tables.finish) == len(rows)

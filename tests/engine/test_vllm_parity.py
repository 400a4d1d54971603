"""Step-for-step parity with vLLM 0.33's own scheduler, without vLLM installed.

Each fixture under tests/fixtures/vllm_parity/ was recorded by running vLLM's real V1 Scheduler on a
workload (bench/vllm_parity/vllm_driver.py; regenerate with `python -m bench.vllm_parity
--regenerate` in the vLLM venv, bench/README.md). Here the same requests go through our scheduler in
the same lock-step loop, and every step must match: tokens scheduled per request, preemptions and
their victims, admissions with their num_computed_tokens (prefix hits), free blocks after schedule
and after update, and each request's first-token and finish step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.vllm_parity.__main__ import FIXTURES, read_rows
from bench.vllm_parity.replay_driver import run_replay
from bench.vllm_parity.tables import compare, read_fixture
from bench.vllm_parity.workloads import Workload, all_workloads

FIXTURE_PATHS = sorted(p for p in FIXTURES.glob("*.json.gz") if not p.name.startswith("rows-"))


def _load(path: Path):
    wj, meta, tables = read_fixture(path)
    return Workload.from_json(wj), meta, tables


def test_every_workload_has_a_fixture():
    names = {p.name.removesuffix(".json.gz") for p in FIXTURE_PATHS}
    assert names == {w.name for w in all_workloads()}


@pytest.mark.parametrize("path", FIXTURE_PATHS, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_identical_to_vllm_step_for_step(path, tmp_path):
    w, meta, vllm_tables = _load(path)
    assert meta["vllm_version"] == "0.33.0"
    c = compare(vllm_tables, run_replay(w, read_rows(w), tmp_path))
    assert c.identical, c.first_difference
    assert c.steps_replay == c.identical_steps == len(vllm_tables.steps)


def test_fixtures_exercise_what_they_claim():
    """Preemptions, prefix hits and MTP drafts all occur somewhere (the comparison is not vacuous)."""
    preempted = hits = drafts = 0
    for path in FIXTURE_PATHS:
        w, _, t = _load(path)
        preempted += sum(len(s.preempted) for s in t.steps)
        hits += sum(1 for s in t.steps for _, c in s.admitted if c > 0)
        if w.num_spec_tokens:
            drafts += sum(1 for s in t.steps for n in s.sched.values() if n == 1 + w.num_spec_tokens)
    assert preempted > 50 and hits > 100 and drafts > 1000


def test_the_comparison_catches_the_old_free_queue_rule(monkeypatch, tmp_path):
    """Before vLLM 0.33, freed blocks without a hash joined the tail: that must show as a difference."""
    from replay.engine.free_block_queue import FreeKVCacheBlockQueue

    monkeypatch.setattr(FreeKVCacheBlockQueue, "prepend_uncached", lambda self, n: self.append_anonymous(n, False))
    w, _, vllm_tables = _load(FIXTURES / "small-r6000-100.json.gz")
    c = compare(vllm_tables, run_replay(w, read_rows(w), tmp_path))
    assert not c.identical

"""Hand-checked MTP admissions (2-layer MTP head, k = 2, block size 16), stepped like the vLLM parity
harness: schedule(), then update_from_output(), one step at a time, no clock.

vLLM 0.33 `Scheduler.schedule()` pads a waiting request that has exactly one token to compute to
1 + k tokens (`pad_spec_decode`: k placeholder drafts, all rejected), but only when it is not the
first thing in the step: a prefill-free step in which the running pass scheduled a request
(`scheduled_running_reqs`), or a resumed request (`num_computed_tokens > 0`). Requests admitted
earlier in the same waiting pass do not count. The step tables below were recorded from vLLM 0.33.0's
own Scheduler on the same requests (bench/vllm_parity/vllm_driver.py's loop): step 0 schedules
{0: 20, 1: 1} with 60 free blocks, step 1 {0: 3, 1: 3, 2: 3}.
"""

from __future__ import annotations

from bench.vllm_parity.replay_driver import engine_config
from bench.vllm_parity.workloads import Workload, _mtp
from replay.engine.block_keys import BlockKeys
from replay.engine.request import Request
from replay.engine.scheduler import Scheduler
from replay.engine.scheduler_factory import build_scheduler


def _scheduler(tmp_path, num_gpu_blocks: int) -> tuple[Scheduler, int]:
    w = Workload(name="t", start=0, rows=0, num_gpu_blocks=num_gpu_blocks, **_mtp(2, 2))
    w = Workload.from_json({**w.to_json(), "acceptance_rates": [0.0, 0.0]})  # every draft rejected
    sched = build_scheduler(engine_config(w, tmp_path), num_gpu_blocks, max_model_len=131072)
    return sched, sched.kv.hash_lookahead


def _request(i: int, prompt: int, out: int, lookahead: int) -> Request:
    # No trace ids: every block key is unique to its request (no prefix sharing in this scenario).
    keys = BlockKeys([], 0, 0, None, 16, prompt, i, lookahead)
    return Request(i, str(i), 0.0, prompt, out, keys)


def _step(sched: Scheduler, step: int) -> dict[int, int]:
    out = sched.schedule(float(step))
    scheduled = {r.idx: n for r, n in zip(out.reqs, out.num_new_tokens)}
    sched.update_from_output(out, float(step), [], [], [])
    return scheduled


def test_one_token_prompt_is_padded_only_after_the_running_pass_scheduled_someone(tmp_path):
    sched, lookahead = _scheduler(tmp_path, 64)
    assert lookahead == 2  # num_prefill_lookahead_tokens = k for a 2-layer MTP head
    sched.add_request(_request(0, 20, 4, lookahead))
    sched.add_request(_request(1, 1, 3, lookahead))
    # Step 0: nothing is running. Request 0 is admitted first (20 tokens + 2 lookahead slots: 2
    # blocks); request 1 has one token to compute and only request 0's admission precedes it, so it
    # is not padded: 1 token (+ 2 lookahead slots: 1 block). 63 usable blocks - 3 = 60 free.
    assert _step(sched, 0) == {0: 20, 1: 1}
    assert sched.kv.pool.get_num_free_blocks() == 60
    # Step 1: requests 0 and 1 decode (1 + 2 drafts each); request 2, a one-token prompt arriving
    # now, follows a running pass that scheduled both, in a step with no prefill: padded to 1 + k.
    sched.add_request(_request(2, 1, 2, lookahead))
    assert _step(sched, 1) == {0: 3, 1: 3, 2: 3}
    assert sched.kv.pool.get_num_free_blocks() == 59

"""Hand-checked MTP and G2-offload scenarios (block size 16, fixed 10 ms steps)."""

from __future__ import annotations

import pytest

from replay.engine.config import SpeculativeConfig
from replay.engine.spec_decode import AcceptanceSampler, expected_accepted, rates_from_expected, resolve_rates
from tests.engine_helpers import run_small

BIG = {"max_num_batched_tokens": 1000}


def mtp(rates, **sched):
    return {"scheduler": {**BIG, **sched}, "speculative": {"num_speculative_tokens": len(rates),
                                                           "acceptance_rates": rates}}


def test_mtp_one_accepted_draft_per_step(tmp_path):
    # k = 2, a = [1, 0]: every verification accepts exactly one draft, so each decode step emits 2
    # tokens as one chunk. 9 tokens: 1 (prefill) + 2 + 2 + 2 + 2, last at 50 ms.
    reqs, chunks, steps, _ = run_small([dict(input_tokens=16, output_tokens=9)], tmp_path,
                                       num_gpu_blocks=64, config=mtp([1.0, 0.0]))
    assert list(chunks.tokens) == [1, 2, 2, 2, 2]
    assert list(chunks.time_ms) == [10.0, 20.0, 30.0, 40.0, 50.0]
    r = reqs.iloc[0]
    assert (r.num_drafts, r.num_draft_tokens, r.num_accepted_tokens) == (4, 8, 4)
    assert r.mean_acceptance_length == 2.0
    assert list(steps.draft_tokens) == [0, 2, 2, 2, 2] and list(steps.accepted_tokens) == [0, 1, 1, 1, 1]
    # Each verify step schedules 1 + k tokens.
    assert list(steps.scheduled_tokens[1:]) == [3, 3, 3, 3]


def test_mtp_output_capped_at_max_tokens(tmp_path):
    _, chunks, _, _ = run_small([dict(input_tokens=16, output_tokens=5)], tmp_path,
                                num_gpu_blocks=64, config=mtp([1.0, 1.0]))
    assert list(chunks.tokens) == [1, 3, 1]


def test_mtp_lookahead_slots_are_reserved(tmp_path):
    # 13 prompt tokens fit one block. The first verify step computes 13 + 3 tokens and reserves
    # k = 2 lookahead slots: cdiv(13 + 3 + 2, 16) = 2 blocks although only 14 tokens are known.
    _, _, steps, _ = run_small([dict(input_tokens=13, output_tokens=4)], tmp_path,
                               num_gpu_blocks=64, config=mtp([0.0, 0.0]))
    assert steps.kv_blocks_used[0] == 1
    assert steps.kv_blocks_used[1] == 2


def test_mtp_drafts_trimmed_by_budget(tmp_path):
    # Budget 4 with two decoding requests and k = 2: the first takes 1 + 2 tokens, the second only 1,
    # so its drafts are trimmed to 0 and it emits a single token.
    rows = [dict(input_tokens=2, output_tokens=3), dict(input_tokens=2, output_tokens=3)]
    _, chunks, steps, _ = run_small(rows, tmp_path, num_gpu_blocks=64,
                                    config=mtp([1.0, 1.0], max_num_batched_tokens=4))
    step1 = chunks[chunks.time_ms == 20.0].set_index("request_id").tokens
    assert step1["r0"] == 2 and step1["r1"] == 1  # r0: 1 + 2 accepted, capped at output 3 -> 2 more
    assert steps.scheduled_tokens[1] == 4


def test_acceptance_draws_do_not_depend_on_the_batch(tmp_path):
    rates = [0.7, 0.4]
    alone, _, _, _ = run_small([dict(input_tokens=16, output_tokens=40)], tmp_path / "a",
                               num_gpu_blocks=256, config=mtp(rates))
    rows = [dict(input_tokens=16, output_tokens=40)] + [dict(arrival_ms=3 * i, input_tokens=40, output_tokens=30)
                                                        for i in range(1, 6)]
    busy, _, _, _ = run_small(rows, tmp_path / "b", num_gpu_blocks=256, config=mtp(rates))
    a, b = alone.iloc[0], busy.set_index("request_id").loc["r0"]
    assert (a.num_drafts, a.num_accepted_tokens) == (b.num_drafts, b.num_accepted_tokens)


def test_acceptance_sampler_matches_its_rates():
    s = AcceptanceSampler([0.8, 0.5], seed=7)
    draws = [s.num_accepted(i, step, 2) for i in range(200) for step in range(50)]
    mean = sum(draws) / len(draws)
    assert abs(mean - expected_accepted([0.8, 0.5])) < 0.02  # 0.8 + 0.4 = 1.2


def test_expected_accepted_tokens_conversion():
    rates = rates_from_expected(1.5, 2)
    assert rates[0] == rates[1] and abs(rates[0] + rates[0] ** 2 - 1.5) < 1e-9
    cfg = SpeculativeConfig(num_speculative_tokens=2, expected_accepted_tokens=1.5)
    assert resolve_rates(cfg) == rates
    with pytest.raises(Exception, match="lie in"):
        rates_from_expected(2.5, 2)


def _mtp_model(tmp_path, layers: int) -> str:
    """A DeepSeek-V3 config.json with ``layers`` MTP modules (num_nextn_predict_layers)."""
    import json

    from bench.vllm_parity.model_configs import DEEPSEEK_V3

    path = tmp_path / f"mtp{layers}.json"
    path.write_text(json.dumps({**DEEPSEEK_V3, "num_nextn_predict_layers": layers}))
    return str(path)


def test_mtp_prefix_rules_033_lookahead_and_011_drop(tmp_path):
    # Identical prompts. A block j hits when it ends before the last token ((j+1)*16 <= n - 1) and,
    # with 0.33 lookahead hashes, when its next L tokens exist too ((j+1)*16 + L <= n). vLLM 0.33
    # num_prefill_lookahead_tokens: L = 1 for a single-layer MTP head (never fewer hits than plain),
    # L = k for a multi-layer one (k = 2 here).
    # 49 tokens: plain (48)//16 = 3 blocks; 1 layer min(3, 48//16) = 3; 2 layers min(3, 47//16 = 2) = 2;
    # 0.11 drops the last: 2. 50 tokens: the two lookahead tokens exist, so 2 layers hits 3 blocks.
    def rows(n):
        return [dict(input_tokens=n, output_tokens=1, hash_ids=[1, 2, 3, 4]),
                dict(arrival_ms=100, input_tokens=n, output_tokens=1, hash_ids=[1, 2, 3, 4])]

    one, two = _mtp_model(tmp_path, 1), _mtp_model(tmp_path, 2)
    expected = {49: (48, 48, 32, 32), 50: (48, 48, 48, 32)}
    for n, want in expected.items():
        plain, _, _, _ = run_small(rows(n), tmp_path / f"a{n}", num_gpu_blocks=64, config={"scheduler": BIG})
        v1, _, _, _ = run_small(rows(n), tmp_path / f"b{n}", num_gpu_blocks=64,
                                config={**mtp([0.5, 0.5]), "model": one})
        v2, _, _, _ = run_small(rows(n), tmp_path / f"d{n}", num_gpu_blocks=64,
                                config={**mtp([0.5, 0.5]), "model": two})
        v011, _, _, _ = run_small(rows(n), tmp_path / f"c{n}", num_gpu_blocks=64,
                                  config={**mtp([0.5, 0.5]), "semantics": "0.11"})
        got = (plain.cached_tokens[1], v1.cached_tokens[1], v2.cached_tokens[1], v011.cached_tokens[1])
        assert got == want, n


def test_mtp_prefill_chunk_keeps_clear_of_the_prompt_end(tmp_path):
    # vLLM 0.33 _reserve_prefill_lookahead with a 3-layer MTP head (k = 3): a chunk may not end 1 or
    # 2 tokens before the prompt end. Budget 48, prompt 50: the first chunk would leave 2 tokens, so
    # it shrinks to 47 and the rest (3 tokens) follows. A 1-layer head (lookahead 1) is unaffected.
    rows = [dict(input_tokens=50, output_tokens=1, hash_ids=[1, 2, 3, 4])]
    for layers, want in ((3, [47, 3]), (1, [48, 2])):
        _, _, steps, _ = run_small(rows, tmp_path / f"l{layers}", num_gpu_blocks=64,
                                   config={**mtp([0.5, 0.5, 0.5], max_num_batched_tokens=48),
                                           "model": _mtp_model(tmp_path, layers)})
        assert list(steps.prefill_tokens) == want, layers


# --------------------------------------------------------------------------- G2 host offload
def offload(**kw):
    base = {"num_cpu_blocks": 64, "d2h_gbps": 0.0016, "h2d_gbps": 0.0016, "latency_us": 0.0}
    base.update(kw)
    return base


def run_offload(rows, tmp_path, *, num_gpu_blocks=64, caching=True, host=None, sched=None, prompt_only=True):
    import pandas as pd

    from replay.engine.config import EngineConfig
    from replay.engine.run import replay_trace
    from tests.engine_helpers import FixedTimer, make_trace, setup_for

    table, meta = make_trace(rows)
    cfg = EngineConfig.model_validate({
        "scheduler": {**BIG, **(sched or {})},
        "kv_cache": {"enable_prefix_caching": caching, "offload_prompt_only": prompt_only},
        "host_offload": host or offload(),
    })
    out = tmp_path / "out"
    # kv_bytes_per_token = 1000: an offload block of 16 tokens is 16,000 bytes, which takes
    # exactly 10 ms at 0.0016 GB/s (1.6 MB/s) per direction.
    info = replay_trace(table, meta, cfg, out, setup=setup_for(num_gpu_blocks, FixedTimer(),
                                                               kv_bytes_per_token=1000),
                        check_invariants=True).run_info
    return (pd.read_parquet(out / "requests.parquet").set_index("request_id"),
            pd.read_parquet(out / "steps.parquet"), info)


def test_offload_store_then_load_full_hit_recomputes_one_token(tmp_path):
    # GPU prefix caching off, so only the CPU tier can hit. A (48 tokens, 3 offload blocks) runs at
    # 0-10 ms; its 3 stores start when the forward pass ends (10 ms) and take 3 x 10 ms: ready at 40.
    # B (same prompt) arrives at 50: 3 CPU blocks hit = 48 tokens, a full hit, so 47 are loaded and
    # 1 is recomputed. The load starts at 50 and takes 30 ms; B is scheduled at the first step
    # boundary after 80 ms.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=50, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    reqs, steps, info = run_offload(rows, tmp_path, caching=False)
    b = reqs.loc["r1"]
    assert b.cpu_hit_tokens == 47 and b.cached_tokens == 0
    assert b.first_scheduled_ms == 80.0 and b.load_wait_ms == 30.0
    assert steps.scheduled_tokens.iloc[-1] == 1  # one token over 47 loaded: costed like a decode
    assert info["totals"]["cpu_blocks_stored"] == 3 and info["totals"]["cpu_blocks_loaded"] == 3


@pytest.mark.parametrize("prompt_only", [True, False])
def test_generated_blocks_are_stored_only_without_offload_prompt_only(tmp_path, prompt_only):
    # A: a 32-token prompt (2 offload blocks) and 40 output tokens: 71 tokens computed, so 4 full
    # blocks in the end, 2 of them generated. vLLM 0.33 (offload_prompt_only, its default) stores the
    # prompt's 2 only; without it, the 2 generated ones too, each after the step that fills it.
    # B, arriving after A, reads A's prompt from the CPU alone (GPU caching off): 31 tokens (the full
    # hit recomputes one) either way, since generated blocks are A's own (no other prompt names them).
    rows = [dict(input_tokens=32, output_tokens=40, hash_ids=[1, 2]),
            dict(arrival_ms=2000, input_tokens=32, output_tokens=1, hash_ids=[1, 2])]
    reqs, steps, info = run_offload(rows, tmp_path, caching=False, prompt_only=prompt_only)
    assert info["totals"]["cpu_blocks_stored"] == (2 if prompt_only else 4)
    assert info["totals"]["bytes_stored"] == (2 if prompt_only else 4) * 16_000
    assert steps.cpu_blocks_used.max() == (2 if prompt_only else 4)
    assert reqs.loc["r1", "cpu_hit_tokens"] == 31


def test_a_lookup_that_meets_a_copy_in_flight_waits_for_it(tmp_path):
    # Same A; B arrives at 20 ms, before A's stores complete (40 ms). vLLM 0.33's CPU manager answers
    # HIT_PENDING for A's first block, _maximal_prefix_lookup returns None, and the scheduler skips B
    # (it computes nothing meanwhile). The replica, idle, wakes when the copy completes (40 ms): B's
    # lookup then finds the 3 blocks, a full hit, loads 47 tokens over 30 ms (40 -> 70) and is
    # scheduled at 70 ms for the last token (done at 80).
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=20, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    reqs, steps, info = run_offload(rows, tmp_path, caching=False)
    b = reqs.loc["r1"]
    assert b.cpu_hit_tokens == 47 and b.cached_tokens == 0
    assert b.first_scheduled_ms == 70.0 and b.load_wait_ms == 30.0 and b.finish_ms == 80.0
    assert steps.start_ms.tolist() == [0.0, 70.0]  # nothing is computed while B waits
    assert info["totals"]["cpu_blocks_loaded"] == 3


def test_finished_request_keeps_gpu_blocks_until_stores_complete(tmp_path):
    # A finishes at 10 ms but its stores run until 40 ms: its 3 GPU blocks stay allocated, so B
    # (arriving at 20 ms, 96 tokens = 6 blocks, on a pool of 8 usable blocks) must wait for 40 ms.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=20, input_tokens=96, output_tokens=1, hash_ids=[4, 5, 6, 7, 8, 9])]
    reqs, steps, _ = run_offload(rows, tmp_path, num_gpu_blocks=9, caching=False)
    assert reqs.loc["r1", "first_scheduled_ms"] == 40.0


def test_load_delays_admission_by_at_least_one_step(tmp_path):
    # A near-instant H2D copy still costs one step: B's load starts at the schedule of step s and B
    # runs at step s + 1 at the earliest. C keeps the engine busy so steps continue.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=45, input_tokens=16, output_tokens=20, hash_ids=[7]),
            dict(arrival_ms=50, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    host = offload(h2d_gbps=1000.0)
    reqs, _, _ = run_offload(rows, tmp_path, caching=False, host=host)
    c = reqs.loc["r2"]
    assert c.cpu_hit_tokens == 47
    # r1 runs steps from 45 ms (45-55, 55-65, ...); r2 arrives at 50, is seen at 55 where its load
    # starts (done almost at once), and is admitted at the next step boundary, 65 ms.
    assert c.first_scheduled_ms == 65.0


def test_cpu_lru_evicts_least_recent_and_reports_usage(tmp_path):
    # 4 CPU blocks. A's stores land in reverse (vLLM touches a request's keys from the tail, so its
    # prefix head is most recent): LRU [3, 2, 1]. B's 3 new keys need 2 evictions from the front
    # (3 and 2), then land as [1, 6, 5, 4]. C (A's prompt) touches key 1 at lookup ([6, 5, 4, 1]) and
    # hits it alone: 16 tokens load from the CPU. C then stores 2 and 3, evicting 6 and 5: 4 in all.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=100, input_tokens=48, output_tokens=1, hash_ids=[4, 5, 6]),
            dict(arrival_ms=200, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    reqs, steps, info = run_offload(rows, tmp_path, caching=False, host=offload(num_cpu_blocks=4))
    assert reqs.loc["r2", "cpu_hit_tokens"] == 16
    assert info["totals"]["cpu_evictions"] == 4
    assert steps.cpu_blocks_used.max() == 4 and steps.cpu_usage.max() == 1.0


def test_cpu_store_is_all_or_nothing_when_nothing_can_be_evicted(tmp_path):
    # 2 CPU blocks and a 48-token prompt (3 offload blocks): vLLM's prepare_store cannot evict
    # enough and stores nothing for that request; the counters say so.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    _, steps, info = run_offload(rows, tmp_path, caching=False, host=offload(num_cpu_blocks=2))
    assert info["totals"]["cpu_blocks_stored"] == 0
    assert info["totals"]["cpu_store_skipped_full"] >= 3
    assert steps.cpu_blocks_used.max() == 0


def test_blocks_being_loaded_are_not_gpu_hits_until_the_load_completes(tmp_path):
    # 5 usable GPU blocks. A (48 tokens, keys 1-3) is stored to the CPU; X (64 tokens) then evicts
    # A's last two GPU blocks (tail first), so only key 1 stays on the GPU. R (A's prompt) hits key 1
    # on the GPU and loads keys 2-3 from the CPU (31 tokens, 20 ms). B (the same prompt) arrives while
    # that load runs: R's loading blocks are not findable yet (vLLM's delay_cache_blocks), so B hits
    # only key 1 on the GPU and loads the rest from the CPU itself.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=20, input_tokens=64, output_tokens=1, hash_ids=[7, 8, 9, 10]),
            dict(arrival_ms=40, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=45, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    reqs, _, _ = run_offload(rows, tmp_path, num_gpu_blocks=6, host=offload(d2h_gbps=1000.0))
    r, b = reqs.loc["r2"], reqs.loc["r3"]
    assert (r.cached_tokens, r.cpu_hit_tokens) == (16, 31)
    assert (b.cached_tokens, b.cpu_hit_tokens) == (16, 31)


def test_mtp_under_the_offload_connector_keeps_legacy_hashes_and_drops_the_last_hit(tmp_path):
    # vLLM 0.33 VllmConfig.num_hash_lookahead_tokens is 0 under a KV connector, so MTP falls back to
    # dropping the last hit block. 49 identical tokens: 3 blocks hit without the connector, 2 with.
    rows = [dict(input_tokens=49, output_tokens=1, hash_ids=[1, 2, 3, 4]),
            dict(arrival_ms=100, input_tokens=49, output_tokens=1, hash_ids=[1, 2, 3, 4])]
    plain, _, _, _ = run_small(rows, tmp_path / "a", num_gpu_blocks=64, config=mtp([0.5, 0.5]))
    g2, _, _, _ = run_small(rows, tmp_path / "b", num_gpu_blocks=64,
                            config={**mtp([0.5, 0.5]), "host_offload": offload()})
    assert (plain.cached_tokens[1], g2.cached_tokens[1]) == (48, 32)


def test_mtp_pad_spec_decode_for_an_admission_with_one_token_left(tmp_path):
    # vLLM 0.33 pad_spec_decode, k = 2 (single-layer head: hash lookahead 1). The second request's
    # 49 tokens hit 3 blocks (48 tokens), so one token is left; a decode is running and no prefill,
    # so it is admitted with 2 placeholder drafts (3 tokens), both rejected: it emits 1 token.
    rows = [dict(input_tokens=49, output_tokens=30, hash_ids=[1, 2, 3, 4]),
            dict(arrival_ms=100, input_tokens=49, output_tokens=5, hash_ids=[1, 2, 3, 4])]
    reqs, chunks, steps, _ = run_small(rows, tmp_path, num_gpu_blocks=64, config=mtp([0.0, 0.0]))
    assert reqs.cached_tokens[1] == 48
    join = steps[steps.running == 2].iloc[0]
    assert (join.scheduled_tokens, join.decode_requests, join.draft_tokens, join.accepted_tokens) == (6, 2, 4, 0)
    first = chunks[chunks.request_id == reqs.request_id[1]].iloc[0]
    assert first.tokens == 1

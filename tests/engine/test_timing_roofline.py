"""The roofline step-time model: spec reference points, per-request prefill attention, TP, MoE, MLA,
drafter, config wiring."""

import random
from dataclasses import astuple, replace

import pytest

from replay.base.errors import ConfigError
from replay.engine.config import load_config
from replay.engine.hardware import get_hardware
from replay.engine.models import get_model
from replay.engine.timing import build_timer, shape_from_requests
from replay.engine.timing.roofline import RooflineParams, RooflineTimer
from tests.engine_helpers import assert_decode_run_is_step_ms

H200 = get_hardware("h200_sxm")

# docs/timing.md: aiconfigurator-core 0.12.0, h200_sxm, vLLM 0.24.0, BF16, TP1 kernel times (ms).
REFERENCE = [
    ("decode 1 @ 1024", [], [1024], 4.86, 18.28),
    ("decode 64 @ 2048", [], [2048] * 64, 9.47, 29.11),
    ("decode 256 @ 2048", [], [2048] * 256, 23.54, 59.38),
    ("prefill 2048", [(2048, 0)], [], 43.40, 184.5),
    ("prefill 8192", [(8192, 0)], [], 198.9, 864.3),
    ("chunk 2048 over 6144", [(2048, 6144)], [], 53.74, 225.3),
    ("1024 prefill + 63 decodes", [(1024, 0)], [2048] * 63, 27.76, 116.9),
]
# Tolerance: each point within 12%, mean within 6% (the accuracy target, on the spec's points).
POINT_TOL, MEAN_TOL = 0.12, 0.06


def timer(model="meta-llama/Llama-3.1-8B", **kw):
    params = RooflineParams.from_hardware(H200).replace(host_overhead_ms=0.0)
    return RooflineTimer(get_model(model), H200, params, **kw)


def ms(t, prefills=(), decodes=(), drafts=0):
    return t.step_ms(*astuple(shape_from_requests(list(prefills), list(decodes), drafts=drafts)))


@pytest.mark.parametrize("model,col", [("meta-llama/Llama-3.1-8B", 3), ("Qwen/Qwen3-32B", 4)])
def test_reference_kernel_points(model, col):
    t = timer(model)
    errs = []
    for row in REFERENCE:
        label, prefills, decodes, ref = row[0], row[1], row[2], row[col]
        err = abs(ms(t, prefills, decodes) - ref) / ref
        assert err < POINT_TOL, (label, ms(t, prefills, decodes), ref)
        errs.append(err)
    assert sum(errs) / len(errs) < MEAN_TOL


def test_step_ms_equals_breakdown_on_random_steps():
    rng = random.Random(7)
    timers = [timer(), timer("Qwen/Qwen3-30B-A3B", tp=2), timer("deepseek-ai/DeepSeek-V3", tp=8, dtype="fp8",
                                                                   drafter="model"),
              timer("Qwen/Qwen3-32B", drafter="synthetic", tp=4)]
    for t in timers:
        for _ in range(200):
            pre = [(rng.randint(1, 4096), rng.choice([0, rng.randint(0, 20000)])) for _ in range(rng.randint(0, 3))]
            dec = [rng.randint(1, 30000) for _ in range(rng.randint(0, 100))]
            if not pre and not dec:
                continue
            shape = shape_from_requests(pre, dec, drafts=rng.choice([0, 1, 3]) if t.drafter else 0)
            fast = t.step_ms(*astuple(shape))
            bd = t.breakdown(shape)
            assert fast == pytest.approx(bd.step_ms, rel=1e-12)
            assert bd.step_ms == pytest.approx(sum(bd.parts.values()) + bd.host_overhead_ms, rel=1e-12)


def test_empty_step_costs_nothing():
    assert timer().step_ms(0, 0, 0, 0, 0, 0, 0, 0) == 0.0


def test_prefill_attention_is_per_request_not_averaged():
    uneven = shape_from_requests([(8000, 0), (192, 0)])
    averaged = shape_from_requests([(4096, 0), (4096, 0)])
    assert uneven.prefill_tokens == averaged.prefill_tokens
    assert uneven.prefill_attn_work == 8000 * 8001 // 2 + 192 * 193 // 2
    t = timer()
    assert t.breakdown(uneven).parts["prefill_attn"] > 1.8 * t.breakdown(averaged).parts["prefill_attn"]
    # linear cost depends only on token count
    assert t.breakdown(uneven).parts["linear"] == pytest.approx(t.breakdown(averaged).parts["linear"], rel=1e-3)


def test_cached_prefix_adds_attention_not_linear():
    t = timer()
    cold, warm = t.breakdown(shape_from_requests([(2048, 0)])), t.breakdown(shape_from_requests([(2048, 6144)]))
    assert warm.parts["linear"] == cold.parts["linear"]
    assert warm.parts["prefill_attn"] > 5 * cold.parts["prefill_attn"]


def test_decode_attention_streams_kv_at_eta_memory():
    t = timer()
    bd = t.breakdown(shape_from_requests([], [4096] * 32))
    expect_ms = 32 * 4096 * 131072 / (0.85 * 4.8e12) * 1e3
    assert bd.parts["decode_attn"] == pytest.approx(expect_ms, rel=1e-9)


def test_tensor_parallel_splits_work_and_adds_all_reduces():
    one, two = timer(), timer(tp=2)
    shape = shape_from_requests([(4096, 0)])
    b1, b2 = one.breakdown(shape), two.breakdown(shape)
    assert b1.parts["comm"] == 0.0 and b2.parts["comm"] > 0.0
    assert b2.parts["linear"] == pytest.approx(b1.parts["linear"] / 2, rel=0.02)
    # two all-reduces per layer: latency part for 1 token = 2 * L * latency
    tiny = two.breakdown(shape_from_requests([], [16]))
    lat = H200.timing.allreduce_latency_us.value
    assert tiny.parts["comm"] == pytest.approx(2 * 32 * lat * 1e-3, rel=0.01)
    assert b2.step_ms < b1.step_ms < 2 * b2.step_ms


def test_moe_reads_only_the_experts_it_touches():
    m = get_model("Qwen/Qwen3-30B-A3B")
    t = timer("Qwen/Qwen3-30B-A3B")
    one = t.breakdown(shape_from_requests([], [512])).parts["linear"]
    # batch 1: attention + router + 8 of 128 experts per layer, plus the LM head
    active = m.num_layers * (m.attn_params + m.moe_always_params + 8 * m.expert_params) + m.lm_head_params
    assert one == pytest.approx(active * 2 / (0.85 * 4.8e12) * 1e3, rel=1e-6)
    lin = [t.breakdown(shape_from_requests([], [512] * b)).parts["linear"] for b in (1, 4, 16, 64, 256)]
    assert lin == sorted(lin) and lin[-1] > 5 * lin[0]
    # batch 256 touches nearly every expert: at least 90% of all non-embedding weights are read
    everything = (m.total_params - m.embedding_params) * 2 / (0.85 * 4.8e12) * 1e3
    assert lin[-1] >= 0.9 * everything


def test_mla_decode_reads_the_latent():
    t = timer("deepseek-ai/DeepSeek-V3", tp=8, dtype="fp8", kv_dtype="fp8")
    assert t.kv_bytes_per_token == 61 * 576  # one latent per token per layer, not sharded by TP
    t16 = timer("deepseek-ai/DeepSeek-V3", tp=8, dtype="fp8", kv_dtype="bf16")
    assert t16.kv_bytes_per_token == 61 * 576 * 2
    shape = shape_from_requests([], [8192] * 64)
    assert t16.breakdown(shape).parts["decode_attn"] >= 64 * 8192 * t16.kv_bytes_per_token / (0.85 * 4.8e12) * 1e3
    # MLA decode with 128 heads over a 576-wide latent is compute-heavy: FLOPs can exceed the stream
    flops = 64 * 8192 * 61 * 2 * 16 * (2 * 512 + 64)
    assert t16.breakdown(shape).parts["decode_attn"] >= flops / (0.70 * 989.4e12) * 1e3 * 0.999


def test_fp8_weights_halve_memory_bound_linear():
    bf, f8 = timer(), timer(dtype="fp8")
    shape = shape_from_requests([], [512])
    lm = timer().breakdown(shape)
    assert f8.breakdown(shape).parts["linear"] < 0.6 * lm.parts["linear"]
    assert bf.breakdown(shape_from_requests([(8192, 0)])).parts["linear"] > \
        1.8 * f8.breakdown(shape_from_requests([(8192, 0)])).parts["linear"]


def test_drafter_costs_grow_with_passes():
    t = timer("deepseek-ai/DeepSeek-V3", tp=8, dtype="fp8", drafter="model")
    costs = [t.breakdown(shape_from_requests([], [2048] * 32, drafts=k)).parts["drafter"] for k in (1, 2, 3)]
    assert 0 < costs[0] < costs[1] < costs[2]
    base = t.breakdown(shape_from_requests([], [2048] * 32)).step_ms
    assert costs[0] < 0.2 * base  # one layer out of 61 plus the LM head
    syn = timer(drafter="synthetic")
    assert syn.breakdown(shape_from_requests([], [2048] * 64, drafts=1)).parts["drafter"] > 0


def test_drafter_model_without_mtp_head_is_rejected():
    with pytest.raises(ValueError, match="no MTP head"):
        timer(drafter="model")


def test_build_timer_wiring(tmp_path):
    t = build_timer(load_config(None, []))
    assert t.host_overhead_ms == 1.0 and t.backend == "roofline"
    assert build_timer(load_config(None, ["timing.host_overhead_ms=0.3"])).host_overhead_ms == 0.3
    with pytest.raises(ConfigError, match="drafter: synthetic"):
        build_timer(load_config(None, ["speculative.num_speculative_tokens=2"]))
    t = build_timer(load_config(None, ["speculative.num_speculative_tokens=2", "speculative.drafter=synthetic"]))
    assert t.drafter == "synthetic"
    t = build_timer(load_config(None, ["model=XiaomiMiMo/MiMo-7B-Base", "speculative.num_speculative_tokens=1"]))
    assert t.drafter == "model"
    assert build_timer(load_config(None, ["kv_cache.cache_dtype=fp8"])).kv_bytes_per_token == 65536


def test_params_from_profile_replace():
    p = RooflineParams.from_hardware(H200)
    q = p.replace(eta_compute=0.5)
    assert q.eta_compute == 0.5 and replace(q, eta_compute=p.eta_compute) == p


@pytest.mark.parametrize("model,tp", [("meta-llama/Llama-3.1-8B", 1), ("meta-llama/Llama-3.1-70B", 4),
                                      ("Qwen/Qwen3-30B-A3B", 1), ("deepseek-ai/DeepSeek-V3", 8)])
def test_decode_window_step_times_are_bit_identical_to_step_ms(model, tp):
    """Decode windows time runs of steps from decode_run (decode_step_terms) in compiled code; a single
    differing bit would change the outputs, so every step must equal the scalar step_ms exactly,
    and every start time the running sum of the durations."""
    from replay.engine.config import EngineConfig
    from replay.engine.timing import build_timer

    timer = build_timer(EngineConfig(model=model, tensor_parallel_size=tp))
    for nrun, ctx0 in ((1, 1), (3, 4097), (17, 123_457), (256, 2_000_003)):
        assert_decode_run_is_step_ms(timer, timer, nrun, ctx0, 300)


# --- the mixed-step term ------------------------------------------------------------------------

_MIXED_SHAPES = [((), [2048] * 32), (((64, 0),), [2048] * 32), (((2048, 6144),), ()), (((512, 0), (64, 128)), [900] * 7)]


def test_mixed_term_is_off_by_default_and_changes_nothing():
    from replay.engine.hardware import get_hardware
    from replay.engine.models import get_model
    from replay.engine.timing import RooflineParams, RooflineTimer, shape_from_requests

    hw, model = get_hardware("h200_sxm"), get_model("meta-llama/Llama-3.1-8B")
    base = RooflineParams.from_hardware(hw)
    assert base.mixed_layer_us == 0.0
    plain, zero = RooflineTimer(model, hw, base), RooflineTimer(model, hw, base.replace(mixed_layer_us=0.0))
    for prefills, decodes in _MIXED_SHAPES:
        args = astuple(shape_from_requests(list(prefills), decodes))
        assert zero.step_ms(*args) == plain.step_ms(*args)  # bit for bit
        assert "mixed_overhead" not in plain.breakdown(shape_from_requests(list(prefills), decodes)).parts


def test_mixed_term_adds_to_steps_with_a_prefill_chunk_only():
    """Steps carrying a prefill chunk pay L * mixed_layer_us; decode-only steps (and decode windows) do not."""
    from replay.engine.hardware import get_hardware
    from replay.engine.models import get_model
    from replay.engine.timing import RooflineParams, RooflineTimer, shape_from_requests

    hw, model = get_hardware("h200_sxm"), get_model("meta-llama/Llama-3.1-8B")
    base = RooflineParams.from_hardware(hw)
    plain, mixed = RooflineTimer(model, hw, base), RooflineTimer(model, hw, base.replace(mixed_layer_us=20.0))
    for prefills, decodes in _MIXED_SHAPES:
        shape = shape_from_requests(list(prefills), decodes)
        extra = mixed.step_ms(*astuple(shape)) - plain.step_ms(*astuple(shape))
        assert extra == pytest.approx(32 * 20e-3 if prefills else 0.0, abs=1e-12)
        bd = mixed.breakdown(shape)
        assert bd.parts["mixed_overhead"] == pytest.approx(32 * 20e-3 if prefills else 0.0)
        assert bd.step_ms == pytest.approx(mixed.step_ms(*astuple(shape)), rel=1e-12)
    assert mixed.decode_step_terms(16) == plain.decode_step_terms(16)


def test_mixed_term_from_config_and_profile(tmp_path):
    from replay.engine.config import EngineConfig
    from replay.engine.timing.profile import (
        FitStats,
        ProfileParams,
        TimingProfile,
        load_profile,
        save_profile,
    )

    timer = build_timer(EngineConfig.model_validate({"timing": {"mixed_layer_us": 12.5}}))
    assert timer.params.mixed_layer_us == 12.5
    with pytest.raises(ValueError):
        EngineConfig.model_validate({"timing": {"mixed_layer_us": -1}})
    params = RooflineParams.from_hardware(get_hardware("h200_sxm"))
    fit = FitStats(steps_csv="x", num_steps=3, mape=0.1, max_ape=0.2, mape_before=0.3, host_overhead_fixed=False)
    for value in (0.0, 7.0):
        path = tmp_path / f"p{value}.yaml"
        save_profile(TimingProfile(hardware="h200_sxm", model="m", tensor_parallel_size=1, dtype="bf16",
                                   params=ProfileParams(**params.replace(mixed_layer_us=value).as_dict()), fit=fit),
                     path)
        assert ("mixed_layer_us" in path.read_text()) == bool(value)  # profiles without the term are unchanged
        assert load_profile(path).roofline_params().mixed_layer_us == value
    timer = build_timer(EngineConfig.model_validate({"timing": {"profile": str(tmp_path / "p7.0.yaml")}}))
    assert timer.params.mixed_layer_us == 7.0

"""The embedded step-time model: a roofline over one vLLM forward step (docs/timing.md).

Per tensor-parallel rank, in ms:
  linear      max(flops / (eta_c * peak), weight bytes / (eta_m * bw)) per weight group (dense
              weights, routed experts with the experts the step actually touches, LM head)
  prefill     per request causal pairs (``prefill_attn_work``, never averaged across chunks) at
              eta_a * peak, or the cached-prefix KV stream at eta_m * bw when that is longer
  decode      each request's KV streamed once at eta_m * bw (or its attention FLOPs, for MLA)
  comm        two all-reduces per layer over the TP link (NVLink, PCIe or xGMI) when tp > 1
  overheads   L * tau_layer (GPU) + host overhead per step; steps with a prefill chunk also
              L * mixed_layer (eager attention and launches outside the CUDA graph; 0 unless set)
  drafter     k MTP passes: one drafter layer + LM head each (first over all scheduled tokens)

``step_ms`` is the hot path (called once per engine step): all constants are folded at construction
so a call is a few dozen float operations. ``breakdown`` computes the same sum part by part; a test
checks the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from replay.engine.config import DTYPE_BYTES
from replay.engine.hardware import HardwareProfile
from replay.engine.models import ModelSpec
from replay.engine.timing.base import StepBreakdown, StepShape
from replay.engine.timing.roofline_decode import RooflineDecodeRun

_ACT_BYTES = 2  # activations all-reduced in BF16 (vLLM keeps the residual stream in the model dtype)


@dataclass(frozen=True, slots=True)
class RooflineParams:
    """The fitted knobs; defaults come from the hardware profile's ``timing`` section."""

    eta_compute: float
    eta_attention: float
    eta_memory: float
    tau_layer_us: float
    host_overhead_ms: float
    allreduce_latency_us: float
    eta_nvlink: float
    mixed_layer_us: float = 0.0  # per layer, on steps with a prefill chunk; 0: off (the default)

    @classmethod
    def from_hardware(cls, hw: HardwareProfile) -> RooflineParams:
        t = hw.timing
        values = {}
        for f in fields(cls):
            figure = getattr(t, f.name)
            if figure is not None:
                values[f.name] = figure.value
        return cls(**values)

    def replace(self, **changes: float) -> RooflineParams:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return RooflineParams(**values)

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class _Group:
    """Linear weights of a set of layers, folded to ms coefficients for one rank."""

    c_tok: float      # ms per token (compute side)
    t_mem: float      # ms to read the always-used weights once
    n_exp: int        # routed experts per MoE layer (0: none)
    keep: float       # 1 - experts_per_token / n_exp (chance a token misses a given expert)
    c_tok_exp: float  # ms per token for its routed experts (compute side)
    t_exp: float      # ms to read one routed expert in every MoE layer of the group

    def time(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        t = max(tokens * self.c_tok, self.t_mem)
        if self.n_exp:
            # Expected distinct experts touched under uniform routing: E * (1 - (1 - k/E)^T).
            touched = self.n_exp * (1.0 - self.keep ** tokens)
            t += max(tokens * self.c_tok_exp, touched * self.t_exp)
        return t


def _group(model: ModelSpec, n_layers_dense: int, n_layers_moe: int, extra_params: int,
           tp: int, w_bytes: int, peak: float, bw: float, p: RooflineParams) -> _Group:
    always = n_layers_dense * model.layer_params(False) \
        + n_layers_moe * (model.attn_params + model.moe_always_params) + extra_params
    c_flop = 1e3 / (p.eta_compute * peak)
    c_mem = 1e3 / (p.eta_memory * bw)
    n_exp = model.num_experts if n_layers_moe else 0
    exp_params = n_layers_moe * model.expert_params / tp
    return _Group(
        c_tok=2.0 * always / tp * c_flop,
        t_mem=always / tp * w_bytes * c_mem,
        n_exp=n_exp,
        keep=(1.0 - model.experts_per_token / n_exp) if n_exp else 1.0,
        c_tok_exp=2.0 * model.experts_per_token * exp_params * c_flop,
        t_exp=exp_params * w_bytes * c_mem,
    )


class RooflineTimer:
    """The spec's roofline, per tensor-parallel rank. See the module docstring for the terms."""

    backend = "roofline"

    def __init__(self, model: ModelSpec, hw: HardwareProfile, params: RooflineParams | None = None, *,
                 tp: int = 1, dtype: str = "bf16", kv_dtype: str = "bf16",
                 drafter: str | None = None) -> None:
        if drafter not in (None, "model", "synthetic"):
            raise ValueError(f"drafter must be None, 'model' or 'synthetic', not {drafter!r}")
        p = params or RooflineParams.from_hardware(hw)
        self.model, self.hw, self.params = model, hw, p
        self.tp, self.dtype, self.kv_dtype, self.drafter = tp, dtype, kv_dtype, drafter
        self.host_overhead_ms = p.host_overhead_ms
        L = model.num_layers
        w_bytes = DTYPE_BYTES[dtype]
        peak = hw.peak_flops(dtype)
        peak16 = hw.gpu.bf16_dense_flops.value  # attention and the (unquantized) LM head run in BF16
        bw = hw.gpu.hbm_bw.value
        c_mem = 1e3 / (p.eta_memory * bw)
        nq = max(1, model.num_q_heads // tp)

        # Target model linear layers (all layers) and the LM head (vocab-parallel, BF16 in vLLM fp8).
        self._body = _group(model, L - model.num_moe_layers, model.num_moe_layers, 0, tp, w_bytes, peak, bw, p)
        lm = model.lm_head_params / tp
        self._lm_c = 2.0 * lm * 1e3 / (p.eta_compute * peak16)
        self._lm_t = lm * 2 * c_mem
        # MLA prefill re-expands cached latents through kv_b_proj (vLLM's MLA prefill path).
        if model.is_mla:
            kv_b = model.kv_lora_rank * model.num_q_heads * (model.head_dim - model.qk_rope_head_dim
                                                             + model.v_head_dim) / tp
            self._mla_ctx_c = 2.0 * L * kv_b * 1e3 / (p.eta_compute * peak)
        else:
            self._mla_ctx_c = 0.0

        # Attention.
        kv_bytes_tok_layer = model.kv_elems_per_token_per_layer(tp) * DTYPE_BYTES[kv_dtype]
        self.kv_bytes_per_token = L * kv_bytes_tok_layer
        self._kv_c = self.kv_bytes_per_token * c_mem                # ms per KV token streamed, all layers
        pair_flops = 2.0 * nq * (model.head_dim + model.v_head_dim)  # one (query, key) pair, one layer
        self._pa_c = L * pair_flops * 1e3 / (p.eta_attention * peak16)
        if model.is_mla:  # absorbed MLA decode: scores over the latent + rope, values over the latent
            dec_pair = 2.0 * nq * (2 * model.kv_lora_rank + model.qk_rope_head_dim)
        else:
            dec_pair = pair_flops
        self._da_c = L * dec_pair * 1e3 / (p.eta_attention * peak16)

        # Tensor-parallel all-reduces: two per layer (after attention and after the MLP), ring cost.
        if tp > 1:
            self._ar_lat = 2 * L * p.allreduce_latency_us * 1e-3
            self._ar_c = 2 * L * (2.0 * (tp - 1) / tp) * model.hidden_size * _ACT_BYTES * 1e3 \
                / (p.eta_nvlink * hw.tp_link_bw(tp))
        else:
            self._ar_lat = self._ar_c = 0.0
        self._layer_ms = L * p.tau_layer_us * 1e-3
        self._tau_ms = p.tau_layer_us * 1e-3
        # Steps that carry a prefill chunk run outside the full CUDA graph of decode-only batches.
        self._mixed_ms = L * p.mixed_layer_us * 1e-3

        # Drafter: one layer per pass (the MTP head, or one more target layer when synthetic).
        if drafter == "model" and model.num_mtp_layers == 0:
            raise ValueError(f"{model.name} has no MTP head")
        if drafter is not None:
            moe = model.is_moe
            extra = 2 * model.hidden_size * model.hidden_size if drafter == "model" else 0
            self._draft = _group(model, 0 if moe else 1, 1 if moe else 0, extra, tp, w_bytes, peak, bw, p)
            self._d_inv_L = 1.0 / L
        else:
            self._draft = None
            self._d_inv_L = 0.0

    # ------------------------------------------------------------------------------------------
    def step_ms(self, num_prefill_reqs: int, prefill_tokens: int, prefill_ctx_tokens: int,
                prefill_attn_work: int, num_decode_reqs: int, decode_query_tokens: int,
                decode_ctx_tokens: int, num_spec_passes: int) -> float:
        """Whole step time in ms, host overhead included (hot path: keep it flat)."""
        T = prefill_tokens + decode_query_tokens
        if T <= 0:
            return 0.0
        body = self._body
        t = body.c_tok * T
        if t < body.t_mem:
            t = body.t_mem
        if body.n_exp:
            te = T * body.c_tok_exp
            tm = body.n_exp * (1.0 - body.keep ** T) * body.t_exp
            t += te if te > tm else tm
        rows = num_prefill_reqs + decode_query_tokens
        lm = rows * self._lm_c
        t += lm if lm > self._lm_t else self._lm_t
        if prefill_tokens:
            pa = prefill_attn_work * self._pa_c
            pk = prefill_ctx_tokens * self._kv_c
            t += (pa if pa > pk else pk) + prefill_ctx_tokens * self._mla_ctx_c + self._mixed_ms
        if num_decode_reqs:
            dm = decode_ctx_tokens * self._kv_c
            dc = decode_ctx_tokens * decode_query_tokens / num_decode_reqs * self._da_c
            t += dm if dm > dc else dc
        t += self._ar_lat + T * self._ar_c + self._layer_ms
        if num_spec_passes and self._draft is not None:
            t += self._drafter_ms(num_prefill_reqs, T, prefill_attn_work, prefill_ctx_tokens,
                                  num_decode_reqs, decode_ctx_tokens, num_spec_passes)
        return t + self.host_overhead_ms

    def min_step_ms(self) -> float:
        """A lower bound on any step's duration: one token, no attention context (every term of
        ``step_ms`` is non-decreasing in tokens, rows and context). The fleet uses it to bound how
        soon a request can finish (engine/fleet.py)."""
        return self.step_ms(1, 1, 0, 0, 0, 0, 0, 0)

    def decode_run(self, nrun: int) -> RooflineDecodeRun:
        """The DecodeRun (engine/timing/base.py) of a decode window of ``nrun`` requests."""
        return RooflineDecodeRun(self.decode_step_terms(nrun), nrun)

    def decode_step_terms(self, nrun: int) -> tuple[float, float, float, float, float]:
        """The terms of ``step_ms`` for a decode-only step of ``nrun`` requests (one token each, no
        drafts), so decode windows can time a run of steps in compiled code: (t, kv_c, da_c, tail,
        host) where a step over ``ctx`` context tokens lasts
        ``((t + max(ctx * kv_c, ctx * nrun / nrun * da_c)) + tail) + host``, evaluated in exactly
        that order (engine/timing/roofline_decode.py; tests/engine/test_timing_roofline.py requires
        bit-identical results). The first lines repeat step_ms's on purpose: step_ms stays one flat
        function (it is called for every step), and the test fails if the two drift."""
        T = nrun
        body = self._body
        t = body.c_tok * T
        if t < body.t_mem:
            t = body.t_mem
        if body.n_exp:
            te = T * body.c_tok_exp
            tm = body.n_exp * (1.0 - body.keep ** T) * body.t_exp
            t += te if te > tm else tm
        lm = nrun * self._lm_c
        t += lm if lm > self._lm_t else self._lm_t
        return t, self._kv_c, self._da_c, self._ar_lat + T * self._ar_c + self._layer_ms, self.host_overhead_ms

    def _drafter_ms(self, num_prefill_reqs: int, T: int, prefill_attn_work: int, prefill_ctx_tokens: int,
                    num_decode_reqs: int, decode_ctx_tokens: int, k: int) -> float:
        """k sequential drafter passes: the first over every scheduled token, the rest one token per
        request; each pays one layer, the LM head over one row per request, and a layer overhead."""
        d = self._draft
        reqs = num_prefill_reqs + num_decode_reqs
        inv_L = self._d_inv_L
        lm = reqs * self._lm_c
        lm = lm if lm > self._lm_t else self._lm_t
        per_pass_fixed = lm + self._tau_ms + inv_L * self._ar_lat
        pa = prefill_attn_work * self._pa_c
        pk = prefill_ctx_tokens * self._kv_c
        first = d.time(T) + inv_L * ((pa if pa > pk else pk) + decode_ctx_tokens * self._kv_c
                                     + T * self._ar_c)
        rest = d.time(reqs) + inv_L * ((decode_ctx_tokens + prefill_ctx_tokens) * self._kv_c
                                       + reqs * self._ar_c)
        return first + (k - 1) * rest + k * per_pass_fixed

    # ------------------------------------------------------------------------------------------
    def breakdown(self, shape: StepShape) -> StepBreakdown:
        """The same model as ``step_ms``, split into named parts (ms)."""
        s = shape
        T = s.prefill_tokens + s.decode_query_tokens
        parts = dict.fromkeys(("linear", "prefill_attn", "decode_attn", "comm", "layer_overhead", "drafter"),
                              0.0)
        if T <= 0:
            return StepBreakdown(step_ms=0.0, host_overhead_ms=0.0, parts=parts)
        rows = s.num_prefill_reqs + s.decode_query_tokens
        parts["linear"] = self._body.time(T) + max(rows * self._lm_c, self._lm_t) \
            + s.prefill_ctx_tokens * self._mla_ctx_c
        if s.prefill_tokens:
            parts["prefill_attn"] = max(s.prefill_attn_work * self._pa_c, s.prefill_ctx_tokens * self._kv_c)
        if self._mixed_ms:  # the key exists only when the term is configured
            parts["mixed_overhead"] = self._mixed_ms if s.prefill_tokens else 0.0
        if s.num_decode_reqs:
            parts["decode_attn"] = max(s.decode_ctx_tokens * self._kv_c,
                                       s.decode_ctx_tokens * s.decode_query_tokens / s.num_decode_reqs * self._da_c)
        parts["comm"] = self._ar_lat + T * self._ar_c
        parts["layer_overhead"] = self._layer_ms
        if s.num_spec_passes and self._draft is not None:
            parts["drafter"] = self._drafter_ms(s.num_prefill_reqs, T, s.prefill_attn_work, s.prefill_ctx_tokens,
                                                s.num_decode_reqs, s.decode_ctx_tokens, s.num_spec_passes)
        total = sum(parts.values()) + self.host_overhead_ms
        return StepBreakdown(step_ms=total, host_overhead_ms=self.host_overhead_ms, parts=parts)

"""ModelSpec: the architecture facts the step-time and KV-capacity models need, read from HF config keys.

One parser serves the shipped catalog and a user's local ``config.json``, so both paths stay in step.
Parameter counts follow the vLLM module layout (QKV, O, gate/up/down; MLA's low-rank projections;
routed and shared experts) and ignore norms and biases (well under 0.1% of the weights).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replay.base.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int               # q/k head dim for GQA; MLA: qk_nope + qk_rope
    v_head_dim: int             # equals head_dim for GQA
    intermediate_size: int      # dense MLP width
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    # MoE (num_experts == 0: dense model)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0   # layers with a dense MLP in an MoE model (DeepSeek first_k_dense_replace)
    # MLA (kv_lora_rank == 0: not MLA)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    num_mtp_layers: int = 0     # MTP draft heads shipped with the checkpoint (num_nextn_predict_layers)
    checkpoint_dtype: str = "bf16"  # what the published weights are stored in (informational)
    aic_name: str | None = None     # name aiconfigurator-core knows; a local folder path also works there

    # --- derived facts -------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def attn_params(self) -> int:
        """Attention projection weights of one layer."""
        h, nq = self.hidden_size, self.num_q_heads
        if self.is_mla:
            nope = self.head_dim - self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * nq * self.head_dim) if self.q_lora_rank \
                else h * nq * self.head_dim
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * nq * (nope + self.v_head_dim)
            return q + kv_a + kv_b + nq * self.v_head_dim * h
        d = self.head_dim
        return h * nq * d + 2 * h * self.num_kv_heads * d + nq * d * h

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def moe_always_params(self) -> int:
        """Weights every token of an MoE layer uses: router and shared experts."""
        return self.hidden_size * self.num_experts + self.num_shared_experts * self.expert_params

    @property
    def embedding_params(self) -> int:
        return self.hidden_size * self.vocab_size

    @property
    def lm_head_params(self) -> int:
        return self.hidden_size * self.vocab_size

    def layer_params(self, moe: bool) -> int:
        """All weights of one layer (every expert counted)."""
        if moe:
            return self.attn_params + self.moe_always_params + self.num_experts * self.expert_params
        return self.attn_params + self.dense_mlp_params

    @property
    def total_params(self) -> int:
        """Weights of the target model as served (MTP heads excluded), embeddings and LM head included."""
        body = (self.num_layers - self.num_moe_layers) * self.layer_params(False) \
            + self.num_moe_layers * self.layer_params(True)
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return body + self.embedding_params + head

    @property
    def mtp_layer_params(self) -> int:
        """One MTP head: a decoder layer like the last target layer plus the 2h x h fusion projection
        (DeepSeek-V3 ``eh_proj``, MiMo likewise); it shares the target's embedding and LM head."""
        return self.layer_params(self.is_moe) + 2 * self.hidden_size * self.hidden_size

    def kv_elems_per_token_per_layer(self, tp: int) -> int:
        """KV cache elements one token stores in one layer on one tensor-parallel rank.

        GQA: K and V for the rank's KV heads; vLLM replicates KV heads when tp > num_kv_heads.
        MLA: one latent (kv_lora_rank + rope dim) per token, replicated on every rank, no factor 2
        (vLLM's v1/core/kv_cache_utils.py).
        """
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        kv_heads_per_rank = max(1, self.num_kv_heads // tp)
        return 2 * kv_heads_per_rank * self.head_dim


def _int(cfg: Mapping[str, Any], key: str, source: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ConfigError(f"{source}: missing field '{key}' in the model config")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{source}: field '{key}' must be a non-negative integer, got {value!r}")
    return value


# Keys a Hub config.json may omit because the transformers config class has a default for them
# (transformers' Gemma2Config / Gemma3TextConfig): without these a Gemma 3 text_config would lack its
# vocabulary, length and head size, and every Gemma would be counted with an untied LM head.
HF_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma": {"tie_word_embeddings": True, "head_dim": 256},
    "gemma2": {"tie_word_embeddings": True, "head_dim": 256},
    "gemma3_text": {"tie_word_embeddings": True, "head_dim": 256, "vocab_size": 262208,
                    "max_position_embeddings": 131072},
}


def spec_from_hf_config(cfg: Mapping[str, Any], *, name: str, source: str,
                        aic_name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from Hugging Face config.json keys (Llama, Mistral, Mixtral, Qwen2/3, Qwen3-MoE,
    Gemma 2/3, DeepSeek-V3, MiMo)."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{source}: a model config must be a JSON/YAML object")
    archs = cfg.get("architectures") or ["unknown"]
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        cfg = cfg["text_config"]  # multimodal wrappers keep the language model under text_config
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{source}: field 'text_config' must be an object")
    cfg = {**HF_CLASS_DEFAULTS.get(str(cfg.get("model_type", "")), {}), **cfg}
    layers = _int(cfg, "num_hidden_layers", source)
    hidden = _int(cfg, "hidden_size", source)
    nq = _int(cfg, "num_attention_heads", source)
    nkv = _int(cfg, "num_key_value_heads", source, nq)
    if layers == 0 or hidden == 0 or nq == 0 or nkv == 0:
        raise ConfigError(f"{source}: num_hidden_layers, hidden_size and the head counts must be > 0")
    kv_lora = _int(cfg, "kv_lora_rank", source, 0) or 0
    if kv_lora:
        rope = _int(cfg, "qk_rope_head_dim", source)
        head_dim = _int(cfg, "qk_nope_head_dim", source) + rope
        v_head = _int(cfg, "v_head_dim", source)
    else:
        rope = 0
        head_dim = _int(cfg, "head_dim", source, hidden // nq)
        v_head = head_dim
    num_experts = _int(cfg, "n_routed_experts", source, 0) or _int(cfg, "num_experts", source, 0) \
        or _int(cfg, "num_local_experts", source, 0)
    dense_layers = 0
    if num_experts:
        if "first_k_dense_replace" in cfg:
            dense_layers = _int(cfg, "first_k_dense_replace", source)
        else:
            step = _int(cfg, "decoder_sparse_step", source, 1) or 1
            mlp_only = cfg.get("mlp_only_layers") or []
            if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
                raise ConfigError(f"{source}: field 'mlp_only_layers' must be a list of layer indices")
            mlp_only = set(mlp_only)
            dense_layers = sum(1 for i in range(layers) if i in mlp_only or (i + 1) % step != 0)
    moe_width = _int(cfg, "moe_intermediate_size", source, 0) if num_experts else 0
    if num_experts and not moe_width and "num_local_experts" in cfg:
        moe_width = _int(cfg, "intermediate_size", source)  # Mixtral: every expert is a full-width MLP
    quant = cfg.get("quantization_config") or {}
    checkpoint_dtype = "fp8" if isinstance(quant, Mapping) and quant.get("quant_method") == "fp8" else "bf16"
    sizes = {"head_dim": head_dim, "v_head_dim": v_head, "intermediate_size": _int(cfg, "intermediate_size", source),
             "vocab_size": _int(cfg, "vocab_size", source),
             "max_position_embeddings": _int(cfg, "max_position_embeddings", source)}
    if num_experts:
        sizes["num_experts_per_tok"] = _int(cfg, "num_experts_per_tok", source, 0)
        sizes["moe_intermediate_size"] = moe_width
    zero = [key for key, value in sizes.items() if value <= 0]
    if zero:  # a zero width would price every step at nothing (or divide by zero)
        raise ConfigError(f"{source}: field '{zero[0]}' must be > 0 (a model's every dimension is at least 1)")
    if num_experts and sizes["num_experts_per_tok"] > num_experts:
        raise ConfigError(f"{source}: field 'num_experts_per_tok' ({sizes['num_experts_per_tok']}) exceeds the "
                          f"{num_experts} experts")
    return ModelSpec(
        name=name,
        architecture=str(archs[0]) if isinstance(archs, list) else str(archs),
        num_layers=layers,
        hidden_size=hidden,
        num_q_heads=nq,
        num_kv_heads=nkv,
        head_dim=head_dim,
        v_head_dim=v_head,
        intermediate_size=_int(cfg, "intermediate_size", source),
        vocab_size=_int(cfg, "vocab_size", source),
        max_position_embeddings=_int(cfg, "max_position_embeddings", source),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts=num_experts,
        experts_per_token=_int(cfg, "num_experts_per_tok", source, 0) if num_experts else 0,
        moe_intermediate_size=moe_width,
        num_shared_experts=_int(cfg, "n_shared_experts", source, 0) or 0,
        num_dense_layers=dense_layers,
        q_lora_rank=_int(cfg, "q_lora_rank", source, 0) or 0,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        num_mtp_layers=_int(cfg, "num_nextn_predict_layers", source, 0) or 0,
        checkpoint_dtype=checkpoint_dtype,
        aic_name=aic_name,
    )

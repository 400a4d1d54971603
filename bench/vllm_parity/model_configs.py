"""Local model folders (config.json only) that vLLM and replay both read, so no download is needed.

Values are those of the public Hugging Face config.json of meta-llama/Llama-3.1-8B and
deepseek-ai/DeepSeek-V3 (the quantization block left out: the scheduler never sees weights). The
DeepSeek folder is written once per MTP layer count: ``num_nextn_predict_layers`` is what decides
vLLM's prefill lookahead (1 for a single-layer MTP head, k for a k-layer one).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.vllm_parity.workloads import Workload

LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": False, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256,
}

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_group": 4,
    "topk_method": "noaux_tc", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}


def model_dir(w: Workload, root: Path) -> Path:
    """The folder for a workload's model, written if missing (never overwritten)."""
    if w.num_spec_tokens:
        name, cfg = f"deepseek-v3-mtp{w.mtp_layers}", {**DEEPSEEK_V3, "num_nextn_predict_layers": w.mtp_layers}
    else:
        name, cfg = "llama-3.1-8b", LLAMA_3_1_8B
    d = root / name
    path = d / "config.json"
    if not path.exists():
        d.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name("config.json.tmp")
        tmp.write_text(json.dumps(cfg, indent=1))
        tmp.replace(path)
    return d

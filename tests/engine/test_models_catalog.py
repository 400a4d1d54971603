"""Model catalog: names, aliases, HF config.json parsing, derived architecture facts."""

import json

import pytest

from replay.base.errors import ConfigError
from replay.engine.models import get_model, list_models

# Published parameter counts (model cards), in billions.
PUBLISHED_B = {
    "meta-llama/Llama-3.1-8B": 8.03,
    "meta-llama/Llama-3.1-70B": 70.6,
    "Qwen/Qwen3-8B": 8.2,
    "Qwen/Qwen3-32B": 32.8,
    "Qwen/Qwen3-30B-A3B": 30.5,
    "deepseek-ai/DeepSeek-V3": 671.0,
    "meta-llama/Llama-2-7b-hf": 6.74,
    "meta-llama/Llama-2-13b-hf": 13.0,
    "meta-llama/Llama-2-70b-hf": 69.0,
    "codellama/CodeLlama-34b-hf": 33.7,
    "meta-llama/Llama-3.2-1B": 1.24,
    "meta-llama/Llama-3.2-3B": 3.21,
    "mistralai/Mistral-7B-v0.1": 7.24,
    "mistralai/Mixtral-8x7B-v0.1": 46.7,
    "mistralai/Mixtral-8x22B-v0.1": 141.0,
    "Qwen/Qwen2.5-7B-Instruct": 7.61,
    "Qwen/Qwen2.5-72B-Instruct": 72.7,
    "Qwen/Qwen3-14B": 14.8,
    "Qwen/Qwen3-235B-A22B": 235.0,
    "google/gemma-2-9b-it": 9.24,
    "google/gemma-2-27b-it": 27.2,
}

FAMILIES = ("meta-llama/Llama-2-", "codellama/CodeLlama-", "meta-llama/Meta-Llama-3-", "meta-llama/Llama-3.2-",
            "meta-llama/Llama-3.3-", "mistralai/Mistral-7B", "mistralai/Mixtral-8x7B", "mistralai/Mixtral-8x22B",
            "Qwen/Qwen2.5-", "Qwen/Qwen3-", "google/gemma-2-", "google/gemma-3-")


def test_catalog_has_the_issue_models():
    names = set(list_models())
    assert set(PUBLISHED_B) | {"XiaomiMiMo/MiMo-7B-Base"} <= names


@pytest.mark.parametrize("name,billions", sorted(PUBLISHED_B.items()))
def test_parameter_counts_match_model_cards(name, billions):
    assert get_model(name).total_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_catalog_covers_the_common_families():
    names = list_models()
    for family in FAMILIES:
        assert any(n.startswith(family) for n in names), family
    assert len(names) == len(set(names))


def test_mixtral_experts_are_full_width_mlps():
    """Mixtral's config has no moe_intermediate_size: each of its 8 experts is an intermediate_size MLP."""
    m = get_model("mistralai/Mixtral-8x7B-v0.1")
    assert m.num_experts == 8 and m.experts_per_token == 2 and m.moe_intermediate_size == 14336
    assert m.num_moe_layers == 32 and m.num_dense_layers == 0
    # active parameters per token: about 12.9B (Mistral AI's announcement)
    active = m.total_params - m.num_moe_layers * (m.num_experts - m.experts_per_token) * m.expert_params
    assert active / 1e9 == pytest.approx(12.9, rel=0.01)


def test_gemma_ties_its_lm_head_even_when_the_config_omits_the_key(tmp_path):
    """Gemma configs on the Hub leave tie_word_embeddings (and Gemma 3's vocab and length) to the
    transformers class defaults; a multimodal Gemma 3 keeps the language model under text_config."""
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"],
           "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 62, "hidden_size": 5376,
                           "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
                           "intermediate_size": 21504},
           "vision_config": {"model_type": "siglip_vision_model"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = get_model(str(tmp_path))
    cat = get_model("google/gemma-3-27b-it")
    assert spec.architecture == "Gemma3ForConditionalGeneration"
    assert spec.tie_word_embeddings and spec.vocab_size == 262208 and spec.max_position_embeddings == 131072
    assert spec.total_params == cat.total_params


def test_aliases_resolve_case_insensitively():
    assert get_model("meta-llama/Meta-Llama-3.1-8B").name == "meta-llama/Llama-3.1-8B"
    assert get_model("META-LLAMA/meta-llama-3.1-70b").name == "meta-llama/Llama-3.1-70B"


def test_unknown_model_lists_the_catalog():
    with pytest.raises(ConfigError) as exc:
        get_model("no/such-model")
    assert "Qwen/Qwen3-32B" in str(exc.value) and "config.json" in str(exc.value)


def test_mtp_mla_and_moe_facts():
    ds = get_model("deepseek-ai/DeepSeek-V3")
    assert ds.is_mla and ds.is_moe and ds.num_mtp_layers == 1
    assert ds.num_moe_layers == 58 and ds.kv_elems_per_token_per_layer(8) == 512 + 64
    assert get_model("XiaomiMiMo/MiMo-7B-Base").num_mtp_layers == 1
    llama = get_model("meta-llama/Llama-3.1-8B")
    assert llama.num_mtp_layers == 0 and not llama.is_mla and not llama.is_moe
    assert llama.max_position_embeddings == 131072 and llama.num_layers == 32
    moe = get_model("Qwen/Qwen3-30B-A3B")
    assert moe.num_experts == 128 and moe.experts_per_token == 8 and moe.num_moe_layers == 48


def _write_config(tmp_path, **changes):
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "hidden_size": 512,
           "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1024, "vocab_size": 1000,
           "max_position_embeddings": 4096, "_name_or_path": "tiny/llama"}
    cfg.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_local_hf_config_file_and_folder(tmp_path):
    folder = _write_config(tmp_path)
    for arg in (str(folder), str(folder / "config.json")):
        spec = get_model(arg)
        assert spec.name == "tiny/llama" and spec.head_dim == 64 and spec.num_kv_heads == 2
        assert spec.aic_name == str(folder)


def test_bad_hf_config_names_file_and_field(tmp_path):
    folder = _write_config(tmp_path, hidden_size="big")
    with pytest.raises(ConfigError) as exc:
        get_model(str(folder))
    assert "config.json" in str(exc.value) and "hidden_size" in str(exc.value)


def test_missing_hf_field(tmp_path):
    folder = _write_config(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["vocab_size"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="vocab_size"):
        get_model(str(folder))

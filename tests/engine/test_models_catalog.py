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
}


def test_catalog_has_the_issue_models():
    names = set(list_models())
    assert set(PUBLISHED_B) | {"XiaomiMiMo/MiMo-7B-Base"} <= names


@pytest.mark.parametrize("name,billions", sorted(PUBLISHED_B.items()))
def test_parameter_counts_match_model_cards(name, billions):
    assert get_model(name).total_params / 1e9 == pytest.approx(billions, rel=0.01)


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

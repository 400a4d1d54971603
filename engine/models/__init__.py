"""Model catalog: resolve a model name, alias or local HF config.json to a ModelSpec."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

from replay.base.errors import ConfigError, ReplayError
from replay.base.files import require_regular_file
from replay.base.structured import load_bundled_yaml, parse_json
from replay.engine.models.spec import ModelSpec, spec_from_hf_config

__all__ = ["ModelSpec", "get_model", "list_models", "spec_from_hf_config"]

_CATALOG = "catalog.yaml"


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    """(canonical name -> spec, lower-cased name or alias -> canonical name)."""
    text = resources.files(__package__).joinpath(_CATALOG).read_text(encoding="utf-8")
    data = load_bundled_yaml(text)
    specs: dict[str, ModelSpec] = {}
    index: dict[str, str] = {}
    for entry in data["models"]:
        name = entry["name"]
        spec = spec_from_hf_config(entry["config"], name=name, source=f"engine/models/{_CATALOG} ({name})",
                                   aic_name=entry.get("aic_name"))
        specs[name] = spec
        for key in [name, *entry.get("aliases", [])]:
            index[key.lower()] = name
    return specs, index


def list_models() -> list[str]:
    """Canonical catalog names, in catalog order."""
    return list(_catalog()[0])


def _from_path(path: Path) -> ModelSpec:
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.is_file():
        raise ConfigError(f"{path}: no config.json there")
    try:
        require_regular_file(cfg_path, "model config.json")
        cfg = parse_json(cfg_path.read_bytes(), str(cfg_path), ConfigError)
    except OSError as exc:
        raise ConfigError(f"{cfg_path}: cannot read the model config: {exc.strerror}") from None
    except ReplayError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{cfg_path}: a model config must be a JSON object (a Hugging Face config.json), "
                          f"not a {type(cfg).__name__}")
    name = cfg.get("_name_or_path") or (path.name if path.is_dir() else path.parent.name)
    # aiconfigurator-core accepts a local folder holding config.json
    return spec_from_hf_config(cfg, name=str(name), source=str(cfg_path), aic_name=str(cfg_path.parent))


def get_model(name_or_path: str) -> ModelSpec:
    """A catalog name or alias (case-insensitive), or a path to a HF config.json or a folder holding one."""
    specs, index = _catalog()
    canonical = index.get(name_or_path.lower())
    if canonical is not None:
        return specs[canonical]
    path = Path(name_or_path).expanduser()
    if path.exists():
        return _from_path(path)
    raise ConfigError(
        f"unknown model {name_or_path!r}: use one of {', '.join(specs)} "
        "(or an alias such as meta-llama/Meta-Llama-3.1-8B), or a path to a Hugging Face config.json"
    )

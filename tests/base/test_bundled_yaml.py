"""The package's own YAML files load with libyaml's C loader (fast) and mean the same under the strict
loader that user files get: no repeated key, the same values."""

from importlib.resources import files

import pytest

from replay.base.structured import load_bundled_yaml, load_yaml


def _bundled() -> list:
    out = [files("replay.engine.models") / "catalog.yaml"]
    out += sorted((p for p in (files("replay.engine.hardware") / "profiles").iterdir() if p.name.endswith(".yaml")),
                  key=lambda p: p.name)
    return out


@pytest.mark.parametrize("path", _bundled(), ids=lambda p: p.name)
def test_bundled_yaml_is_strict_and_loads_the_same(path):
    text = path.read_text(encoding="utf-8")
    assert load_bundled_yaml(text) == load_yaml(text)  # load_yaml refuses a repeated key


def test_bundled_loader_is_a_safe_loader():
    with pytest.raises(Exception, match="could not determine a constructor"):
        load_bundled_yaml("!!python/object/apply:os.system ['true']")

"""Reading user-written JSON and YAML: one clear error naming the file, never a traceback.

Both parsers recurse per nesting level, so a document nested a few thousand levels deep (``[[[[...``)
raises ``RecursionError``; it is refused here as too deeply nested. YAML mappings may not repeat a key
(YAML 1.2 requires unique keys; PyYAML would silently keep the last value, so ``seed: 1`` then
``seed: 2`` would run with 2 and nobody would know): a repeated key is refused naming both lines.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from replay.base.errors import ReplayError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that repeats a key (merge keys ``<<`` excepted)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base constructor refuses it
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first given on line {first})", key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what YAML found wrong and where (line and column, 1-based)."""
    mark = getattr(exc, "problem_mark", None)
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


class TooDeepError(yaml.YAMLError):
    """A YAML document nested beyond what the parser's recursion can follow."""

    problem = "nested too deeply to read"

    def __str__(self) -> str:
        return self.problem


def load_yaml(text: str) -> Any:
    """``text`` as YAML (safe types only, unique keys); every problem is a ``yaml.YAMLError``."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise TooDeepError() from None


def load_bundled_yaml(text: str) -> Any:
    """One of the package's own YAML files (model catalog, hardware profiles): libyaml's C loader
    when PyYAML has it, 10x faster than the pure-Python one (0.08 s of every command's start).
    Not for user files: the C parser does not turn a document nested too deeply into
    ``RecursionError``, and these files are checked for repeated keys by the test suite instead."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe loaders


def parse_yaml(text: str, where: str, error: type[ReplayError] = ReplayError) -> Any:
    """``load_yaml``; ``error`` names ``where`` on any problem."""
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise error(f"{where}: invalid YAML: {yaml_problem(exc)}") from None


def parse_json(text: str | bytes, where: str, error: type[ReplayError] = ReplayError) -> Any:
    """``text`` as JSON; ``error`` names ``where`` on any problem (syntax, or nesting too deep)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: invalid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{where}: invalid JSON: nested too deeply to read") from None
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None

"""A tool's whole-file JSON report (GuideLLM, span exports): parsed at once, with one clear error
when the file is cut short, rather than a JSON Lines fallback that blames line 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from replay.base.errors import TraceError

from .decoding import open_binary


def _json_error(path: Path, tool: str, err: ValueError, text: bytes, line: int | None) -> TraceError:
    body = text.rstrip()
    truncated = (isinstance(err, json.JSONDecodeError) and err.pos >= len(body) - 1) or not body.endswith((b"}", b"]"))
    what = "truncated JSON (the file ends inside a document)" if truncated else f"invalid JSON: {err}"
    return TraceError(f"{what}; not a complete {tool} file", path=str(path), line=line)


def load_json_report(path: Path, tool: str) -> Any:
    """The JSON document in ``path``; a file of one document per line (a collector's file
    exporter) becomes the list of its documents."""
    with open_binary(path) as fh:
        raw = fh.read()
    if not raw.strip():
        raise TraceError(f"empty file; not a {tool} file", path=str(path))
    try:
        return json.loads(raw)
    except ValueError as exc:
        whole = exc
    lines = raw.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    try:
        json.loads(lines[first]) if first is not None else None
        one_per_line = first is not None and len(lines) > first + 1
    except ValueError:
        one_per_line = False
    if not one_per_line:
        line = whole.lineno if isinstance(whole, json.JSONDecodeError) else None
        raise _json_error(path, tool, whole, raw, line) from None
    docs = []
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            docs.append(json.loads(text))
        except ValueError as exc:
            raise _json_error(path, tool, exc, text, lineno) from None
    return docs

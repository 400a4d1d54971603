"""Pick a reader: ``--format NAME``, or auto-detection from the file name and its first record.

Detection reads column names (CSV header, keys of the first JSON line), never positions. When
nothing matches, the error lists what was found and how to map it with the generic readers.
"""

from __future__ import annotations

from pathlib import Path

from replay.errors import TraceError

from .options import IngestOptions
from .readers import READERS
from .readers._csv import read_header
from .readers._jsonl import first_record
from .readers.base import Reader
from .schema import is_canonical_trace

_CSV_SUFFIXES = (".csv", ".csv.gz")
_JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".ndjson")


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for suf in _CSV_SUFFIXES + _JSON_SUFFIXES + (".parquet",):
        if name.endswith(suf):
            return suf
    return path.suffix.lower()


def detect_format(path: str | Path, opts: IngestOptions | None = None) -> str:
    """The reader name for ``path`` (raises ``TraceError`` when it cannot tell)."""
    path = Path(path)
    opts = opts or IngestOptions()
    suf = _suffix(path)
    if suf == ".parquet":
        if is_canonical_trace(path):
            raise TraceError("already a canonical trace: use it directly (replay inspect / replay run)",
                             path=str(path))
        raise TraceError("a Parquet file that is not a canonical trace (no replay.* metadata)", path=str(path))
    if suf in _CSV_SUFFIXES:
        cols = set(read_header(path))
        if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= cols:
            return "azure"
        if {"Timestamp", "Request tokens", "Response tokens"} <= cols:
            return "burstgpt"
        if opts.mapping:
            return "csv"
        raise TraceError(f"unrecognised CSV columns {sorted(cols)}; give --format and, for a generic CSV, "
                         "--map arrival=COL --map input_tokens=COL --map output_tokens=COL --time-unit UNIT",
                         path=str(path), line=1)
    record = first_record(path)
    if record is None:
        raise TraceError("cannot detect the format: not CSV (by name) and the first line is not a JSON object; "
                         "give --format", path=str(path), line=1)
    keys = set(record)
    if {"chat_id", "parent_chat_id"} <= keys:
        return "bailian"
    if "hash_ids" in keys and keys & {"input_length", "input_tokens"}:
        return "mooncake"
    if keys & {"prompt", "messages", "prompt_token_ids"}:
        return "requests"
    if opts.mapping:
        return "jsonl"
    raise TraceError(f"unrecognised JSON fields {sorted(keys)}; give --format, or --format jsonl with --map flags",
                     path=str(path), line=1)


def make_reader(path: Path, opts: IngestOptions) -> Reader:
    name = opts.format or detect_format(path, opts)
    if name not in READERS:
        raise TraceError(f"unknown format {name!r}; known formats: {', '.join(sorted(READERS))}", path=str(path))
    return READERS[name](path, opts)

"""Rejected rows: where each problem is (row, line, field) and why, for errors and the side file."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.base.atomic import atomic_path
from replay.base.errors import TraceError


@dataclass
class Rejection:
    """One rejected source record. ``row`` is the 0-based record index; ``line`` the 1-based file line."""

    row: int
    field: str
    reason: str
    line: int | None = None
    record: dict[str, Any] | None = field(default=None)

    def to_error(self, path: str | Path, more: int = 0) -> TraceError:
        hint = ""
        if more:
            hint = (f" (and {more} more problem{'s' if more > 1 else ''}; `--on-error skip` writes the good rows "
                    "and lists every rejected row in a side file)")
        line = self.line
        where_row = "" if line is not None else f"record {self.row + 1}: "
        return TraceError(where_row + self.reason + hint, path=str(path), line=line, field=self.field)

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "row": self.row, "field": self.field, "reason": self.reason,
                "record": self.record}


# Staged column names that differ from the canonical trace's (the side file speaks canonical).
_CANONICAL_NAMES = {"t_ms": "arrival_ms"}


def read_values(staged_row: dict[str, Any]) -> dict[str, Any]:
    """A staged row as a side-file record: its values as read (times in ms, lengths as numbers),
    under the canonical trace's names; the internal row and line keys dropped (the record names
    its line itself)."""
    return {_CANONICAL_NAMES.get(k, k): v for k, v in staged_row.items() if k not in ("_row", "_line")}


def side_file_path(dest: str | Path) -> Path:
    dest = Path(dest)
    return dest.with_name(dest.name + ".rejected.jsonl")


_SIDE_KEYS = {"line", "row", "field", "reason", "record"}


def is_our_side_file(path: Path) -> bool:
    """True when every line of ``path`` is a rejection record as ``write_side_file`` writes them, so
    removing it loses nothing of the user's (we remove a stale one after a clean re-ingest)."""
    lines = 0
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                obj = json.loads(line)
                if not isinstance(obj, dict) or set(obj) != _SIDE_KEYS:
                    return False
                lines += 1
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return lines > 0  # ingest writes one only when it rejected a row: an empty file is the user's


def remove_stale_side_file(path: Path) -> bool:
    """Remove a side file left by an earlier ingest to the same output, only if it is ours."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
    except OSError:  # absent, or a name too long to exist (the side file adds 15 characters)
        return False
    if is_our_side_file(path):
        path.unlink()
        return True
    return False


def write_side_file(path: Path, rejections: list[Rejection]) -> None:
    """One JSON object per rejected row, in source order, written atomically. A file already at
    ``path`` is replaced only when it is an earlier ingest's side file: anything else is the user's."""
    if os.path.lexists(path) and not (path.is_file() and not path.is_symlink() and is_our_side_file(path)):
        raise TraceError("the file exists and is not a rejected-rows file written by `replay ingest`; "
                         "move it or choose another output (nothing was written)", path=str(path))
    rejections = sorted(rejections, key=lambda r: (r.row, r.field))
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for rej in rejections:
            fh.write(json.dumps(rej.to_json(), sort_keys=True, default=str) + "\n")

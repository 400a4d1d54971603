"""The content-addressed result store of a sweep directory.

A run's key is a hash of (trace fingerprint, config hash, tool version): a rerun finds every finished
config under its key and redoes only what is missing, and two grids that share a config share its run.

SWEEPDIR layout (everything written atomically; nothing half-written ever appears):

    sweep.json              what the last sweep asked for (trace, base config, grid, SLO)
    sweep.parquet           one row per config (written last, only when every config has a result)
    trace.parquet           the trace, when the input was not already a canonical Parquet trace
    results/<key>.json      a finished config: its summary row, or its error
    runs/<key>/             that config's `replay run` output (absent with --summary-only)
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from replay.base.atomic import remove_stale_temps, write_json_atomic
from replay.base.errors import ReplayError
from replay.base.version import __version__

SWEEP_FILE = "sweep.json"
TABLE_FILE = "sweep.parquet"
TRACE_FILE = "trace.parquet"
RESULTS_DIR = "results"
RUNS_DIR = "runs"
KEY_LEN = 20  # hex digits: 80 bits, no collision in any sweep a person runs
# replay.base.atomic names its temp paths ".<final name>.replay-<pid>-<random>.tmp"
_LEFTOVER = re.compile(r"^\.(.+)\.replay-\d+-[A-Za-z0-9_]+\.tmp$")
CONFIG_HASH_LEN = 16  # hex digits of the config hash shown in tables and the `config` column


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(config: dict[str, Any]) -> str:
    """Hash of a full validated config as dumped (``EngineConfig.model_dump(mode="json")``, defaults
    filled in), so equal configs hash equal however they were written."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:CONFIG_HASH_LEN]


def result_key(trace_fingerprint: str, cfg_hash: str, tool_version: str = __version__) -> str:
    text = canonical_json({"trace": trace_fingerprint, "config": cfg_hash, "tool": tool_version})
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LEN]


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


class ResultStore:
    """Reads and writes the per-config records of one SWEEPDIR."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @classmethod
    def create(cls, root: str | Path) -> ResultStore:
        """Open ``root`` for a sweep: a new or empty directory, or an earlier sweep's. Any other
        non-empty directory is refused (a sweep never writes into files it did not create)."""
        root = Path(root)
        if root.exists():
            if not root.is_dir():
                raise ReplayError(f"{root}: exists and is not a directory")
            if any(root.iterdir()) and not is_sweep_dir(root):
                raise ReplayError(f"{root}: not empty and not a sweep directory (no {SWEEP_FILE}); "
                                  "choose a new -o")
        (root / RESULTS_DIR).mkdir(parents=True, exist_ok=True)
        (root / RUNS_DIR).mkdir(exist_ok=True)
        store = cls(root)
        store.remove_leftovers()
        return store

    def remove_leftovers(self) -> None:
        """Remove the temp files and directories of writes that never finished (a worker killed
        mid-run), through replay.base.atomic's own rule: only its temp names, only when the process that
        made them is gone (a live concurrent sweep's temps stay)."""
        for folder in (self.root, self.root / RESULTS_DIR, self.root / RUNS_DIR):
            finals = {m.group(1) for p in folder.iterdir() if (m := _LEFTOVER.match(p.name))}
            for name in sorted(finals):
                remove_stale_temps(folder / name)

    def record_path(self, key: str) -> Path:
        return self.root / RESULTS_DIR / f"{key}.json"

    def run_dir(self, key: str) -> Path:
        return self.root / RUNS_DIR / key

    def load(self, key: str) -> dict | None:
        path = self.record_path(key)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # ValueError: bad JSON or not UTF-8
            return None  # unreadable: treated as missing, so the config is redone
        return record if isinstance(record, dict) else None

    def is_done(self, key: str, *, need_run_dir: bool, retry_failed: bool) -> bool:
        rec = self.load(key)
        if rec is None:
            return False
        if rec.get("error") is not None:
            return not retry_failed
        return not need_run_dir or (self.run_dir(key) / "run.json").is_file()

    def save(self, key: str, record: dict) -> None:
        write_json_atomic(self.record_path(key), record)

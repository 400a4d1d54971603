"""The Python API, for notebooks and scripts: the same runs as the CLI, results as DataFrames.

    from replay.api import run
    result = run("sample_traces/mooncake_sessions.jsonl", "config.yaml", overrides=["load.speedup=2"])
    result.requests.ttft_ms.describe()
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replay.base.files import require_regular_file
from replay.engine.config import EngineConfig, load_config, validate_config
from replay.engine.fleet import ProgressFn
from replay.engine.output_schema import REQUESTS_FILE, STEPS_FILE
from replay.engine.run import PreparedTrace, prepare_trace, prepare_trace_file, replay_prepared
from replay.engine.run_setup import EngineSetup, resolve_setup
from replay.ingest.schema import TraceMetadata, is_canonical_trace, read_trace

if TYPE_CHECKING:  # pandas costs half a second to import: only the result accessors need it
    import pandas as pd


def prepare_any_trace(path: str | Path, cfg: EngineConfig, setup: EngineSetup, *, on_error: str = "fail",
                      **ingest_options: Any) -> PreparedTrace:
    """A trace made ready for ``replay_prepared``: a canonical Parquet trace read a piece at a time
    into the engine's columns (``prepare_trace_file``), any other file converted in memory."""
    require_regular_file(path, "trace file")
    if is_canonical_trace(path):
        return prepare_trace_file(path, cfg, setup, on_error=on_error)
    table, meta = load_any_trace(path, **ingest_options)
    return prepare_trace(table, meta, cfg, setup, trace_path=path, on_error=on_error)


def load_any_trace(path: str | Path, **ingest_options: Any) -> tuple[pa.Table, TraceMetadata]:
    """A canonical Parquet trace as is, or any file `replay ingest` reads, converted in memory."""
    require_regular_file(path, "trace file")
    if is_canonical_trace(path):
        return read_trace(path, replayable=True)
    from replay.ingest import load_trace

    return load_trace(path, **ingest_options)


def resolve_config(config: EngineConfig | str | Path | dict | None,
                   overrides: list[str] | None = None) -> tuple[EngineConfig, str]:
    if isinstance(config, EngineConfig):
        return validate_config(config.model_dump(), "EngineConfig", overrides), "EngineConfig"
    if isinstance(config, dict):
        return validate_config(copy.deepcopy(config), "config dict", overrides), "config dict"
    cfg = load_config(config, overrides)
    return cfg, str(config) if config is not None else "defaults"


@dataclass
class RunResult:
    outdir: Path
    info: dict = field(repr=False)

    @cached_property
    def requests(self) -> pd.DataFrame:
        import pandas as pd

        return pd.read_parquet(self.outdir / REQUESTS_FILE)

    @cached_property
    def chunks(self) -> pd.DataFrame:
        """One row per output chunk (request_id, time_ms, tokens), in time order, expanded from
        chunks.parquet's runs."""
        from replay.reports.views import read_chunks

        return read_chunks(self.outdir).to_pandas()

    @cached_property
    def steps(self) -> pd.DataFrame:
        import pandas as pd

        return pd.read_parquet(self.outdir / STEPS_FILE)


def run(trace: str | Path, config: EngineConfig | str | Path | dict | None = None, *,
        overrides: list[str] | str | None = None, outdir: str | Path | None = None, progress: bool | ProgressFn = False,
        overwrite: bool = True, on_error: str = "fail", check_invariants: bool = False,
        ingest_options: dict[str, Any] | None = None) -> RunResult:
    """Replay ``trace`` with ``config`` (YAML path, dict, EngineConfig or None for vLLM defaults).

    ``overrides``: ``--set`` strings (one string or a list); ``outdir`` None: a new temporary folder,
    which the caller removes (RunResult.outdir names it); ``progress``: a callable taking the
    progress of the replay (True is taken as no progress: a notebook has no terminal bar);
    ``on_error``: ``fail`` or ``skip``, as ``replay run --on-error``."""
    if isinstance(overrides, str):  # one --set string, not its characters
        overrides = [overrides]
    cfg, source = resolve_config(config, overrides)
    setup = resolve_setup(cfg)
    prepared = prepare_any_trace(trace, cfg, setup, on_error=on_error, **(ingest_options or {}))
    if outdir is None:
        outdir = Path(tempfile.mkdtemp(prefix="replay-")) / "out"
    progress_fn = progress if callable(progress) else None
    config_path = config if isinstance(config, (str, Path)) else None
    summary = replay_prepared(prepared, cfg, outdir, config_source=source, config_path=config_path,
                              overwrite=overwrite, progress=progress_fn, check_invariants=check_invariants,
                              setup=setup, once=True)
    return RunResult(outdir=Path(summary.outdir), info=summary.run_info)

"""A trace made ready for a replay, and what a replay hands back.

``prepare_trace_file`` reads a canonical Parquet trace a piece at a time into its fingerprint and
the engine's columns (never holding the table whole); ``prepare_trace`` does the same from a table in
memory (any other input, and a fleet of clusters, whose Ray tasks get the table). Both choose the
rows to replay. engine/run.py replays what they give; ``store_trace`` keeps a copy of a trace that
is not a canonical file with the outputs, and ``config_input_files`` names the files a run reads,
which an output folder may never replace.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from replay.base.parquet_io import CHECKSUMS
from replay.engine.config import EngineConfig
from replay.engine.replay_gc import without_collector
from replay.engine.request_selection import ReplayedRequests, select_requests
from replay.engine.run_setup import EngineSetup
from replay.engine.trace_input import TraceArrays, TraceArraysBuilder, trace_arrays
from replay.ingest.fingerprint import TraceFingerprint, trace_fingerprint
from replay.ingest.schema import TraceMetadata, TraceReader, read_trace


@dataclass
class RunSummary:
    """What replay_trace gives back: where the outputs are, and run.json's content."""

    outdir: Path
    run_info: dict


def config_input_files(config: EngineConfig, config_path: str | Path | None = None) -> list[Path]:
    """Every file a run with ``config`` reads besides the trace: the config file itself, a calibrated
    timing profile, a hardware profile YAML, a model's local ``config.json``. They are the run's inputs, so an output folder
    that is or holds one of them is refused instead of replaced (replacing it would delete them)."""
    files = [Path(config_path)] if config_path is not None else []
    if config.timing.profile is not None:
        files.append(Path(config.timing.profile).expanduser())
    hardware = Path(config.hardware).expanduser()
    if hardware.is_file():  # a profile YAML (docs/timing.md, "Hardware profiles")
        files.append(hardware)
    model = Path(config.model).expanduser()
    if model.is_dir():
        files.append(model / "config.json")
    elif model.is_file():
        files.append(model)
    return files


def store_trace(prepared: PreparedTrace, outdir: str | Path, tmp: Path) -> Path:
    """Where run.json points for the replayed trace: a canonical Parquet input stays where it is;
    any other input is written (canonical, with its metadata) into the output directory."""
    if prepared.in_place:
        assert prepared.trace_path is not None
        return Path(prepared.trace_path).resolve()
    table, meta = prepared.table, prepared.meta
    assert table is not None
    metadata = {**(table.schema.metadata or {}), **meta.to_parquet_metadata()}
    pq.write_table(table.replace_schema_metadata(metadata), tmp / "trace.parquet", compression="zstd", **CHECKSUMS)
    return Path(outdir).resolve() / "trace.parquet"


@dataclass
class PreparedTrace:
    """A trace made ready for the engine, so that a caller can let its Arrow table go before the
    replay (at 10 M requests the table is 1.7 GB beside the engine's 1.5 GB of columns): the
    fingerprint run.json records, the engine's columns, the rows to replay. ``table`` is kept only
    where the replay still reads it: an input that is not a canonical Parquet file (stored with the
    outputs) and a fleet of clusters (handed to its workers)."""

    meta: TraceMetadata
    fingerprint: str
    arrays: TraceArrays
    requests: ReplayedRequests
    table: pa.Table | None
    trace_path: str | Path | None
    in_place: bool  # the input is a canonical Parquet file, which run.json names (else stored with the outputs)
    prepare_s: float  # the replay's wall time counts its preparation


@without_collector
def prepare_trace(table: pa.Table, meta: TraceMetadata, config: EngineConfig, setup: EngineSetup, *,
                  trace_path: str | Path | None = None, on_error: str = "fail") -> PreparedTrace:
    """Fingerprint ``table``, build the engine's columns and choose the rows to replay (an
    unreplayable row is an error unless ``on_error`` is ``skip``)."""
    start = time.perf_counter()
    fingerprint = trace_fingerprint(table)
    arrays = trace_arrays(table, meta.hash_block_size)
    requests = select_requests(arrays, config, setup, on_error=on_error, trace_path=trace_path)
    in_place = trace_path is not None and Path(trace_path).suffix == ".parquet" and meta is not None
    clustered = config.fleet is not None and config.fleet.clusters > 1
    return PreparedTrace(meta=meta, fingerprint=fingerprint, arrays=arrays, requests=requests,
                         table=table if clustered or not in_place else None, trace_path=trace_path,
                         in_place=in_place, prepare_s=time.perf_counter() - start)


@without_collector
def prepare_trace_file(path: str | Path, config: EngineConfig, setup: EngineSetup, *,
                       on_error: str = "fail") -> PreparedTrace:
    """``prepare_trace`` of a canonical Parquet trace, read a piece at a time into the
    fingerprint and the engine's columns, so the trace's Arrow table is never held whole (at 10 M
    reuse-heavy rows: 1.7 GB, beside the columns' 1.4 GB). A fleet of clusters hands the table to
    its workers, so it reads the table."""
    if config.fleet is not None and config.fleet.clusters > 1:
        table, meta = read_trace(path, replayable=True)
        return prepare_trace(table, meta, config, setup, trace_path=path, on_error=on_error)
    start = time.perf_counter()
    reader = TraceReader(path, replayable=True)
    fingerprint = TraceFingerprint(reader.schema)
    builder = TraceArraysBuilder(reader.num_rows, reader.meta.hash_block_size, reader.hash_id_bound())
    for piece in reader.pieces():
        fingerprint.add(piece)
        builder.add(piece)
        del piece
    arrays = builder.finish()
    del builder
    requests = select_requests(arrays, config, setup, on_error=on_error, trace_path=path)
    return PreparedTrace(meta=reader.meta, fingerprint=fingerprint.hexdigest(), arrays=arrays, requests=requests,
                         table=None, trace_path=path, in_place=True, prepare_s=time.perf_counter() - start)

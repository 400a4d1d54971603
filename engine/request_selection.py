"""Which trace rows a replay takes, and which it refuses up front because they could never complete
(too long for the model, or larger than the whole KV cache)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from replay.base.errors import ConfigError, TraceError
from replay.engine.config import EngineConfig
from replay.engine.load_window import parse_window
from replay.engine.pd_run import is_disaggregated, prefill_pool_rejects
from replay.engine.run_setup import EngineSetup
from replay.engine.trace_input import TraceArrays

_MAX_LISTED = 10  # requests named in the error


def find_unreplayable(trace: TraceArrays, selected: np.ndarray, config: EngineConfig,
                      setup: EngineSetup) -> dict[int, str]:
    """Requests that can never complete: too long for the model, or larger than the whole KV cache."""
    bs = config.kv_cache.block_size
    k = config.speculative.num_speculative_tokens if config.speculative else 0
    usable = setup.num_gpu_blocks - 1
    inp = trace.input_tokens[selected].astype(np.int64)  # sums of int32 token counts may not fit int32
    out = trace.output_tokens[selected].astype(np.int64)
    too_long = inp + out > setup.max_model_len
    # KV needed at the last step: every token but the last sampled one, plus MTP lookahead slots.
    blocks_needed = -(-(inp + out - 1 + k) // bs)
    too_big = blocks_needed > usable
    rejected: dict[int, str] = {}
    for pos in np.flatnonzero(too_long | too_big):
        idx = int(selected[pos])
        if too_long[pos]:
            rejected[idx] = (f"input {int(inp[pos])} + output {int(out[pos])} tokens exceed "
                             f"max_model_len {setup.max_model_len}")
        else:
            rejected[idx] = (f"needs {int(blocks_needed[pos])} KV blocks but the cache has only {usable} "
                             f"usable blocks of {bs} tokens")
    return rejected


def _clock(ms: float) -> str:
    s = int(ms // 1000)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass(frozen=True)
class ReplayedRequests:
    """Which trace rows a replay takes (the first ``load.max_requests``), and which of them it
    rejects up front because they could never complete."""

    selected: np.ndarray  # trace row indices, in trace order
    rejected: dict[int, str]  # trace row -> why


ON_ERROR_CHOICES = ("fail", "skip")


def check_on_error(on_error: str) -> None:
    """Every path to a replay (run, the API, sweep and plan workers, diff) takes on_error here."""
    if on_error not in ON_ERROR_CHOICES:
        raise ConfigError(f"on_error must be 'fail' or 'skip', not {on_error!r}")


def select_requests(trace: TraceArrays, config: EngineConfig, setup: EngineSetup, *, on_error: str,
                    trace_path: str | Path | None) -> ReplayedRequests:
    """The rows to replay; unless ``on_error == "skip"``, a request that can never complete is an
    error naming the first few (a replay would otherwise report it unfinished, hiding the cause).
    A disaggregated fleet checks its decode pool (``setup``) and its prefill pool."""
    check_on_error(on_error)
    where = str(trace_path) if trace_path else None
    n = len(trace)
    if n == 0:
        raise TraceError("the trace has no rows", path=where)
    limit = config.load.max_requests
    if config.load.window is not None:  # the rows arriving within the window, then the first N of them
        window = parse_window(config.load.window)
        arrival = trace.arrival_ms
        selected = np.flatnonzero((arrival >= window.start_ms) & (arrival < window.end_ms)).astype(np.int64)
        if not len(selected):
            raise TraceError(f"load.window {config.load.window!r} holds no request: the trace's arrivals span "
                             f"{_clock(float(arrival.min()))} to {_clock(float(arrival.max()))}", path=where)
        if limit:
            selected = selected[:limit]
    else:
        selected = np.arange(min(n, limit) if limit else n, dtype=np.int64)
    if is_disaggregated(config):
        rejected = {**prefill_pool_rejects(trace, selected, config),
                    **find_unreplayable(trace, selected, config.pool_config("decode"), setup)}
        rejected = {i: rejected[i] for i in sorted(rejected)}
    else:
        rejected = find_unreplayable(trace, selected, config, setup)
    if rejected and on_error != "skip":
        ids = [f"{trace.request_id[i]} ({why})" for i, why in list(rejected.items())[:_MAX_LISTED]]
        more = f" and {len(rejected) - _MAX_LISTED} more" if len(rejected) > _MAX_LISTED else ""
        raise TraceError(
            f"{len(rejected)} request(s) can never be replayed with this config: " + "; ".join(ids) + more
            + ". Raise max_model_len or the KV capacity, or pass --on-error skip to mark them rejected.",
            path=where)
    return ReplayedRequests(selected=selected, rejected=rejected)

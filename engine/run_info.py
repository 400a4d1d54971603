"""run.json: what a finished replay records about itself (inputs, capacity, totals, warnings).

Kept apart from the replay itself (engine/run.py) so that the simulation's entry point reads as
the steps of a replay, and so that the record's fields are assembled in one place. The reports
and the sweep read run.json back (replay/run_summary.py, reports/); the trace's fingerprint
(ingest/fingerprint.py) is the content hash they compare traces by.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from replay.base.version import __version__
from replay.engine.fleet_summary import fleet_summary
from replay.engine.kv_tier_report import TierFigures, tier_figures, tier_summary
from replay.engine.native import core_kind

if TYPE_CHECKING:  # annotations only: run.py imports this module
    from replay.engine.config import EngineConfig
    from replay.engine.core import EngineCore
    from replay.engine.recorder import Recorder
    from replay.engine.run_setup import EngineSetup
    from replay.engine.trace_input import TraceArrays
    from replay.ingest.schema import TraceMetadata


@dataclass(frozen=True)
class ReplayFacts:
    """What a completed replay hands to run.json: its inputs, and the engine state at the end."""

    config: EngineConfig
    config_source: str | None
    setup: EngineSetup
    fingerprint: str  # the canonical trace's fingerprint (ingest/fingerprint.py)
    meta: TraceMetadata
    trace: TraceArrays
    trace_file: Path  # where the replayed trace is stored (run.json points to it)
    selected: np.ndarray  # trace rows replayed (the first max_requests)
    rejected: dict[int, str]  # trace row -> why it can never be replayed
    cores: list[EngineCore]
    recorder: Recorder
    simulated_span_ms: float
    wall_time_s: float
    session_delay_rule: str
    pools: dict | None = None  # a disaggregated fleet's per-pool totals and KV transfers (engine/pd_run.py)
    tiers: list[TierFigures] | None = None  # a fleet of clusters: its clusters' KV tier figures, added up


def run_totals(facts: ReplayFacts) -> dict:
    """Request, token, cache and step counts over all replicas (run.json's ``totals``)."""
    recorder = facts.recorder
    selected = facts.selected
    cores = facts.cores
    status = recorder.status[selected]
    totals = {
        "requests": int(len(selected)),
        "finished": int((status == 0).sum()),
        "rejected": int((status == 1).sum()),
        "unfinished": int((status == 2).sum()),
        "input_tokens": int(facts.trace.input_tokens[selected].sum()),
        "output_tokens": int(recorder.output_tokens[selected][status != 1].sum()),  # generated only
        "prefix_query_tokens": sum(c.sched.prefix_query_tokens for c in cores),
        "prefix_hit_tokens": sum(c.sched.prefix_hit_tokens for c in cores),
        "cpu_hit_tokens": sum(c.sched.cpu_hit_tokens for c in cores),
        "preemptions": sum(c.sched.total_preemptions for c in cores),
        "steps": recorder.num_steps,
        "chunks": recorder.num_chunks,
        "gpu_block_evictions": sum(c.kv_pool.num_evictions for c in cores),
    }
    # G2 is per replica, and in a disaggregated fleet per pool (one pool may have it, or neither).
    with_g2 = [c.offload.totals() for c in cores if c.offload is not None]
    if with_g2:
        for key in with_g2[0]:
            values = [t[key] for t in with_g2]
            totals[key] = values[0] if key == "num_cpu_blocks" else sum(values)
    return totals


def run_warnings(facts: ReplayFacts, totals: dict) -> list[str]:
    """What a reader of the results should know before trusting them."""
    warnings = []
    if facts.rejected:
        warnings.append(f"{len(facts.rejected)} request(s) rejected before the run (see reject_reason)")
    if totals["unfinished"]:
        warnings.append(f"{totals['unfinished']} request(s) did not finish")
    if facts.trace.rechained:
        warnings.append("the trace's hash ids are not chained (an id follows different prefixes, or repeats "
                        "in a row): the replay chained them, so a block is shared only after the same prefix, "
                        "as with vLLM's block hashes")
    return warnings


def build_run_info(facts: ReplayFacts) -> dict:
    """run.json's content, in its field order."""
    config = facts.config
    setup = facts.setup
    cores = facts.cores
    totals = run_totals(facts)
    info = {
        "tool_version": __version__,
        "config": config.model_dump(mode="json"),
        "config_source": facts.config_source or "defaults",
        "trace": {
            "path": str(facts.trace_file),
            "fingerprint": facts.fingerprint,
            "rows": len(facts.trace),
            "replayed_rows": int(len(facts.selected)),
            **({"first_replayed_row": int(facts.selected[0])} if len(facts.selected) and facts.selected[0] else {}),
            "metadata": facts.meta.model_dump(mode="json"),
        },
        "seed": config.seed,
        "num_gpu_blocks": setup.num_gpu_blocks,
        "kv_capacity": {"source": setup.capacity_source, "num_gpu_blocks": setup.num_gpu_blocks,
                        "tokens": (setup.num_gpu_blocks - 1) * config.kv_cache.block_size,
                        **setup.capacity_detail},
        "kv_bytes_per_token": setup.kv_bytes_per_token,
        "max_model_len": setup.max_model_len,
        "simulated_span_ms": facts.simulated_span_ms,
        "wall_time_s": facts.wall_time_s,
        "engine_core": core_kind(),  # compiled (mypyc) or python: same outputs, not the same speed
        # calls of Scheduler.schedule (an idle or preempting call builds no step); the other steps
        # were fast-forwarded in decode windows (engine/decode_window.py). A speed diagnostic,
        # not a result: it differs with fast_forward, the totals do not.
        "schedule_calls": sum(c.schedule_calls for c in cores),
        "totals": totals,
        "warnings": run_warnings(facts, totals),
        "timing": {"backend": config.timing.backend, "uncalibrated": setup.uncalibrated},
        "session_delay_rule": facts.session_delay_rule,
        "prefix_hit_rate": (totals["prefix_hit_tokens"] / totals["prefix_query_tokens"]
                            if totals["prefix_query_tokens"] else None),
    }
    if facts.pools is not None:  # the fleet's replicas are the decode pool's; the pools section has both
        decode = [c for c in cores if c.emits_tokens]
        offset = min(c.replica for c in decode)  # the decode pool's first fleet number (after the prefill pool's)
        info["fleet"] = fleet_summary(decode, facts.recorder, facts.selected, facts.simulated_span_ms, offset)
        info["pools"] = facts.pools
    elif config.fleet is not None:
        info["fleet"] = fleet_summary(cores, facts.recorder, facts.selected, facts.simulated_span_ms)
    if config.kv_cache.tiers:
        figures = facts.tiers if facts.tiers is not None else tier_figures(cores)
        info["kv_tiers"] = tier_summary(figures, totals["prefix_query_tokens"], facts.simulated_span_ms)
    return info

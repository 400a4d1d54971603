"""``replay inspect``: the traffic shape and ideal prefix reuse of a trace, before replaying it."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from replay.base.errors import ConfigError
from replay.commands._common import console, user_errors


def _capacities(text: str) -> list[int]:
    try:
        caps = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--lru-blocks expects comma-separated integers, got {text!r}") from None
    if any(c < 1 for c in caps):
        raise ConfigError("--lru-blocks capacities must be positive")
    return caps


def _fmt(value: object, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    def inspect(
        trace: Path = typer.Argument(..., help="Canonical trace, or any file `replay ingest` reads."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
        lru_blocks: str = typer.Option("1000,10000,100000", "--lru-blocks",
                                       help="LRU capacities (in hash blocks) to simulate, comma-separated."),
        format: str = typer.Option(None, "--format", "-f", help="Source format when TRACE is not canonical."),
        block_size: int = typer.Option(None, "--block-size", help="Tokens per hash id (non-canonical input)."),
        time_unit: str = typer.Option(None, "--time-unit", help="s, ms, us, ns or iso (generic formats)."),
        map_: list[str] = typer.Option(None, "--map", help="CANONICAL=SOURCE column mapping (generic formats)."),
        drop_failed: bool = typer.Option(False, "--drop-failed", help="Drop failed requests (zero output tokens)."),
    ) -> None:
        """Rows, span, rate, burstiness, length percentiles, sessions and prefix reuse of a trace."""
        from replay.ingest.api import inspect_trace
        from replay.ingest.measured_stats import label_summary, measured_summary
        from replay.ingest.options import parse_map_flags

        with user_errors():
            caps = _capacities(lru_blocks)
            stats, table, meta = inspect_trace(trace, caps, format=format, block_size=block_size,
                                               time_unit=time_unit, mapping=parse_map_flags(map_ or []),
                                               drop_failed=drop_failed)
        stats["source_format"] = meta.source_format
        stats["prefix_identity"] = meta.prefix_identity
        stats.update(measured=measured_summary(table), labels=label_summary(table),
                     timestamps=meta.timestamps, source_run=meta.source_run)
        if as_json:
            print(json.dumps(stats, sort_keys=True))
            return
        out = Table(title=f"{trace.name} ({meta.source_format}, prefix identity {meta.prefix_identity})",
                    show_header=False)
        out.add_row("rows", _fmt(stats["rows"]))
        out.add_row("span_s", _fmt(stats["span_s"], 1))
        out.add_row("mean_rate_rps", _fmt(stats["mean_rate_rps"], 3))
        out.add_row("inter-arrival CV", _fmt(stats["interarrival_cv"], 2))
        for key in ("input_tokens", "output_tokens"):
            p = stats[key]
            out.add_row(f"{key} mean / p50 / p90 / p99 / max",
                        " / ".join(_fmt(p[k], 0) for k in ("mean", "p50", "p90", "p99", "max")))
        out.add_row("sessions", _fmt(stats["sessions"]))
        out.add_row("hash_block_size", _fmt(stats["hash_block_size"]))
        out.add_row("block references / unique", f"{_fmt(stats['block_references'])} / {_fmt(stats['unique_blocks'])}")
        out.add_row("block_reuse_fraction", _fmt(stats["block_reuse_fraction"]))
        out.add_row("token_prefix_hit_infinite", _fmt(stats["token_prefix_hit_infinite"]))
        for cap, rate in stats["lru_hit"].items():
            out.add_row(f"LRU hit @ {int(cap):,} blocks", _fmt(rate, 3))
        for name, d in stats["measured"].items():
            out.add_row(f"{name} (n={d['requests']:,}) mean / p50 / p90 / p99",
                        " / ".join(_fmt(d[k], 2) for k in ("mean", "p50", "p90", "p99")))
        for name, d in stats["labels"].items():
            top = ", ".join(f"{v} ({c:,})" for v, c in d["top"])
            out.add_row(f"label {name}: {d['distinct']:,} values", top)
        if stats["source_run"]:
            out.add_row("source run", ", ".join(f"{k}={v}" for k, v in stats["source_run"].items()
                                                if not isinstance(v, list)))
        console.print(out)
        if stats["timestamps"] == "absent":
            console.print("no arrival times in the source: every arrival is 0; replay with "
                          "--set load.mode=concurrency or poisson")
        if not stats["measured"]:
            console.print("no measured latencies in this trace: `replay validate` needs a log that has them")
        if stats["block_reuse_fraction"] is None:
            console.print("no hash ids in this trace: prefix reuse is unknown, not zero")

"""`replay run TRACE -c config.yaml -o OUTDIR`: replay a trace through the modeled vLLM engine."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from replay.base.atomic import check_output_dir
from replay.commands._common import console, user_errors


def _release_memory() -> None:
    """Collect reference cycles and hand the pages Arrow's allocator keeps for reuse back to the
    system: once the trace's table is let go (the replay then holds the engine's columns only), and
    before the summary, so that its queries do not stack on the replay's peak."""
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()


def run(
    trace: Path = typer.Argument(..., help="Canonical Parquet trace, or any file `replay ingest` reads."),
    config: Path | None = typer.Option(None, "--config", "-c", help="Engine config YAML (default: vLLM defaults, Llama-3.1-8B on H200)."),
    outdir: Path = typer.Option(..., "--output", "-o", help="Output directory (written atomically)."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key, e.g. --set scheduler.max_num_seqs=256."),
    on_error: str = typer.Option("fail", "--on-error", help="fail: refuse unreplayable requests; skip: mark them rejected."),
    overwrite: bool = typer.Option(True, "--overwrite/--no-overwrite", help="Replace an existing OUTDIR."),
    check: bool = typer.Option(False, "--check", help="Debug mode: verify block and budget invariants every step (slow)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or summary."),
    trace_format: str | None = typer.Option(None, "--format", help="Input format when TRACE is not canonical (default: auto-detect)."),
    block_size: int | None = typer.Option(None, "--trace-block-size", help="Tokens per hash id of a non-canonical TRACE."),
    ray: str | None = typer.Option(None, "--ray", help="With fleet.clusters > 1: replay each cluster as a Ray task, "
                                   "'auto' (a local Ray instance) or a cluster ADDRESS; same outputs as without."),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Replay the clusters of a fleet, or the replicas "
                                       "of a fleet that share nothing (docs/fleet.md), in up to this many local "
                                       "processes; the same bytes with any number (default: the cores, on large "
                                       "replays). A kv_aware or least_loaded fleet's replicas run in step in this "
                                       "many processes (default 2 on large replays with two cores; 1: one loop): "
                                       "the same requests, step and chunk rows ordered by process. Above 1,000,000 "
                                       "requests the fleet keeps one loop (bounded memory) unless N is above 1."),
) -> None:
    """Replay every request of TRACE through the modeled vLLM V1 engine and write what each experienced."""
    from replay.api import prepare_any_trace, resolve_config

    with user_errors():
        if on_error not in ("fail", "skip"):
            raise typer.BadParameter("--on-error takes fail or skip")
        cfg, source = resolve_config(config, set_)
        from replay.engine.run import config_input_files, replay_prepared

        # Fail before the long part: never onto the trace, the config or a file the config names.
        check_output_dir(outdir, overwrite=overwrite, inputs=[trace, *config_input_files(cfg, config)])
        from replay.engine.run_setup import resolve_setup

        setup = resolve_setup(cfg)  # first: a timer may go on loading its tables while the trace loads
        options = {k: v for k, v in (("format", trace_format), ("block_size", block_size)) if v is not None}
        started = time.perf_counter()
        prepared = prepare_any_trace(trace, cfg, setup, on_error=on_error, **options)
        rows = len(prepared.arrays)
        total = cfg.load.max_requests and min(cfg.load.max_requests, rows) or rows
        _release_memory()  # what reading and converting the trace left in Arrow's allocator
        if quiet:
            summary = replay_prepared(prepared, cfg, outdir, config_source=source, config_path=config,
                                      overwrite=overwrite, check_invariants=check, setup=setup,
                                      ray_address=ray, workers=workers, once=True)
        else:
            columns = (TextColumn("[bold]replay[/]"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("requests · sim {task.fields[sim]}"), TimeElapsedColumn())
            with Progress(*columns, console=console, transient=True) as bar:
                task = bar.add_task("replay", total=total, sim="0 s")

                def progress(sim_ms: float, done: int) -> None:
                    # NaN: parts replayed apart, each on a clock of its own (docs/fleet.md)
                    sim = f"{sim_ms / 1000:,.1f} s" if sim_ms == sim_ms else "-"
                    bar.update(task, completed=done, sim=sim)

                summary = replay_prepared(prepared, cfg, outdir, config_source=source, config_path=config,
                                          overwrite=overwrite, progress=progress, check_invariants=check,
                                          setup=setup, ray_address=ray, workers=workers, once=True)
        wall = time.perf_counter() - started
        if not quiet:
            from replay.run_summary import print_run_summary

            del prepared  # the summary reads the run's files: give the engine's memory back first
            _release_memory()
            print_run_summary(summary.outdir, summary.run_info, wall, console)


def register(app: typer.Typer) -> None:
    app.command("run")(run)

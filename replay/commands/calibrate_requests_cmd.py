"""``replay calibrate-requests OUTDIR -o profile.yaml``: fit the step-time model to measured latencies."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer
from rich.table import Table

from replay.commands._common import console, user_errors


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _change(before: float | None, after: float | None, signed: bool = False) -> str:
    return f"{_pct(before, signed)} -> {_pct(after, signed)}"


def fit_json(fit, output: Path) -> dict:
    """The fit as one JSON object: parameters with bounds, errors per level before and after."""
    return {
        "output": str(output), "evaluations": fit.evaluations, "replay_seconds": fit.replay_seconds,
        "fit_where": fit.fit_where, "level_column": fit.level_column,
        "parameters": [{**asdict(p), "at_bound": p.at_bound} for p in fit.fitted],
        "levels": [{"level": e.level, "role": e.role, "before": asdict(e.before), "after": asdict(e.after)}
                   for e in fit.levels],
    }


def print_fit(fit, output: Path) -> None:
    where = " and ".join(f"{k} in {v}" for k, v in fit.fit_where.items()) or "all rows"
    table = Table(title=f"fitted on {fit.fit_after.requests} requests ({where}"
                        + (f", {fit.holdout_after.requests} held out" if fit.holdout_after.requests else "")
                        + f"), {fit.evaluations} replays in {fit.replay_seconds:.1f} s")
    for col in ("parameter", "start", "fitted", "bounds", ""):
        table.add_column(col, justify="left" if col in ("parameter", "") else "right")
    for p in fit.fitted:
        note = f"[bold red]at its {p.at_bound} bound: not pinned by these data[/]" if p.at_bound else ""
        table.add_row(p.name, f"{p.start:.4g}", f"{p.value:.4g}", f"[{p.lower:g}, {p.upper:g}]", note)
    console.print(table)
    errors = Table(title="error per level, start -> fitted (mean error: signed, of the mean)")
    cols = ("level", "rows", "requests", "TTFT MAPE", "E2E MAPE", "TPOT MAPE", "mean TTFT", "mean E2E")
    server = any(e.before.prefill_mape is not None for e in fit.levels)
    if server:
        cols += ("prefill MAPE", "decode MAPE")
    for col in cols:
        errors.add_column(col, justify="left" if col in ("level", "rows") else "right")
    for e in fit.levels:
        b, a = e.before, e.after
        row = [e.level, e.role, str(b.requests), _change(b.ttft_mape, a.ttft_mape), _change(b.e2e_mape, a.e2e_mape),
               _change(b.tpot_mape, a.tpot_mape), _change(b.ttft_mean_error, a.ttft_mean_error, True),
               _change(b.e2e_mean_error, a.e2e_mean_error, True)]
        if server:
            row += [_change(b.prefill_mape, a.prefill_mape), _change(b.decode_mape, a.decode_mape)]
        errors.add_row(*row)
    console.print(errors)
    if fit.stuck:
        console.print("[bold]stuck at a bound:[/] " + ", ".join(f"{p.name} ({p.at_bound})" for p in fit.stuck)
                      + ": the fit could not place it inside its range; the measurements do not constrain it, "
                        "or the step-time model lacks what they show", highlight=False)
    console.print(f"wrote [bold]{output}[/]: use it with --set timing.profile={output}", highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("calibrate-requests")
    def calibrate_requests(
        outdir: Path = typer.Argument(..., help="A replay of the measured log (from `replay run`)."),
        output: Path = typer.Option(..., "-o", "--output", help="Profile YAML to write (timing.profile)."),
        measured: Path | None = typer.Option(None, "--measured", "-m",
                                             help="Log with the measurements (default: the run's own trace)."),
        fit_where: list[str] = typer.Option([], "--fit-where",
                                            help="COLUMN=VALUE: fit on these rows only, e.g. source_run=constant@2.00 "
                                                 "(repeatable: values of one column OR, columns AND); every other "
                                                 "row reports its error."),
        by: str | None = typer.Option(None, "--by", help="Level column to report errors by "
                                                         "(default: source_run when the log has it)."),
        holdout: float | None = typer.Option(None, "--holdout",
                                             help="Fraction of the fit rows kept out of the fit "
                                                  "(default 0.3, or 0 with --fit-where)."),
        fit_mixed: bool | None = typer.Option(None, "--fit-mixed/--no-fit-mixed",
                                              help="Fit the mixed-step term mixed_layer_us (default: when the log "
                                                   "has server-side prefill times)."),
        pin: list[str] = typer.Option([], "--pin", help="Keep this parameter at the run's value (repeatable), e.g. "
                                                        "host_overhead_ms set from step telemetry."),
        seed: int = typer.Option(0, "--seed", help="Seed of the fit / held-out split."),
        max_evaluations: int = typer.Option(80, "--max-evaluations", help="Replays the search may run."),
        as_json: bool = typer.Option(False, "--json", help="Print the fit as one JSON object."),
    ) -> None:
        """Fit eta_compute, eta_memory, the host overhead (and the mixed-step term) to per-request latencies
        by replaying the log; print each parameter with its bounds and the error per load level before and
        after, and write a timing profile."""
        with user_errors():
            from replay.base.atomic import check_output_file
            from replay.calibrate_requests import calibrate_from_requests, save_request_profile
            from replay.reports.report_files import run_files
            from replay.reports.views import read_run_json

            info = read_run_json(outdir)
            check_output_file(output, run_files(outdir) + [(info.get("trace") or {}).get("path"), measured])
            fit = calibrate_from_requests(outdir, measured=measured, holdout=holdout, seed=seed,
                                          max_evaluations=max_evaluations, fit_where=fit_where, by=by,
                                          fit_mixed=fit_mixed, pin=pin)
            config = info.get("config") or {}
            save_request_profile(fit, config, str(measured or outdir), output)
        if as_json:
            typer.echo(json.dumps(fit_json(fit, output), sort_keys=True))
            return
        print_fit(fit, output)

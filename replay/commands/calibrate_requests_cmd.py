"""``replay calibrate-requests OUTDIR -o profile.yaml``: fit the step-time model to measured TTFT/TPOT."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from replay.commands._common import console, user_errors


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def register(app: typer.Typer) -> None:
    @app.command("calibrate-requests")
    def calibrate_requests(
        outdir: Path = typer.Argument(..., help="A replay of the measured log (from `replay run`)."),
        output: Path = typer.Option(..., "-o", "--output", help="Profile YAML to write (timing.profile)."),
        measured: Path | None = typer.Option(None, "--measured", "-m",
                                             help="Log with the measurements (default: the run's own trace)."),
        holdout: float = typer.Option(0.3, "--holdout", help="Fraction of requests kept out of the fit."),
        seed: int = typer.Option(0, "--seed", help="Seed of the fit / held-out split."),
        max_evaluations: int = typer.Option(80, "--max-evaluations", help="Replays the search may run."),
    ) -> None:
        """Fit eta_compute, eta_memory and the host overhead to per-request TTFT/TPOT by replaying the log;
        print the error before and after on held-out requests and write a timing profile."""
        with user_errors():
            from replay.base.atomic import check_output_file
            from replay.calibrate_requests import FITTED, calibrate_from_requests, save_request_profile
            from replay.reports.report_files import run_files
            from replay.reports.views import read_run_json

            info = read_run_json(outdir)
            check_output_file(output, run_files(outdir) + [(info.get("trace") or {}).get("path"), measured])
            fit = calibrate_from_requests(outdir, measured=measured, holdout=holdout, seed=seed,
                                          max_evaluations=max_evaluations)
            config = info.get("config") or {}
            save_request_profile(fit, config, str(measured or outdir), output)
        table = Table(title=f"calibrated from {fit.fit_after.requests} fit requests "
                            f"({fit.holdout_after.requests} held out), {fit.evaluations} replays "
                            f"in {fit.replay_seconds:.1f} s")
        for col in ("parameter", "start", "fitted"):
            table.add_column(col, justify="left" if col == "parameter" else "right")
        for key in FITTED:
            table.add_row(key, f"{getattr(fit.start, key):.4g}", f"{getattr(fit.params, key):.4g}")
        console.print(table)
        errors = Table(title="MAPE before -> after")
        for col in ("requests", "TTFT", "TPOT"):
            errors.add_column(col, justify="left" if col == "requests" else "right")
        for label, before, after in (("fit", fit.fit_before, fit.fit_after),
                                     ("held out", fit.holdout_before, fit.holdout_after)):
            errors.add_row(label, f"{_pct(before.ttft_mape)} -> {_pct(after.ttft_mape)}",
                           f"{_pct(before.tpot_mape)} -> {_pct(after.tpot_mape)}")
        console.print(errors)
        console.print(f"wrote [bold]{output}[/]: use it with --set timing.profile={output}", highlight=False)

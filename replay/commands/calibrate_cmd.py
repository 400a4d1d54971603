"""``replay calibrate``: fit the roofline's efficiencies and overheads to measured step times."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from replay.base.errors import ConfigError
from replay.commands._common import console, user_errors


def calibrate(
    steps_csv: Path = typer.Argument(..., help="Measured steps: prefill_tokens, prefill_cached, decode_ctx, "
                                     "draft_tokens, measured_ms (see docs/timing.md)."),
    model: str = typer.Option(..., "--model", "-m", help="Catalog name, alias or config.json path."),
    hardware: str = typer.Option("h200_sxm", "--hardware", help="Hardware profile the steps ran on."),
    output: Path = typer.Option(..., "--output", "-o", help="Profile YAML to write."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size of the measured server."),
    dtype: str = typer.Option("bf16", "--dtype", help="Weight dtype: bf16 or fp8."),
    kv_dtype: str = typer.Option("auto", "--kv-dtype", help="KV cache dtype: auto (= weight dtype), bf16, fp8."),
    drafter: str | None = typer.Option(None, "--drafter", help="model or synthetic, when rows have draft_tokens."),
    host_overhead_ms: float | None = typer.Option(None, "--host-overhead-ms",
                                                  help="Pin the host overhead instead of fitting it "
                                                       "(0 for kernel-only timings)."),
    fit_mixed: bool = typer.Option(False, "--fit-mixed",
                                   help="Also fit mixed_layer_us, the extra cost of steps with a prefill chunk "
                                        "(needs decode-only and prefill rows; docs/timing.md)."),
    as_json: bool = typer.Option(False, "--json", help="Print the fit as one JSON object."),
) -> None:
    """Fit eta_compute, eta_attention, eta_memory and the host overhead (or tau_layer, when
    --host-overhead-ms pins the host term) to measured steps; write a profile and print the fit error."""
    with user_errors():
        from replay.engine.hardware import get_hardware
        from replay.engine.models import get_model
        from replay.engine.timing.calibrate import fit, read_steps_csv
        from replay.engine.timing.profile import FitStats, ProfileParams, TimingProfile, save_profile

        if dtype not in ("bf16", "fp8") or kv_dtype not in ("auto", "bf16", "fp8"):
            raise ConfigError("--dtype must be bf16 or fp8; --kv-dtype auto, bf16 or fp8")
        if drafter not in (None, "model", "synthetic"):
            raise ConfigError("--drafter must be model or synthetic")
        if tp <= 0:
            raise ConfigError("--tp must be > 0")
        spec = get_model(model)
        hw = get_hardware(hardware)
        samples = read_steps_csv(steps_csv)
        if drafter is None and any(s.shape.num_spec_passes for s in samples):
            raise ConfigError(f"{steps_csv}: rows have draft_tokens; say which drafter ran with --drafter")
        if drafter == "model" and spec.num_mtp_layers == 0:
            raise ConfigError(f"{spec.name} has no MTP head; use --drafter synthetic")
        result = fit(spec, hw, samples, tp=tp, dtype=dtype, kv_dtype=dtype if kv_dtype == "auto" else kv_dtype,
                     drafter=drafter, fix_host_overhead_ms=host_overhead_ms, fit_mixed=fit_mixed)
        params = {k: float(v) for k, v in result.params.as_dict().items()}
        if not fit_mixed and not params["mixed_layer_us"]:
            del params["mixed_layer_us"]  # outputs without the term stay as they were
        profile = TimingProfile(
            hardware=hw.name, model=spec.name, tensor_parallel_size=tp, dtype=dtype,
            params=ProfileParams(**params),
            fit=FitStats(steps_csv=str(steps_csv), num_steps=result.n, mape=result.mape, max_ape=result.max_ape,
                         mape_before=result.start_mape, host_overhead_fixed=host_overhead_ms is not None),
        )
        save_profile(profile, output, inputs=[steps_csv])
        if as_json:
            typer.echo(json.dumps({"output": str(output), "params": params, "num_steps": result.n,
                                   "mape": result.mape, "max_ape": result.max_ape,
                                   "mape_before": result.start_mape}, sort_keys=True))
            return
        table = Table(title=f"calibrated {spec.name} on {hw.name} from {result.n} steps")
        table.add_column("parameter")
        table.add_column("default", justify="right")
        table.add_column("fitted", justify="right")
        for key, value in params.items():
            figure = getattr(hw.timing, key)
            if figure is None and not value:
                continue  # the mixed-step term, neither in the profile nor fitted
            default = figure.value if figure is not None else 0.0
            table.add_row(key, f"{default:.4g}", f"{value:.4g}")
        console.print(table)
        console.print(f"fit error: MAPE {result.mape:.1%} (max {result.max_ape:.1%}); "
                      f"defaults gave MAPE {result.start_mape:.1%}. Wrote {output}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)

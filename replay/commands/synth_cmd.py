"""``replay synth``: synthetic traces with shared prefixes and multi-turn sessions, from a seed."""

from __future__ import annotations

from pathlib import Path

import typer

from replay.base.errors import ConfigError
from replay.commands._common import console, user_errors

_FORMATS = {".jsonl": "mooncake", ".parquet": "parquet", ".csv": "azure"}


class _Counted:
    """Passes tables through, counting their rows (for the closing line)."""

    def __init__(self, tables) -> None:
        self._tables, self.rows = tables, 0

    def __iter__(self):
        for table in self._tables:
            self.rows += table.num_rows
            yield table


def register(app: typer.Typer) -> None:
    @app.command("synth")
    def synth(
        output: Path = typer.Option(..., "--output", "-o", help="x.jsonl (Mooncake-style), x.parquet (canonical) "
                                                                "or x.csv (Azure-2023-style)."),
        requests: int = typer.Option(2000, "--requests", "-n", help="Number of requests."),
        seed: int = typer.Option(0, "--seed", help="Random seed: same seed, same bytes."),
        arrival: str = typer.Option("poisson", "--arrival", help="poisson, gamma or closed (closed-loop users)."),
        rate: float = typer.Option(3.0, "--rate", help="Mean requests/s (poisson, gamma)."),
        cv: float = typer.Option(2.0, "--cv", help="Inter-arrival CV of session starts (gamma)."),
        concurrency: int = typer.Option(16, "--concurrency", help="Users (closed)."),
        block_size: int = typer.Option(512, "--block-size", help="Tokens per hash id."),
        length_dist: str = typer.Option("lognormal", "--length-dist", help="fixed, lognormal or exponential."),
        length_sigma: float = typer.Option(0.8, "--length-sigma", help="Lognormal sigma."),
        system_prompts: int = typer.Option(40, "--system-prompts", help="Shared system prompts."),
        system_tokens: int = typer.Option(1500, "--system-tokens", help="Mean system prompt length."),
        zipf: float = typer.Option(1.1, "--zipf", help="Zipf exponent of system prompt popularity."),
        user_tokens: int = typer.Option(600, "--user-tokens", help="Mean new user tokens per turn."),
        output_tokens: int = typer.Option(220, "--output-tokens", help="Mean output tokens."),
        max_input: int = typer.Option(32768, "--max-input", help="Cap on prompt length (a session ends there)."),
        turns_mean: float = typer.Option(3.0, "--turns-mean", help="Mean turns per session (1 = single-turn)."),
        think_s: float = typer.Option(20.0, "--think-s", help="Mean think time between turns, seconds."),
        peak_to_trough: float = typer.Option(1.0, "--peak-to-trough",
                                             help="A day's shape: peak rate / trough rate (1 = flat)."),
        peak_hour: float = typer.Option(14.0, "--peak-hour", help="Hour of the day's peak rate (0-24)."),
        start_hour: float = typer.Option(0.0, "--start-hour", help="Hour of the day the trace starts at."),
        bursts: int = typer.Option(0, "--bursts", help="Seeded bursts per day."),
        burst_factor: float = typer.Option(3.0, "--burst-factor", help="Rate multiplier inside a burst."),
        burst_minutes: float = typer.Option(10.0, "--burst-minutes", help="Length of a burst, minutes."),
    ) -> None:
        """Write a synthetic trace (see ingest/synth.py for the model and its assumptions)."""
        from pydantic import ValidationError  # here, not at the top: `replay --help` needs no pydantic

        from replay.ingest import synth as sy

        with user_errors():
            kind = _FORMATS.get(output.suffix.lower())
            if kind is None:
                raise ConfigError(f"--output must end in {', '.join(_FORMATS)}: {output}")
            try:
                cfg = sy.SynthConfig(
                    requests=requests, seed=seed, arrival=arrival, rate=rate, cv=cv, concurrency=concurrency,
                    block_size=block_size, length_dist=length_dist, length_sigma=length_sigma,
                    system_prompts=system_prompts, system_tokens=system_tokens, zipf=zipf, user_tokens=user_tokens,
                    output_tokens=output_tokens, max_input=max_input, turns_mean=turns_mean, think_s=think_s,
                    peak_to_trough=peak_to_trough, peak_hour=peak_hour, start_hour=start_hour, bursts=bursts,
                    burst_factor=burst_factor, burst_minutes=burst_minutes)
            except ValidationError as exc:  # one line naming each bad option, as the flag is spelled
                raise ConfigError("; ".join(f"--{'.'.join(str(p) for p in e['loc']).replace('_', '-')} "
                                            f"{e.get('input')!r}: {e['msg']}" for e in exc.errors())) from None
            if kind == "azure":
                n = sy.write_azure_csv(cfg, output)
            else:  # one batch of rows at a time (10 M requests in Python lists took 11.6 GB)
                counted = _Counted(sy.arrival_batches(cfg))
                if kind == "parquet":
                    sy.write_parquet(counted, cfg, output)
                else:
                    sy.write_mooncake_jsonl(counted, output)
                n = counted.rows
        console.print(f"wrote {n:,} requests to {output}")

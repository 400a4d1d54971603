"""The ``replay`` command line. Each command lives in its own module under ``replay.commands``."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="replay",
    help="Replay LLM request traces through a faithful vLLM V1 model on a modeled H200.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Order is the order in --help.
_COMMAND_MODULES = (
    "ingest_cmd",
    "inspect_cmd",
    "synth_cmd",
    "run_cmd",
    "report_cmd",
    "sql_cmd",
    "diff_cmd",
    "sweep_cmd",
    "plan_cmd",
    "steptime_cmd",
    "calibrate_cmd",
)

for _name in _COMMAND_MODULES:
    importlib.import_module(f"replay.commands.{_name}").register(app)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover - `python -m replay.cli`
    main()

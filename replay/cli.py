"""The ``replay`` command line. Each command lives in its own module under ``replay.commands``."""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import sys
import threading

import typer

# numpy's OpenBLAS starts worker threads at import that spin-wait for work: 0.19 s of CPU per command
# against 0.08 s with one thread (`python -c "import numpy"`), for nothing, since no command does
# multithreaded linear algebra. Set before any command imports numpy; a value the user set wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

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
    "validate_cmd",
    "export_cmd",
    "calibrate_requests_cmd",
)

_SIGNAL_EXIT = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}


def _stop(signum: int, _frame) -> None:
    """Say so in one line, then unwind: SystemExit runs every ``finally``/``except BaseException``, so
    the atomic writers remove their temp files, and Click does not turn it into "Aborted!"."""
    code, word = _SIGNAL_EXIT[signum]
    sys.stderr.write(f"replay: {word}; unfinished outputs are discarded, finished ones are unchanged\n")
    raise SystemExit(code)


@app.callback()
def _install_signal_handlers(ctx: typer.Context) -> None:
    """SIGINT (exit 130) and SIGTERM (exit 143) stop a command cleanly; handlers restored after it."""
    previous = {sig: signal.signal(sig, _stop) for sig in _SIGNAL_EXIT}
    ctx.call_on_close(lambda: [signal.signal(sig, old) for sig, old in previous.items()])


for _name in _COMMAND_MODULES:
    importlib.import_module(f"replay.commands.{_name}").register(app)


def main() -> None:  # pragma: no cover - console entry
    """The ``replay`` console entry: run the command, then leave without tearing the interpreter down.

    Every output is written, closed and renamed into place before a command returns (atomic
    writers), and the atexit handlers still run. What is skipped is the interpreter's finalization:
    module teardown and its full garbage collections over every object the imported libraries
    (pyarrow, pydantic, typer, rich...) made, 0.4-0.6 s of every command on this machine (perf: 122
    of 3,992 samples of a 20k-request replay were in Py_FinalizeEx). With another thread still
    running (none of ours outlives its command) the exit is the normal one.
    """
    code: int | str | None = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code
    if threading.active_count() > 1:
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe: nothing more can be said
        pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover - `python -m replay.cli`
    main()

"""Not yet implemented: registers nothing until its issue lands."""

import typer


def register(app: typer.Typer) -> None:
    return None

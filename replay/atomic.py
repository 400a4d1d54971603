"""Atomic output: every file we write appears whole or not at all.

A failed run must leave no half file behind, so writers produce a temp file beside the
target and rename it into place only after it is complete (``os.replace`` is atomic on
POSIX within one filesystem).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``final``; rename it onto ``final`` only if the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual permissions
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Deterministic JSON (sorted keys) so identical runs give identical bytes."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike[str], overwrite: bool = True) -> Iterator[Path]:
    """Yield a temp directory beside ``final``; it replaces ``final`` only when the block succeeds.

    An existing ``final`` is kept untouched until the new one is complete, so a failed run
    never destroys the previous good output.
    """
    final = Path(final)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} already exists (pass --overwrite to replace it)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
            os.replace(final, old / "x")
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

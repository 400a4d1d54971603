"""Input files: refuse what cannot be read as a file before opening it (a FIFO would hang a read)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from replay.base.errors import ReplayError


def require_regular_file(path: str | os.PathLike[str], what: str = "file") -> Path:
    """``path`` if it is a regular file (symlinks followed); else a one-line ``ReplayError``."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ReplayError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise ReplayError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise ReplayError(f"{path}: is a directory; give a {what}")
    if not stat.S_ISREG(mode):
        raise ReplayError(f"{path}: not a regular file (a FIFO, socket or device); give a {what}")
    return path

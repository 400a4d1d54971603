"""One module per source format; ``READERS`` maps ``--format`` names to reader classes, as the
registry in ``replay.ingest.formats`` lists them."""

from __future__ import annotations

import importlib

from ..formats import READER_CLASSES
from .base import Reader


def _reader_class(module: str, cls: str) -> type[Reader]:
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


READERS: dict[str, type[Reader]] = {name: _reader_class(*where) for name, where in READER_CLASSES.items()}

__all__ = ["READERS", "Reader"]

"""One module per source format; ``READERS`` maps ``--format`` names to reader classes."""

from __future__ import annotations

from .azure import AzureReader
from .bailian import BailianReader
from .base import Reader
from .burstgpt import BurstGPTReader
from .generic import GenericCsvReader, GenericJsonlReader
from .mooncake import MooncakeReader
from .requests import RequestsReader

READERS: dict[str, type[Reader]] = {
    r.name: r
    for r in (MooncakeReader, BailianReader, AzureReader, BurstGPTReader, RequestsReader,
              GenericCsvReader, GenericJsonlReader)
}

__all__ = ["READERS", "Reader"]

"""One module per source format; ``READERS`` maps ``--format`` names to reader classes."""

from __future__ import annotations

from .aiperf import AiperfReader
from .azure import AzureReader
from .bailian import BailianReader
from .base import Reader
from .bench_results import SglangBenchReader, VllmBenchReader
from .burstgpt import BurstGPTReader
from .conversations import ConversationReader, LmsysReader
from .gateways import HeliconeReader, LangfuseReader, LiteLLMReader
from .genai_perf import GenaiPerfReader
from .generic import GenericCsvReader, GenericJsonlReader
from .guidellm import GuideLLMReader
from .inference_perf import InferencePerfReader
from .mooncake import MooncakeReader
from .mooncake_text import MooncakeTextReader
from .openai_batch import OpenAIBatchInputReader, OpenAIBatchOutputReader
from .otel import OtelReader
from .requests import RequestsReader

READERS: dict[str, type[Reader]] = {
    r.name: r
    for r in (MooncakeReader, BailianReader, AzureReader, BurstGPTReader, RequestsReader,
              GenericCsvReader, GenericJsonlReader,
              # tool logs carrying measured latencies and labels (ingest/readers/records.py)
              VllmBenchReader, SglangBenchReader, AiperfReader, OpenAIBatchInputReader, OpenAIBatchOutputReader,
              LiteLLMReader, LangfuseReader, HeliconeReader, OtelReader, ConversationReader, LmsysReader,
              MooncakeTextReader, GenaiPerfReader, GuideLLMReader,
              InferencePerfReader)
}

__all__ = ["READERS", "Reader"]

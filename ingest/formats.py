"""The names ``--format`` accepts and the reader class behind each: the one registry of readers.

It names modules rather than importing them, so a command's help can list every format without
loading pyarrow and the readers (``replay --help`` stays quick); ``readers.READERS`` imports the
classes from it, and the readers' own ``name`` must match (tests/ingest checks it).
"""

from __future__ import annotations

# format name -> (module in ingest/readers/, class); traces first, then the tool logs
READER_CLASSES: dict[str, tuple[str, str]] = {
    "mooncake": ("mooncake", "MooncakeReader"),
    "bailian": ("bailian", "BailianReader"),
    "azure": ("azure", "AzureReader"),
    "burstgpt": ("burstgpt", "BurstGPTReader"),
    "requests": ("requests", "RequestsReader"),
    "csv": ("generic", "GenericCsvReader"),
    "jsonl": ("generic", "GenericJsonlReader"),
    # tool logs carrying measured latencies and labels (ingest/readers/records.py)
    "vllm-bench": ("bench_results", "VllmBenchReader"),
    "sglang-bench": ("bench_results", "SglangBenchReader"),
    "aiperf": ("aiperf", "AiperfReader"),
    "openai-batch-input": ("openai_batch", "OpenAIBatchInputReader"),
    "openai-batch-output": ("openai_batch", "OpenAIBatchOutputReader"),
    "litellm": ("gateways", "LiteLLMReader"),
    "langfuse": ("gateways", "LangfuseReader"),
    "helicone": ("gateways", "HeliconeReader"),
    "otel": ("otel", "OtelReader"),
    "sharegpt": ("conversations", "ConversationReader"),
    "lmsys": ("conversations", "LmsysReader"),
    "mooncake-text": ("mooncake_text", "MooncakeTextReader"),
    "genai-perf": ("genai_perf", "GenaiPerfReader"),
    "guidellm": ("guidellm", "GuideLLMReader"),
    "inference-perf": ("inference_perf", "InferencePerfReader"),
}

FORMAT_NAMES: tuple[str, ...] = tuple(READER_CLASSES)


def format_help() -> str:
    """The ``--format`` help text: every accepted name, in the registry's order."""
    return f"{', '.join(FORMAT_NAMES)} (default: auto-detect from the file name and its first record)."

"""Shared test set-up: the repo root on sys.path (for tests.engine_helpers) and the shared traces."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHARED_TRACES = ROOT.parent / "shared" / "traces"
MOONCAKE_TRACE = SHARED_TRACES / "mooncake" / "conversation_trace.jsonl"
AZURE_CODE_TRACE = SHARED_TRACES / "azure2023" / "AzureLLMInferenceTrace_code.csv"


@pytest.fixture
def mooncake_trace() -> Path:
    if not MOONCAKE_TRACE.exists():
        pytest.skip(f"shared Mooncake trace not found at {MOONCAKE_TRACE} (the repo must sit beside shared/)")
    return MOONCAKE_TRACE


@pytest.fixture
def azure_code_trace() -> Path:
    if not AZURE_CODE_TRACE.exists():
        pytest.skip(f"shared Azure code trace not found at {AZURE_CODE_TRACE} (the repo must sit beside shared/)")
    return AZURE_CODE_TRACE

"""Shared test set-up: the repo root on sys.path (for tests.engine_helpers) and the shared traces."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The suite runs the engine from its Python source (some tests swap pool classes and methods, which
# compiled classes do not allow); tests/engine/test_native_core.py runs the compiled core against it.
# Set before anything imports the engine; REPLAY_PURE_PYTHON="" in the environment selects the
# compiled core instead.
os.environ.setdefault("REPLAY_PURE_PYTHON", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHARED_TRACES = ROOT.parent / "shared" / "traces"
MOONCAKE_TRACE = SHARED_TRACES / "mooncake" / "conversation_trace.jsonl"
AZURE_CODE_TRACE = SHARED_TRACES / "azure2023" / "AzureLLMInferenceTrace_code.csv"


def require_shared(path: Path) -> Path:
    """A shared real trace: skipped with a reason locally when absent, a FAILURE in CI (CI=true), where
    ../shared is always present, so a missing or moved trace can never silently skip the real-traffic tests."""
    if not path.exists():
        why = f"shared trace not found at {path} (the repo must sit beside shared/)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(why + "; CI always has it", pytrace=False)
        pytest.skip(why)
    return path


@pytest.fixture
def mooncake_trace() -> Path:
    return require_shared(MOONCAKE_TRACE)


@pytest.fixture
def azure_code_trace() -> Path:
    return require_shared(AZURE_CODE_TRACE)

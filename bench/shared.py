"""Where the shared real traces are: $REPLAY_SHARED, else a `shared` folder beside the checkout.

A leaf (standard library only), so every benchmark, the vLLM venv's parity driver included, finds
the traces the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The shared traces folder: $REPLAY_SHARED, else a `shared` folder beside the repository checkout."""
    return Path(os.environ.get("REPLAY_SHARED", REPO_ROOT.parent / "shared"))

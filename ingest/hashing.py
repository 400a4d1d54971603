"""Prefix identity from token ids: chained block hashes, and the tokenizers that produce the ids.

``chain_hash_blocks`` cuts a token list into blocks of ``block_size`` and gives each block a 64-bit
id that hashes the previous block's id with the block's tokens, like vLLM's prefix-cache block
hashes: two prompts share their first k ids exactly when they share their first k blocks of
tokens. The last, partial block gets its own id too (the Mooncake convention, so that
``len(hash_ids) == ceil(input_tokens / block_size)``); it matches only an identical prompt tail.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from replay.base.errors import ConfigError

# blake2b with an 8-byte digest: stable across Python versions and platforms (unlike hash()),
# and ~1 us per block, far below JSON parsing cost.
_SEED = b"replay-chain-v1"

# Byte-level fallback: 4 UTF-8 bytes per token. A guess matching the ~4 characters per token of BPE
# tokenizers on English text (OpenAI's rule of thumb); token counts are approximate, prefix
# equality stays exact at 4-byte granularity. The trace metadata says when it was used.
FALLBACK_BYTES_PER_TOKEN = 4
FALLBACK_NAME = f"byte-fallback-{FALLBACK_BYTES_PER_TOKEN}"


def chain_hash_blocks(tokens: Sequence[int] | np.ndarray, block_size: int) -> list[int]:
    """uint64 ids, one per block of ``block_size`` tokens (last block possibly partial)."""
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise ValueError("token ids must fit uint32")
    data = arr.astype("<u4")
    out: list[int] = []
    parent = _SEED
    for start in range(0, data.size, block_size):
        digest = hashlib.blake2b(data[start:start + block_size].tobytes(), digest_size=8, key=parent[:64]).digest()
        out.append(int.from_bytes(digest, "little"))
        parent = digest
    return out


def byte_fallback_tokens(text: str) -> np.ndarray:
    """Deterministic pseudo-tokens: each group of 4 UTF-8 bytes is one token id."""
    raw = text.encode("utf-8")
    pad = (-len(raw)) % FALLBACK_BYTES_PER_TOKEN
    buf = np.frombuffer(raw + b"\0" * pad, dtype="<u4")
    return buf.astype(np.int64)


class Tokenizer:
    """Text -> token ids: an HF ``tokenizer.json`` (``tokenizers`` extra) or the byte fallback."""

    def __init__(self, path: str | None) -> None:
        self._hf = None
        if path is None:
            self.name = FALLBACK_NAME
            return
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"tokenizer file not found: {p}")
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise ConfigError("--tokenizer needs the 'tokenizers' package: pip install 'replay-analyzer[tokenizers]'"
                              ) from None
        try:
            self._hf = HFTokenizer.from_file(str(p))
        except Exception as exc:  # the library raises a bare Exception on bad files
            raise ConfigError(f"cannot load tokenizer {p}: {exc}") from None
        self.name = f"hf:{p.name}"

    def encode(self, text: str) -> np.ndarray:
        if self._hf is None:
            return byte_fallback_tokens(text)
        return np.asarray(self._hf.encode(text, add_special_tokens=False).ids, dtype=np.int64)


def render_messages(messages: list) -> str:
    """Chat messages as one text with role tags (a fixed template: counts are approximate by its tags)."""
    parts = []
    for msg in messages:
        if not isinstance(msg, dict):
            raise ValueError("each message must be an object with 'role' and 'content'")
        content = msg.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ValueError("message content must be text or a list of text parts")
        parts.append(f"<|{msg.get('role', 'user')}|>\n{content}\n")
    return "".join(parts)

"""Bytes that are not what a reader expects: invalid UTF-8, a truncated or corrupt compressed file.

Readers raise whatever their library raises (``UnicodeDecodeError``, ``EOFError``, ``zlib.error``,
pyarrow's ``ArrowInvalid``/``OSError``); ``read_errors`` turns those into one ``TraceError`` naming
the file and, for bad UTF-8, the line and column.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from replay.base.errors import TraceError

_COMPRESSED_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def open_binary(path: Path):
    """Open a possibly gzip-compressed file for binary reading."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


# Leading bytes of compressed files ingest does not decompress (only gzip, by its .gz name).
_OTHER_COMPRESSION = ((b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
                      (b"\x04\x22\x4d\x18", "lz4"), (b"PK\x03\x04", "zip"), (b"7z\xbc\xaf\x27\x1c", "7z"))


def refuse_unreadable_compression(path: Path) -> None:
    """A compressed file ingest cannot read is named as such (it would read as invalid UTF-8)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError:
        return  # the reader names an unreadable file itself
    if head.startswith(b"\x1f\x8b") and path.suffix != ".gz":  # as open_binary and pyarrow decide
        raise TraceError("a gzip-compressed file without the .gz suffix: rename it to end in .gz, or gunzip it",
                         path=str(path))
    for magic, kind in _OTHER_COMPRESSION:
        if head.startswith(magic):
            raise TraceError(f"a {kind}-compressed file: ingest reads plain text or gzip (.gz); decompress it first",
                             path=str(path))


def first_bad_utf8(path: Path) -> tuple[int, int, int] | None:
    """(line, 1-based column, byte value) of the first byte that is not UTF-8, or None."""
    with open_binary(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return lineno, exc.start + 1, raw[exc.start]
    return None


def bad_utf8_error(path: Path) -> TraceError:
    try:
        where = first_bad_utf8(path)
    except _COMPRESSED_ERRORS + (OSError,):
        where = None
    if where is None:
        return TraceError("invalid UTF-8 text", path=str(path))
    line, col, byte = where
    return TraceError(f"invalid UTF-8 (byte 0x{byte:02x} at column {col}): not a UTF-8 text file",
                      path=str(path), line=line)


def _undecoded(text: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in text)


def field_with_bad_utf8(raw: bytes) -> str | None:
    """The top-level JSON field whose key or value holds the undecodable bytes, if the line parses."""
    try:
        obj = json.loads(raw.decode("utf-8", "surrogateescape"))
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    for key, value in obj.items():
        if _undecoded(key) or _undecoded(json.dumps(value, ensure_ascii=False)):
            return key
    return None


def guarded(items: Iterator, path: Path) -> Iterator:
    """``items`` with read errors raised as ``TraceError``; the consumer's own errors pass untouched."""
    it = iter(items)
    while True:
        with read_errors(path):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item


@contextlib.contextmanager
def read_errors(path: Path) -> Iterator[None]:
    """Turn a library's read error on ``path`` into one ``TraceError`` line."""
    try:
        yield
    except UnicodeDecodeError:
        raise bad_utf8_error(path) from None
    except RecursionError:
        raise TraceError("a JSON value nested too deeply to read", path=str(path)) from None
    except _COMPRESSED_ERRORS as exc:
        raise TraceError(f"truncated or corrupt compressed file ({exc or type(exc).__name__})",
                         path=str(path)) from None
    except (pa.ArrowInvalid, OSError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "utf8" in text.lower().replace("-", ""):
            raise bad_utf8_error(path) from None
        if "compress" in text.lower() or "gzip" in text.lower():
            raise TraceError(f"truncated or corrupt compressed file ({text})", path=str(path)) from None
        raise TraceError(f"cannot read: {text}", path=str(path)) from None

"""Parquet pages carry checksums, and every reader of ours verifies them.

A file we write stores a CRC-32 of each page (``write_page_checksum``). Without one, bytes changed
inside a data page (a bad disk, a partial copy, an editor) decode as valid numbers: an ITL of
4.5e300 ms instead of an error. ``damaged_parquet`` reads a file through with the checksums verified,
so a report refuses a damaged file naming it. Files written before checksums existed have none to
verify and read as before.
"""

from __future__ import annotations

import os

import pyarrow.parquet as pq

# Keyword arguments for ``pq.write_table`` / ``pq.ParquetWriter``: every Parquet file we write uses them.
CHECKSUMS = {"write_page_checksum": True}


def damaged_parquet(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` does not read through with its page checksums verified (one line), else None.

    Streamed one batch at a time, so memory stays bounded whatever the file's size.
    """
    try:
        with pq.ParquetFile(path, page_checksum_verification=True) as pf:
            for _ in pf.iter_batches(batch_size=1 << 16):
                pass
    except Exception as exc:  # pyarrow raises OSError, ArrowInvalid and others for damaged pages
        return " ".join(str(exc).split()) or type(exc).__name__
    return None

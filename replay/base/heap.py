"""Hand the C heap's free pages back to the system between the parts of one replay.

A part of a fleet replayed part by part frees its engine and its recorder's columns by reference
count, but glibc keeps most of those pages for reuse (a freed block below its adaptive mmap
threshold stays in the heap), so the process grew by about its recorder's size with every part
(eight parts of a 400,000-request replay: 359 -> 685 MB). ``malloc_trim`` returns them (the same
replay: 502-506 MB after each part, for 40 ms). A no-op where the C library has no malloc_trim.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _malloc_trim():
    try:  # the C library this process already has loaded (no search, no subprocess)
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


def release_heap() -> None:
    """Return the C heap's free pages to the system (glibc); nothing elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)

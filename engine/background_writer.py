"""Parquet row groups written on a second thread, in order.

Arrow's Parquet writer encodes and compresses without holding the GIL, so handing it finished row
groups lets that work overlap the simulation of the next steps (on a 2-core machine about a tenth
of a replay's time). One thread runs the jobs in the order they were submitted and each file is
written by that thread alone, so the files' bytes are what writing inline gives. The queue is short
(a few row groups) so memory stays bounded; an error in a job is raised in the caller at its next
submit or at finish.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

_MAX_PENDING = 2  # row groups waiting to be written (a chunk row group is ~1 M rows)


class BackgroundWriter:
    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[..., object], tuple] | None] = queue.Queue(_MAX_PENDING)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="replay-parquet-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self._error is None:  # after a failure, drain without writing
                fn, args = job
                try:
                    fn(*args)
                except BaseException as exc:  # noqa: BLE001 - handed to the submitting thread
                    self._error = exc

    def submit(self, fn: Callable[..., object], *args: object) -> None:
        self._raise()
        self._jobs.put((fn, args))

    def finish(self) -> None:
        """Wait for every job; raise the first job error, if any."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

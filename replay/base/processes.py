"""Whether a process still runs: asked by the cleanup of a killed replay's temporary files and by
the processes of a replay in step (engine/lockstep.py), which must not wait for a dead peer."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs. A zombie (exited, not yet reaped by its parent) does not: on
    Linux its state is read from /proc; elsewhere a zombie counts as alive."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc here
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True

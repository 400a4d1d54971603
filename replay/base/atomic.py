"""Atomic output: every file we write appears whole or not at all, and we only replace our own.

A failed run must leave no half file behind, so writers produce a temp file beside the
target and rename it into place only after it is complete (``os.replace`` is atomic on
POSIX within one filesystem).

Output directories carry a marker file (``.replay-output``): ``atomic_dir`` replaces an existing
directory only when it holds that marker (a previous replay output) or is empty, never a directory
of the user's, never a file, never a path that is or contains one of the command's inputs.

A file output replaces only a regular file: never a symbolic link (it would replace the link, not
what it points to), a FIFO, a socket or a device node (``-o /dev/null`` run as root would replace
the system's). A directory output is never a mount point (it cannot be renamed: EBUSY).

Temp names embed our process id (``.<name>.replay-<pid>-XXXX.tmp``), so a later run can recognise
and remove the temp files of a process that was killed (SIGKILL) before it could clean up. A long
output name is shortened inside the temp name, so a valid output name never gives a temp name
over the filesystem's limit (ENAMETOOLONG).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from replay.base.errors import ReplayError
from replay.base.processes import pid_alive

MARKER = ".replay-output"
_MARKER_HEAD = "replay output directory"
_TMP_TAG = "replay-"


class OutputError(ReplayError):
    """An output path we refuse to write: it is not ours to replace, or it is one of the inputs."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Longest file name most filesystems take (NAME_MAX, bytes). A temp name adds the dot, the tag, the
# pid, mkstemp's 8 random characters and the suffix (at most 40 bytes) to the output's own name.
_NAME_MAX = 255
_TMP_EXTRA = 40


def _tmp_stem(final: Path) -> str:
    """The output's name as temp names carry it: whole, or cut (at a character boundary) so that a
    temp name stays within NAME_MAX bytes."""
    name = final.name
    room = _NAME_MAX - _TMP_EXTRA
    encoded = os.fsencode(name)
    if len(encoded) <= room:
        return name
    return encoded[:room].decode("utf-8", "ignore")


def _tmp_prefix(final: Path) -> str:
    return f".{_tmp_stem(final)}.{_TMP_TAG}{os.getpid()}-"


def remove_stale_temps(final: Path) -> list[Path]:
    """Remove temp files/dirs left beside ``final`` by a killed replay process (named by its pid).

    Only names of our own making (``.<name>.replay-<pid>-<random>.tmp``) whose process is gone are
    removed; a live process's temp is left alone.
    """
    pattern = re.compile(re.escape(f".{_tmp_stem(final)}.{_TMP_TAG}") + r"(\d+)-[A-Za-z0-9_]+\.tmp")
    removed = []
    try:
        entries = list(os.scandir(final.parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if not m or pid_alive(int(m.group(1))):
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(path)
    return removed


def _resolve(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(path)).resolve()


def refuse_inputs(final: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str] | None]) -> None:
    """Raise ``OutputError`` when the output ``final`` is, or contains, one of ``inputs``."""
    out = _resolve(final)
    for item in inputs:
        if item is None:
            continue
        src = _resolve(item)
        if src == out:
            raise OutputError(f"{final}: the output is the input {item}; choose another output path")
        if out in src.parents:
            raise OutputError(f"{final}: the output would replace a directory holding the input {item}; "
                              "choose another output path")


def check_output_file(final: str | os.PathLike[str],
                      inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    """Raise ``OutputError`` when a file output cannot be written: it is an input, a directory, or
    anything but a regular file (a symbolic link, FIFO, socket or device node is never replaced)."""
    refuse_inputs(final, inputs)
    try:
        mode = os.lstat(final).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"{final}: cannot check the output path: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise OutputError(f"{final}: is a directory; give a file name")
    if stat.S_ISLNK(mode):
        raise OutputError(f"{final}: is a symbolic link; refusing to replace it (give the file itself, or "
                          "another name)")
    if not stat.S_ISREG(mode):
        raise OutputError(f"{final}: is not a regular file (a FIFO, socket or device node); refusing to "
                          "replace it: give a file name")


def _about_temp(exc: OSError, tmp: Path) -> bool:
    """Whether the system's refusal concerns our temp path (so the user's output is the one to name)."""
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None] or [str(exc)]
    return any(str(tmp) in name for name in names)


def _output_refused(final: Path, exc: OSError) -> OutputError:
    """A write the system refused (disk full, read-only filesystem, no permission...), named by the
    output the user asked for rather than by our temp name; the temp is gone, the old output kept."""
    what = exc.strerror or " ".join(str(exc).split()) or type(exc).__name__
    hint = {errno.ENOSPC: " (the disk is full: free space and rerun; an existing output is unchanged)",
            errno.EDQUOT: " (disk quota exceeded; an existing output is unchanged)",
            errno.EROFS: " (a read-only filesystem: write the output somewhere writable)"}.get(exc.errno or 0, "")
    return OutputError(f"{final}: cannot write the output: {what}{hint}")


@contextlib.contextmanager
def _temp_errors(final: Path, tmp: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if _about_temp(exc, tmp):
            raise _output_refused(final, exc) from None
        raise


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str],
                inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Iterator[Path]:
    """Yield a temp path beside ``final``; rename it onto ``final`` only if the block succeeds."""
    final = Path(final)
    check_output_file(final, inputs)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(final)
        fd, tmp_name = tempfile.mkstemp(prefix=_tmp_prefix(final), suffix=".tmp", dir=final.parent)
    except OSError as exc:
        raise _output_refused(final, exc) from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with _temp_errors(final, tmp):
            yield tmp
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual permissions
            os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str,
                      inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    with atomic_path(path, inputs) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike[str], obj: Any,
                      inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    """Deterministic JSON (sorted keys) so identical runs give identical bytes."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", inputs)


def is_replay_output(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a directory a replay command wrote (it holds our marker file)."""
    marker = Path(path) / MARKER
    try:
        with open(marker, encoding="utf-8") as fh:
            return fh.read(len(_MARKER_HEAD)) == _MARKER_HEAD
    except (OSError, UnicodeDecodeError):
        return False


def check_output_dir(final: str | os.PathLike[str], *, overwrite: bool = True,
                     inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Path:
    """The absolute output directory, or ``OutputError`` saying why we will not write there."""
    shown = final
    refuse_inputs(final, inputs)
    final = Path(os.path.abspath(final))
    cwd = Path.cwd().resolve()
    if final.resolve() == cwd or final.resolve() in cwd.parents:
        raise OutputError(f"{shown}: is the current directory (or holds it); give a new directory name, "
                          "e.g. -o out")
    if final.is_symlink():
        raise OutputError(f"{shown}: is a symbolic link; give the directory itself")
    if not final.exists():
        return final
    if not overwrite:
        raise OutputError(f"{shown}: already exists (remove it, or drop --no-overwrite to replace a previous "
                          "replay output)")
    if not final.is_dir():
        raise OutputError(f"{shown}: exists and is not a directory; refusing to replace it")
    if os.path.ismount(final):
        raise OutputError(f"{shown}: is a mount point, which cannot be replaced; give a directory inside it")
    if not is_replay_output(final) and any(final.iterdir()):
        raise OutputError(f"{shown}: exists and is not a replay output (no {MARKER} marker); refusing to "
                          "replace it: choose another path or empty it yourself")
    return final


# Linux renameat2(2) flag: swap two paths in one step, both keep existing throughout.
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap ``a`` and ``b`` (Linux renameat2 RENAME_EXCHANGE); False when unsupported.

    Unsupported means: not Linux/glibc < 2.28 (no ``renameat2`` symbol), or a filesystem that refuses
    the flag (EINVAL/ENOSYS/EOPNOTSUPP, e.g. some network filesystems).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _swap_into_place(tmp: Path, final: Path) -> None:
    """Put ``tmp`` at ``final``. An existing ``final`` is swapped out atomically where the OS allows.

    Linux (glibc >= 2.28, local filesystems): ``renameat2(RENAME_EXCHANGE)`` swaps the two in one
    step, so ``final`` always exists, old or new. Fallback elsewhere: two renames, old aside then
    new in; between them ``final`` is briefly absent, and a crash right there leaves the old output
    whole in ``.<name>.replay-old-<pid>-*/old`` (a name the stale-temp sweep never matches, so the
    only copy is never deleted by us; the user can move it back).
    """
    if not final.exists():
        os.replace(tmp, final)
        return
    if _exchange(tmp, final):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old output
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{_tmp_stem(final)}.{_TMP_TAG}old-{os.getpid()}-", dir=final.parent))
    os.replace(final, aside / "old")
    os.replace(tmp, final)
    shutil.rmtree(aside, ignore_errors=True)


def write_marker(directory: Path, kind: str) -> None:
    (directory / MARKER).write_text(f"{_MARKER_HEAD} ({kind}); `replay` may replace this directory\n",
                                    encoding="utf-8")


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike[str], overwrite: bool = True, *,
               inputs: Iterable[str | os.PathLike[str] | None] = (), kind: str = "run") -> Iterator[Path]:
    """Yield a temp directory beside ``final``; it replaces ``final`` only when the block succeeds.

    ``final`` may already exist only as a previous replay output (our marker) or an empty directory;
    it must not be, or contain, one of ``inputs``. An existing ``final`` is kept untouched until the
    new one is complete, then swapped out atomically (see ``_swap_into_place``), so a failed run
    never destroys the previous good output.
    """
    final = check_output_dir(final, overwrite=overwrite, inputs=inputs)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(final)
        tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(final), suffix=".tmp", dir=final.parent))
    except OSError as exc:
        raise _output_refused(final, exc) from None
    try:
        with _temp_errors(final, tmp):
            yield tmp
            write_marker(tmp, kind)
            os.chmod(tmp, 0o777 & ~_umask())
            _swap_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

"""Writing a file: a new temporary file created exclusively beside the target, written, flushed, renamed over it
(the package docstring says why each step)."""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


from .read import _BINARY, _NO_FOLLOW

TEMPORARY_TRIES = 100  # random names tried before giving up (each a 64-bit draw: a clash means names are planted)
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DiskFull(OSError):
    """No space left (or the user's quota spent) while writing `filename`; nothing was left half-written."""

    def __str__(self) -> str:
        return f"no space left on device writing {self.filename}; free some space (or write elsewhere) and run again"


# ---------------------------------------------------------------------------
# Writing.
# ---------------------------------------------------------------------------


def _random_name() -> str:
    """The random part of a temporary file's name (tests replace it to know every name the writer may choose)."""
    return secrets.token_hex(8)


def temporary_name(path: Path) -> Path:
    """A candidate temporary name beside `path`: hidden, `.NAME.<16 hex digits>.tmp`."""
    return path.with_name(f".{path.name}.{_random_name()}.tmp")


def _create_temporary(path: Path) -> tuple[int, Path]:
    """(fd, name) of a new, empty file beside `path`, created by this call and by no one else.

    NOTE: O_EXCL with O_CREAT fails on any name that exists, a symbolic link (even one that
    points nowhere) included, so no name someone planted is ever opened: another is drawn.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NO_FOLLOW | _BINARY
    for _ in range(TEMPORARY_TRIES):
        tmp = temporary_name(path)
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(
        errno.EEXIST,
        f"{TEMPORARY_TRIES} random temporary names beside it were all taken "
        "(planted by someone who can write its folder?)",
        str(path),
    )


@contextmanager
def replacing(path: str | os.PathLike, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Write `path` whole or not at all: yields a new temporary file beside it (open "w+b", so what was
    written can be read back before it gets its name); on leaving the block without an error, it is
    flushed, fsync'd, given `mode` and renamed over `path`. On any error it is removed and `path` is as
    it was. ENOSPC / EDQUOT (from writing, syncing or creating) raise DiskFull naming `path`.

    mode: the permission bits (0o644: readable by all, writable by its owner only; 0o600: private).
    """
    path = Path(path)
    tmp = None
    try:
        fd, tmp = _create_temporary(path)
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a power cut leaves the old file, not zeros
            _chmod(f, tmp, mode)
            written = os.fstat(f.fileno())
            os.replace(tmp, path)
            tmp = None
            _check_landed(path, written)
        _sync_folder(path.parent)
    except OSError as e:
        if e.errno in _FULL and not isinstance(e, DiskFull):
            raise DiskFull(e.errno, "no space left on device", str(path)) from e
        raise
    finally:
        if tmp is not None:  # failed or interrupted: no temporary file left behind
            try:
                os.unlink(tmp)
            except OSError:
                pass


def write_file(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """`data` as the whole of `path` (replacing)."""
    with replacing(path, mode) as f:
        f.write(data)


def write_json(path: str | os.PathLike, value, mode: int = 0o644, indent: int | None = 1) -> None:
    """`value` as JSON, the whole of `path` (replacing); NaN and infinity are refused (they are not JSON)."""
    write_file(path, (json.dumps(value, indent=indent, allow_nan=False) + "\n").encode("utf-8"), mode)


def _chmod(f: BinaryIO, tmp: Path, mode: int) -> None:
    if hasattr(os, "fchmod"):
        os.fchmod(f.fileno(), mode)  # the open file: never a name someone could swap meanwhile
    else:  # Windows: only the read-only bit means anything there
        os.chmod(tmp, mode)


def _check_landed(path: Path, written: os.stat_result) -> None:
    """After the rename: `path` must not be a link or other non-file someone swapped in for the temporary file
    in the instant between writing and renaming (possible in a folder others may write). A link found there is
    removed (that never touches what it points to) and the write reported as failed."""
    try:
        landed = os.lstat(path)
    except OSError:
        return  # renamed away already: a reader finds no file, never a wrong one
    if (landed.st_dev, landed.st_ino) == (written.st_dev, written.st_ino) or stat.S_ISREG(landed.st_mode):
        return  # ours, or another writer's whole file (a second process writing the same file)
    if stat.S_ISLNK(landed.st_mode):
        os.unlink(path)
    raise OSError(
        errno.EBUSY,
        "it was swapped for something else while it was written (someone else writes this folder)",
        str(path),
    )


def _sync_folder(folder: Path) -> None:
    """Best effort: the rename itself on disk (POSIX; Windows cannot open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
